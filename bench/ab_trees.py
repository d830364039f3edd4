#!/usr/bin/env python3
"""Before and after in one session: a benchmark of two source trees of edgeinfer, run alternately.

A change to the run engine is judged against the tree before it, on the same machine, in the same hour:
each round runs ``bench/pipeline.py`` (one interleaved repetition of its three cases, the tutorial loop,
invoke alone and decode alone included: its ratios are measured against baselines of the same run) and
``bench/multistream.py`` (four streams on one engine: fairness, aggregate fps) of the *before* tree and of
the *after* tree, the order alternating from one round to the next. The report gives, per figure, the
median over the rounds for each tree and their ratio (after / before).

    python bench/ab_trees.py --before ../base --after . [--rounds 5] [--cases accelerator,decode,cpu]
                             [--multistream-seconds 3] [--json out.json]

``--before`` is a checkout of the earlier commit (``git worktree add ../base <commit>``); both trees run
with this interpreter, each with its own directory first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TREES = ("before", "after")


def run_json(tree: Path, args: list[str], *, to_file: bool) -> object:
    """Run one of ``tree``'s benches with this interpreter; its JSON (written to a file, or printed)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        command = [sys.executable, *args, *(["--json", str(out)] if to_file else ["--json"])]
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} in {tree} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return json.loads(out.read_text() if to_file else done.stdout)


def pipeline_figures(results: list[dict]) -> dict[str, float]:
    """The figures bench/pipeline.py judges: each case's ratios, and bytes allocated per frame."""
    figures: dict[str, float] = {}
    for result in results:
        fps = {name: m["fps"] for name, m in result["methods"].items()}
        decode = max(fps["decode_cv2"], fps["decode_source"])
        case = result["case"]
        figures[f"{case}: pipeline / tutorial"] = fps["pipeline"] / fps["tutorial"]
        figures[f"{case}: pipeline / invoke"] = fps["pipeline"] / fps["invoke"]
        figures[f"{case}: pipeline / decode"] = fps["pipeline"] / decode
        figures[f"{case}: pipeline / slower(invoke, decode)"] = fps["pipeline"] / min(fps["invoke"], decode)
        figures[f"{case}: pipeline CPU ms/frame"] = result["methods"]["pipeline"]["cpu_ms_per_frame"]
        figures[f"{case}: tutorial CPU ms/frame"] = result["methods"]["tutorial"]["cpu_ms_per_frame"]
        figures[f"{case}: pipeline bytes/frame"] = result["bytes_per_frame"]["pipeline"]
    return figures


def multistream_figures(report: dict) -> dict[str, float]:
    return {"four streams: fairness": report["four streams"]["fairness"],
            "four streams: fps in all": report["four streams"]["fps"],
            "one stream: fps": report["one stream"]["fps"],
            "four / one stream fps": report["four_over_one_fps"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the earlier tree (a git worktree)")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", default="accelerator,decode,cpu")
    parser.add_argument("--multistream-seconds", type=float, default=3.0, help="0: leave the multistream bench out")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in TREES}
    for index in range(args.rounds):
        for name in TREES if index % 2 == 0 else TREES[::-1]:
            tree = trees[name]
            figures = pipeline_figures(run_json(tree, [
                "bench/pipeline.py", "--reps", "1", "--max-rounds", "1", "--wait-quiet", "20", "--cases", args.cases],
                to_file=True))  # type: ignore[arg-type]
            if args.multistream_seconds:
                figures.update(multistream_figures(run_json(tree, [  # type: ignore[arg-type]
                    "bench/multistream.py", "--reps", "1", "--seconds", str(args.multistream_seconds)],
                    to_file=False)))
            rounds[name].append(figures)
            print(f"round {index + 1} {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in figures.items()), flush=True)
    print(f"\n== medians over {args.rounds} rounds (before: {trees['before']}, after: {trees['after']})")
    print(f"   {'figure':<46}{'before':>10}{'after':>10}{'after/before':>14}")
    for key in rounds["before"][0]:
        before = statistics.median(r[key] for r in rounds["before"])
        after = statistics.median(r[key] for r in rounds["after"])
        print(f"   {key:<46}{before:>10.3f}{after:>10.3f}{after / before if before else float('nan'):>14.3f}")
    if args.json:
        args.json.write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()}, "rounds": rounds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
