"""The package's import graph: no cycle (imports inside functions and type-only ones count), and
every import goes to the module's own family or a layer below it (docs/architecture.md, the map)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bootstrap"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str], type_only: bool) -> set[str]:
    """Every bootstrap module ``path`` imports, at any depth; TYPE_CHECKING blocks only with
    ``type_only`` (they never run, but a reader follows them all the same)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set() if type_only else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in found if name in modules}


def import_graph(*, type_only: bool = False) -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    # Importing bootstrap.x runs bootstrap/__init__.py first, but that imports nothing at
    # run time (its exports are lazy): only the edges written in each module count.
    return {name: _imports(path, modules, type_only) - {name, "bootstrap"}
            for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# The layers, lowest first. A module may import its own family and any lower layer, never a
# higher one; type-only imports count too (they are what a reader follows). The families are
# the directories of bootstrap/; the top-level modules each stand at their own layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("bootstrap.errors",),
    ("bootstrap.primitives",),
    ("bootstrap.warm", "bootstrap.warm_failures", "bootstrap.fingerprint"),
    ("bootstrap.places",),
    ("bootstrap.trees",),
    ("bootstrap.config_file",),
    ("bootstrap.sources",),
    ("bootstrap.config", "bootstrap.config_kernel"),
    ("bootstrap.env",),
    ("bootstrap.skills",),
    ("bootstrap.snapshots",),
    ("bootstrap.engine",),
    ("bootstrap.kernels",),
    ("bootstrap.commands",),
    ("bootstrap.arguments",),
    ("bootstrap.cli", "bootstrap.__main__", "bootstrap"),
)


def layer_of(module: str) -> int:
    for rank, members in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members if m != "bootstrap"):
            return rank
    assert module == "bootstrap", f"{module} is in no layer: add its family to LAYERS"
    return len(LAYERS) - 1


def _family(module: str) -> str:
    return ".".join(module.split(".")[:2])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps
                  if _family(a) != _family(b) and layer_of(b) > layer_of(a))


def test_every_module_imports_only_its_family_and_the_layers_below() -> None:
    assert upward_imports(import_graph(type_only=True)) == []


def test_the_package_has_no_import_cycle_counting_type_only_imports() -> None:
    cycle = find_cycle(import_graph(type_only=True))
    assert cycle is None, " -> ".join(cycle or [])


def test_the_layer_check_sees_an_upward_import() -> None:
    assert upward_imports({"bootstrap.env.venv": {"bootstrap.engine.ensure"}}) == [
        "bootstrap.env.venv -> bootstrap.engine.ensure"]
    assert upward_imports({"bootstrap.engine.ensure": {"bootstrap.env.venv"}}) == []


def test_each_family_init_imports_nothing() -> None:
    # The warm path imports bootstrap.primitives (and so its __init__): a re-export there
    # would cost every kernel start.
    for init in PACKAGE.glob("*/__init__.py"):
        tree = ast.parse(init.read_text(encoding="utf-8"))
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)], init
