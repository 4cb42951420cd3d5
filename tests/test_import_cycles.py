"""No import cycles among jenga_sglang's modules.

The module graph is read from the source with `ast` (nothing is imported): every `import` and
`from ... import`, at module level or inside a function (a lazy import still closes a circle
when it runs), except those under `if TYPE_CHECKING:`. radix/, policies/, bench/ and kernels/
sit beside the package and are its subpackages through symlinks, so they are walked as
jenga_sglang.radix etc. Importing a module does not count as importing its package's
`__init__` (every package would otherwise close a circle with its own submodules). The same
graph folded onto the subpackages (radix, policies, binding, pool, ..., and bench's own:
bench.traces, bench.simulation, ...) must be one-way too.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "jenga_sglang"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, dirs, files in os.walk(ROOT, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
        parts = Path(folder).relative_to(ROOT).parts
        for name in files:
            if not name.endswith(".py"):
                continue
            stem = name[:-3]
            dotted = [PACKAGE, *parts] + ([] if stem == "__init__" else [stem])
            found[".".join(dotted)] = Path(folder) / name
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, here: str, is_package: bool) -> Iterator[tuple[str, list[str]]]:
    """(module, names) of every import outside `if TYPE_CHECKING:` blocks."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.split(".")[: len(here.split(".")) - node.level + is_package]
                base = ".".join([*parent, base] if base else parent)
            yield base, [alias.name for alias in node.names]
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """Module -> the jenga_sglang modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for base, names in _imports(tree, module, path.name == "__init__.py"):
            for name in names or [""]:
                target = f"{base}.{name}" if name and f"{base}.{name}" in modules else base
                if target in modules and target != module:
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto jenga_sglang's subpackages and bench's (top-level modules
    stay)."""

    def package(module: str) -> str:
        parts = module.split(".")
        depth = 3 if len(parts) > 3 and parts[1] == "bench" else 2
        return ".".join(parts[:depth])

    folded: dict[str, set[str]] = {package(m): set() for m in graph}
    for module, targets in graph.items():
        folded[package(module)] |= {package(t) for t in targets} - {package(module)}
    return folded


def test_the_graph_sees_lazy_imports_and_the_symlinked_folders() -> None:
    graph = import_graph()
    assert "jenga_sglang.radix.tree" in graph and "jenga_sglang.bench.cli.main" in graph
    # imported inside register(), not at module level
    assert "jenga_sglang.binding.pools.hook" in graph["jenga_sglang.binding.plugin"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_no_import_cycles_between_subpackages() -> None:
    found = cycles(package_graph(import_graph()))
    assert not found, "\n".join(" <-> ".join(c) for c in found)


#: The binding's groups by layer (jenga_sglang/binding/__init__.py): a group imports only from
#: lower layers and its own.
BINDING_LAYERS = {"capture": 2, "pools": 2, "cache": 1, "slots": 0}


def test_binding_groups_import_one_way() -> None:
    """capture and pools sit above cache, cache above slots; none imports one above it (or a
    sibling: capture and pools are independent)."""
    graph = import_graph()
    prefix = f"{PACKAGE}.binding."

    def group(module: str) -> str | None:
        rest = module.removeprefix(prefix).split(".")
        return rest[0] if module.startswith(prefix) and len(rest) > 1 else None

    wrong = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if (g := group(m)) in BINDING_LAYERS
        and (h := group(t)) in BINDING_LAYERS
        and g != h
        and BINDING_LAYERS[h] >= BINDING_LAYERS[g]
    )
    assert not wrong, "\n".join(wrong)
    assert {group(m) for m in graph} >= set(BINDING_LAYERS)
