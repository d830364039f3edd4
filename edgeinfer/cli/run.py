"""``edgeinfer run``: a model over a live or recorded source through the pipeline."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import click

from ..pipeline.options import POLICIES
from ..pipeline.preprocess import RESIZE_MODES
from ..pipeline.tasks import TASK_NAMES
from ..pipeline.zones import TRIGGERS
from .delegate_choice import delegate_choice, say_delegate_choice
from .output import handle_errors, parse_values
from .pipeline_flags import choice_flag, decoder_flag, option_flag
from .run_events import event_printer, print_event_counts, print_sample_counts

#: where ``--event`` keeps its evidence unless ``--evidence-dir`` says
DEFAULT_EVIDENCE_DIR = "edgeinfer-events"
DEFAULT_SAMPLES_DIR = "edgeinfer-samples"
#: how often the status line is redrawn (TTY) or printed (pipe), seconds
STATUS_PERIOD_S = 0.25
PIPE_STATUS_PERIOD_S = 5.0


def _parse_size(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    from ..capture import parse_size

    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _parse_values(_ctx: click.Context, param: click.Parameter, value: str | None) -> float | tuple[float, ...] | None:
    return parse_values(value, nonzero=param.name == "std")


def _use_board_decoders(sources: tuple[str, ...]) -> None:
    """An RTSP camera that states its codec (``#codec=h264``) is decoded by this board's hardware decoder, the
    one its device profile names (``stream_decode``), when the elements exist here."""
    if not any(text.lower().startswith(("rtsp://", "rtsps://")) and "codec=" in text for text in sources):
        return
    from ..capture.hwdecode import use_board_decoders
    from ..device.detect import detect

    profile = detect().profile
    use_board_decoders(profile.decoders() if profile is not None else {})


def _brief(result: object) -> str:
    """A few words about one frame's result for the status line."""
    if isinstance(result, list):
        return f"{result[0].label} ({result[0].score:.2f})" if result else "-"
    name = type(result).__name__
    if name == "Detections":
        best = f", best {result[0].label} {result[0].score:.2f}" if len(result) else ""  # type: ignore[arg-type, index]
        return f"{len(result)} detection(s){best}"  # type: ignore[arg-type]
    if name == "Segmentation":
        top = sorted(zip(result.fractions, result.labels), reverse=True)[:3]  # type: ignore[attr-defined]
        return ", ".join(f"{label} {fraction:.0%}" for fraction, label in top)
    return name


@click.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("--source", "-s", "sources", required=True, multiple=True,
              help="Video file, image folder/glob, camera index or /dev/videoN, rtsp:// or http:// URL, "
                   "GStreamer pipeline, picamera2, or synthetic[:WxH[@FPS]]. Repeat it for several streams on "
                   "one engine (NAME=SOURCE names a stream).")
@click.option("--batch", type=click.IntRange(min=1),
              help="Several streams: frames per invoke (a delegate that batches: openvino). Default: 1.")
@click.option("--task", type=click.Choice(TASK_NAMES),
              help="What to do with the model. Default: the task its metadata states, else the first output layout "
                   "that fits (a 1xN output: classify).")
@decoder_flag()
@click.option("--mean", callback=_parse_values, metavar="V|R,G,B",
              help="Float input normalisation (pixel - mean) / std, for a model that states none. Default: the "
                   "model's metadata, else its family's, else 127.5.")
@click.option("--std", callback=_parse_values, metavar="V|R,G,B", help="See --mean. Default: as --mean, else 127.5.")
@click.option("--channels", **choice_flag("channels"),
              help="The channel order the model takes, for a model whose metadata and family state none. Default: "
                   "the model's metadata, else its family's (BGR for YOLOX), else RGB (`edgeinfer info` says).")
@click.option("--pad", **choice_flag("pad"),
              help="Where a letterbox's border goes: centre, or corner (the image at the top-left, the border "
                   "bottom-right). Default: the model's metadata, else its family's (corner for YOLOX), else centre.")
@click.option("--labels", type=click.Path(dir_okay=False, path_type=str),
              help="Labels file. Default: the labels packed in the model, if any.")
@click.option("--delegate", help="Delegate name, optionally with a device (openvino:CPU), or a fallback order "
                                 "(coral,xnnpack): a delegate that fails while running hands over to the next. "
                                 "Default: the device profile's order.")
@click.option("--strict", is_flag=True, help="No fallback: a delegate that cannot load, fails or hangs is an error.")
@click.option("--no-probe", "no_probe", is_flag=True,
              help="Run on the device profile's first delegate. Default, when no delegate is named: the runtimes "
                   "that can run the model are measured once on this machine (a few seconds, cached) and the "
                   "fastest whose answers agree with the first's runs (docs/profiles.md).")
@click.option("--threads", type=click.IntRange(min=1),
              help="Delegate thread count (default: the profile's, else every core this process may use; "
                   "`edgeinfer device` says how many).")
@click.option("--policy", type=click.Choice(POLICIES),
              help="every: process each frame (back-pressure); latest: keep the newest, count drops. "
                   "Default: latest for cameras and streams, every for files.")
@click.option("--max-frames", type=click.IntRange(min=1), help="Stop after this many results.")
@click.option("--max-fps", type=click.FloatRange(min=0.01), help="Run inference at most this often.")
@click.option("--loop", is_flag=True, help="Restart a file source at its end.")
@click.option("--top-k", "top_k", **option_flag("top_k"), help="Classes per frame.")
@click.option("--resize", type=click.Choice(RESIZE_MODES),
              help="How frames fit the model input (default per task).")
@click.option("--score-threshold", **option_flag("score_threshold"),
              help="Detections below this score are dropped (Ultralytics' conf: 0.25).")
@click.option("--iou", "iou_threshold", **option_flag("iou_threshold"),
              help="Non-maximum suppression: a box that overlaps a better box of its class by more than this IoU "
                   "is dropped; higher keeps more overlapping boxes (Ultralytics' iou: 0.7).")
@click.option("--max-detections", **option_flag("max_detections"),
              help="Detections kept per frame at most, the best first (Ultralytics' max_det: 300).")
@click.option("--size", callback=_parse_size, help="Camera / synthetic frame size, WxH.")
@click.option("--fps", "camera_fps", type=click.FloatRange(min=0.1), help="Camera / synthetic frame rate.")
@click.option("--fourcc", help="Camera pixel format, e.g. MJPG or YUYV.")
@click.option("--full-decode", is_flag=True,
              help="Decode MJPEG / JPEG frames at full size (default: at the model's size, 1/2-1/8 scale).")
@click.option("--line", "lines", multiple=True, metavar="[NAME=]X1,Y1,X2,Y2",
              help="Count confirmed tracks crossing this line (source pixels; repeatable). Implies --track.")
@click.option("--zone", "zones", multiple=True, metavar="[NAME=]X1,Y1,X2,Y2,X3,Y3,...",
              help="Count confirmed tracks in this polygon (repeatable). Implies --track.")
@click.option("--track", is_flag=True,
              help="Give detections track ids (tasks with boxes: detect, pose, segment, obb; edgeinfer[tracking]).")
@click.option("--line-hold", "line_hold_s", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Seconds a track must stay on a line's or zone's new side before it counts (default 0.3).")
@click.option("--line-trigger", type=click.Choice(TRIGGERS), default=None,
              help="What must be across: the box's anchor point (default) or the whole box.")
@click.option("--event", "events", multiple=True, metavar="RULE",
              help="Record an event with a snapshot and a clip when RULE fires: line_crossed[:LINE][/LABEL,...], "
                   "zone_entered[:ZONE][/LABEL,...] or detection[:SCORE][/LABEL,...] (repeatable; docs/events.md).")
@click.option("--evidence-dir", type=click.Path(file_okay=False), default=None,
              help="Where --event keeps snapshots and clips (default: ./edgeinfer-events).")
@click.option("--record-source", metavar="SOURCE", default=None,
              help="Take --event's snapshots and clips from this source (the camera's main stream; a file is read "
                   "in step, frame n with frame n) while detection reads --source (its sub-stream).")
@click.option("--sample", "sample", multiple=True, metavar="RULE",
              help="Keep frames worth labelling with the model's output when RULE fires: "
                   "uncertain:LOW-HIGH[/LABEL,...], drift:DISTANCE[@FRAMES], event:RULE or random:RATE "
                   "(repeatable; docs/datasets.md).")
@click.option("--samples-dir", type=click.Path(file_okay=False), default=None,
              help="Where --sample keeps its samples (default: ./edgeinfer-samples).")
@click.option("--samples-per-minute", type=click.IntRange(min=1), default=None,
              help="Samples each --sample rule keeps a minute at most (default 6).")
# the old names of --sample, --samples-dir and --samples-per-minute (aliases, not in --help)
@click.option("--capture", "old_sample", multiple=True, hidden=True)  # old name
@click.option("--capture-dir", "old_samples_dir",  # old name
              type=click.Path(file_okay=False), default=None, hidden=True)
@click.option("--capture-per-minute", "old_samples_per_minute",  # old name
              type=click.IntRange(min=1), default=None, hidden=True)
@click.option("--motion-gate", is_flag=True, help="Skip inference on frames that did not change (reuse the result).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per result, then a summary line.")
@click.option("--preview", metavar="[HOST:]PORT", default=None,
              help="Serve the annotated frames as MJPEG at http://HOST:PORT/ while the run lasts (HOST: 127.0.0.1).")
@handle_errors
def run(model: str, sources: tuple[str, ...], batch: int | None, task: str | None, decoder: str | None,
        mean: float | tuple[float, ...] | None, std: float | tuple[float, ...] | None, channels: str | None,
        pad: str | None, labels: str | None,
        delegate: str | None, strict: bool, no_probe: bool, threads: int | None,
        policy: str | None, max_frames: int | None, max_fps: float | None, loop: bool, top_k: int,
        resize: str | None, score_threshold: float, iou_threshold: float, max_detections: int,
        size: tuple[int, int] | None, camera_fps: float | None,
        fourcc: str | None, full_decode: bool, lines: tuple[str, ...], zones: tuple[str, ...], track: bool,
        line_hold_s: float | None, line_trigger: str | None, events: tuple[str, ...], evidence_dir: str | None,
        record_source: str | None, sample: tuple[str, ...], samples_dir: str | None,
        samples_per_minute: int | None, old_sample: tuple[str, ...], old_samples_dir: str | None,
        old_samples_per_minute: int | None, motion_gate: bool, as_json: bool, preview: str | None) -> None:
    """Run MODEL over frames from --source and print results (or a live status line)."""
    from ..capture import open_source
    from ..pipeline.core import Pipeline
    from ..runtime.selection import STRICT_ENV
    from .preview import parse_address, previewing

    if strict:
        os.environ[STRICT_ENV] = "1"
    _use_board_decoders(sources)
    address = parse_address(preview) if preview is not None else None
    if record_source is not None and (not events or len(sources) > 1 or batch):
        raise click.UsageError("--record-source goes with --event and one --source")
    decoding = {"top_k": top_k, "score_threshold": score_threshold, "iou_threshold": iou_threshold,
                "max_detections": max_detections, "delegate_probe": not no_probe}
    analysis = {"lines": lines, "zones": zones, "track": track, "events": events,
                "evidence_dir": (evidence_dir or DEFAULT_EVIDENCE_DIR) if events else None,
                "decoder": decoder, "mean": mean, "std": std,
                "channels": channels.lower() if channels else None, "pad": pad.lower() if pad else None}
    if record_source is not None:
        analysis["record_source"] = record_source
    sample, samples_dir = sample + old_sample, samples_dir or old_samples_dir
    samples_per_minute = samples_per_minute or old_samples_per_minute
    if sample:
        analysis.update(sample=sample, samples_dir=samples_dir or DEFAULT_SAMPLES_DIR,
                        **({"samples_per_minute": samples_per_minute} if samples_per_minute else {}))
    # given only: the options' own defaults otherwise
    analysis.update({k: v for k, v in (("line_hold_s", line_hold_s), ("line_trigger", line_trigger)) if v is not None})
    if len(sources) > 1 or batch:
        from .run_multi import run_streams

        run_streams(model, sources, batch=batch, task=task, labels=labels, delegate=delegate, threads=threads,
                    policy=policy or "latest", max_fps=max_fps, loop=loop, resize=resize, size=size,
                    fps=camera_fps, fourcc=fourcc,
                    max_frames=max_frames, as_json=as_json, motion_gate=motion_gate, preview=address, **decoding,
                    **analysis)
        return
    source = sources[0]
    frames = open_source(source, size=size, fps=camera_fps, fourcc=fourcc, loop=loop)
    try:
        chosen_policy = policy or ("latest" if frames.live else "every")
        pipeline = Pipeline(model, frames, task=task, labels=labels, delegate=delegate, threads=threads,
                            policy=chosen_policy, max_fps=max_fps, max_frames=max_frames, resize=resize,
                            reduced_decode=not full_decode, motion_gate=motion_gate, **decoding, **analysis)
    except BaseException:
        frames.close()
        raise
    interrupted = False
    with frames, pipeline, previewing(pipeline.multi, address, ""):
        engine = pipeline.engine
        choice = delegate_choice(engine)
        if engine.fallback_reason and not as_json:
            click.echo(f"note: using {engine.description} ({engine.fallback_reason})", err=True)
        say_delegate_choice(choice)
        if not as_json and task is None:
            click.echo(f"note: {pipeline.reading}", err=True)
        tty = sys.stdout.isatty() and not as_json
        if events:
            pipeline.add_event_listener(event_printer(as_json, tty))
        period = STATUS_PERIOD_S if tty else PIPE_STATUS_PERIOD_S
        next_status = time.monotonic() + period
        try:
            for result in pipeline:
                if as_json:
                    sys.stdout.write(json.dumps({"type": "result", **result.to_dict()}) + "\n")
                    continue
                now = time.monotonic()
                if now >= next_status:
                    next_status = now + period
                    _status(pipeline, result, tty)
        except KeyboardInterrupt:
            interrupted = True
            pipeline.stop()
        stats = pipeline.stats
        sampler = pipeline.sampler
        if sampler is not None:
            sampler.close()  # the samples kept are on disk before the summary counts them
        if as_json:
            kept = {"samples": sampler.counts()} if sampler is not None else {}
            sys.stdout.write(json.dumps({"type": "summary", **stats.to_dict(), **kept,
                                         "runtime_threads": pipeline.engine.threads,
                                         "delegate_choice": choice.to_dict() if choice else None}) + "\n")
            sys.stdout.flush()
        else:
            if tty:
                click.echo("\r\033[K", nl=False)
            latency = stats.stages["latency"]
            click.echo(f"{stats.frames} frames in {stats.elapsed_s:.1f} s: {stats.fps:.1f} fps, "
                       f"latency p50 {latency['p50']:.1f} ms / p95 {latency['p95']:.1f} ms / "
                       f"p99 {latency['p99']:.1f} ms, dropped {stats.dropped}, on {stats.delegate}"
                       + (f" (degraded: {stats.delegate_wanted} failed, {stats.frames_lost} frame(s) lost)"
                          if stats.degraded else ""))
            if stats.reused:
                click.echo(f"motion gate: {stats.reused} frame(s) reused the previous result")
            if stats.analytics is not None:
                _print_counts(stats.analytics)
            if pipeline.events is not None:
                print_event_counts(pipeline.events.counts(), analysis["evidence_dir"])
            if sampler is not None:
                print_sample_counts(sampler.counts(), analysis["samples_dir"])
    if interrupted:
        sys.exit(130)


def _print_counts(counts: dict) -> None:
    """Lines and zones at the end of a run."""
    click.echo(f"tracks: {counts['tracks']['confirmed']} confirmed")
    for name, line in counts["lines"].items():
        click.echo(f"line {name}: in {line['in']}, out {line['out']}")
    for name, zone in counts["zones"].items():
        click.echo(f"zone {name}: {zone['inside']} inside, {zone['entries']} entries")


def _status(pipeline, result, tty: bool) -> None:
    window = pipeline.take_window()
    latency = window.stages["latency"]["p50"]
    line = (f"frame {result.frame_id}  {window.fps:5.1f} fps  latency {latency:6.1f} ms  "
            f"dropped {pipeline.dropped}  [{window.delegate}]  {_brief(result.result)}")
    if tty:
        width = max(20, shutil.get_terminal_size((120, 24)).columns - 1)
        click.echo("\r\033[K" + line[:width], nl=False)
    else:
        click.echo(line)
