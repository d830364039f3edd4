"""The folders are the architecture: a module imports only from its own layer or below, and no cycles.

Every import in the package is read from the source (``import`` statements anywhere in a module:
at the top, inside functions, under ``TYPE_CHECKING``), resolved to a module of the package, and
checked against the layer order drawn in docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edgeinfer"

#: bottom to top; a layer may import from its own package and from any lower layer. Packages that
#: share a layer are siblings and must not import each other.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "_version"}),
    frozenset({"_fs", "_backoff", "_config", "_native", "_optional", "_defer", "_dist", "_evidence"}),
    frozenset({"device"}),
    frozenset({"runtime"}),
    frozenset({"capture"}),
    frozenset({"pipeline"}),
    frozenset({"link"}),
    frozenset({"updates"}),
    frozenset({"agent", "fleet"}),
    frozenset({"tools"}),
    frozenset({"cli"}),
)
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


def layer_of(module: str) -> int:
    box = component(module)
    for index, layer in enumerate(LAYERS):
        if box in layer:
            return index
    raise AssertionError(f"{module}: the package {box!r} is in no layer — add it to LAYERS and docs/architecture.md")


@pytest.mark.parametrize("module", sorted(set(MODULES) - ENTRY_POINTS))
def test_imports_point_down(module):
    upward = []
    for target in sorted(GRAPH[module]):
        if target in ENTRY_POINTS:
            upward.append(f"{target} (an entry point)")
        elif component(target) != component(module) and layer_of(target) >= layer_of(module):
            upward.append(f"{target} (layer {layer_of(target)} >= {layer_of(module)})")
    assert not upward, f"{module} (layer {layer_of(module)}) imports upward or sideways: {', '.join(upward)}"


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
