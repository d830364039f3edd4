"""The folders are the architecture: each folder imports only the folders its allow-list names, and no cycles.

Every import in the package is read from the source (``import`` statements anywhere in a module:
at the top, inside functions, under ``TYPE_CHECKING``), resolved to a module of the package, and
checked against :data:`ALLOWED`, which docs/architecture.md draws as its table of the folders.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edgeinfer"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
TABLE_HEADING = "## The folders are the boxes"
#: a box as the table names it: `pipeline/`, `_fs.py`, `errors`
NAME = r"`([a-z_]+)(?:/|\.py)?`"

#: the base modules: one mechanism (or one word) each, below every folder
BASE = frozenset({"errors", "_version", "_fs", "_backoff", "_config", "_native", "_optional", "_defer", "_dist",
                  "_evidence", "_samples", "_regions", "_redact"})
#: the folders below the agent and the fleet manager, in the order the data flows
DEVICE_SIDE = frozenset({"device", "runtime", "capture", "pipeline"})
#: what each box (a folder, or a base module) may import besides itself. Explicit, not a layer order: the fleet
#: manager sits above the link and the updates, and not above the pipeline (it loads no numpy, no model).
ALLOWED: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "_version": frozenset(),
    **{helper: frozenset({"errors"}) for helper in BASE - {"errors", "_version"}},
    "device": BASE,
    "runtime": BASE | {"device"},
    "capture": BASE,
    "pipeline": BASE | {"capture", "runtime"},
    "link": BASE | {"pipeline"},
    "updates": BASE | {"runtime"},
    "agent": BASE | DEVICE_SIDE | {"link", "updates"},
    "fleet": BASE | {"link", "updates"},
    "tools": BASE | DEVICE_SIDE | {"link", "updates", "agent", "fleet"},
    "cli": BASE | DEVICE_SIDE | {"link", "updates", "agent", "fleet", "tools"},
}
#: entry points: they may import anything, nothing may import them
ENTRY_POINTS = {"edgeinfer", "edgeinfer.__main__", "edgeinfer.validate_model"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str) -> set[str]:
    """The package modules that ``name`` imports (``from x import y`` counts as x.y when y is a module)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in MODULES else origin
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # import edgeinfer.a.b.name -> edgeinfer.a.b
                target = target.rpartition(".")[0]
            if target.startswith("edgeinfer") and target != name:
                found.add(target)
    return found


GRAPH = {name: imported_modules(name) for name in MODULES}


def component(module: str) -> str:
    """The box a module belongs to: its subpackage, or the base module's own name."""
    return module.split(".")[1] if module.count(".") >= 1 else module


def allowed(module: str) -> frozenset[str]:
    box = component(module)
    if box not in ALLOWED:
        raise AssertionError(f"{module}: the box {box!r} has no allow-list — add it to ALLOWED and "
                             "docs/architecture.md")
    return ALLOWED[box]


@pytest.mark.parametrize("module", sorted(set(MODULES) - ENTRY_POINTS))
def test_imports_stay_within_the_allow_list(module):
    refused = []
    for target in sorted(GRAPH[module]):
        if target in ENTRY_POINTS:
            refused.append(f"{target} (an entry point)")
        elif component(target) != component(module) and component(target) not in allowed(module):
            refused.append(f"{target} ({component(module)} may import: "
                           f"{', '.join(sorted(allowed(module))) or 'nothing'})")
    assert not refused, f"{module} imports outside its allow-list: {', '.join(refused)}"


def test_the_allow_list_has_no_cycle():
    """Box A may import box B, B may import C, ...: never back to A (so no import cycle between boxes can pass)."""

    def reachable(box: str) -> set[str]:
        found: set[str] = set()
        todo = list(ALLOWED[box])
        while todo:
            other = todo.pop()
            if other not in found:
                found.add(other)
                todo.extend(ALLOWED.get(other, ()))
        return found

    cycles = [box for box in ALLOWED if box in reachable(box)]
    assert not cycles, f"these boxes can reach themselves through the allow-list: {cycles}"


def test_the_fleet_manager_imports_nothing_from_the_device_side():
    """What the fleet and the devices share is in link/ and the base modules, never in pipeline/ and below."""
    fleet = {target for module in MODULES if component(module) == "fleet" for target in GRAPH[module]}
    assert not {component(target) for target in fleet} & DEVICE_SIDE


def test_docs_architecture_draws_the_allow_list():
    """The table of the boxes in docs/architecture.md is the allow-list: a row per box (or boxes), what each may
    import ("base": every base module)."""
    section = ARCHITECTURE.read_text().partition(TABLE_HEADING)[2].partition("\n### ")[0]
    drawn: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        imports = set(re.findall(NAME, cells[2])) | (set(BASE) if re.search(r"\bbase\b", cells[2]) else set())
        for name in re.findall(NAME, cells[0]):
            drawn[name] = imports
    assert drawn == {box: set(boxes) for box, boxes in ALLOWED.items()}


def test_no_import_cycles():
    """Depth-first search over the whole graph, entry points included; every cycle is reported."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_layer_walk_sees_imports_inside_functions_and_type_checking():
    """The walk is not fooled by lazy imports: the CLI imports its commands' libraries inside functions."""
    assert "edgeinfer.runtime.model" in GRAPH["edgeinfer.cli.model"]
    assert any(target.startswith("edgeinfer.capture") for target in GRAPH["edgeinfer.pipeline.binding"])


# ------------------------------------------------------------------------------- small units

#: the house limits (docs/architecture.md): a module a reader can hold in mind, a class with one job
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300


def test_modules_and_classes_stay_small():
    too_big = []
    for name, path in MODULES.items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_big.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                too_big.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_big, f"split these (modules <= {MAX_MODULE_LINES}, classes <= {MAX_CLASS_LINES}): {too_big}"


def _is_exception_class(node: ast.ClassDef) -> bool:
    """A class whose base is an exception by name (ValueError, CaptureError, Exception, ...)."""
    names = {base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
             for base in node.bases}
    return any(name.endswith(("Error", "Exception", "Warning")) for name in names)


def test_exceptions_are_defined_in_errors_py_only():
    """One exception tree, drawn in edgeinfer/errors.py's docstring; no module grows a private one."""
    strays = [f"{name}.{node.name}" for name, path in MODULES.items() if name != "edgeinfer.errors"
              for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
              and _is_exception_class(node)]
    assert not strays, f"define these in edgeinfer/errors.py: {strays}"


def test_every_error_class_is_drawn_in_the_tree():
    import edgeinfer.errors as errors

    classes = [name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, errors.EdgeInferError)]
    missing = [name for name in classes if name not in (errors.__doc__ or "")]
    assert not missing, f"add these to the tree in edgeinfer/errors.py's docstring: {missing}"
