"""The layering runs one way: radix/ (the tree, its memory and the contracts it calls) imports
nothing from the policies that implement those contracts, nor from the drivers above them; and
bench/'s subpackages import only those below them (traces < simulation < drivers < runs <
studies < cli)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RADIX = Path(__file__).resolve().parent.parent / "radix"
ABOVE = ("jenga_sglang.policies", "jenga_sglang.bench", "jenga_sglang.binding")


def imported(path: Path) -> list[str]:
    """Every module `path` imports, at any depth (TYPE_CHECKING blocks and functions too)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            base = node.module or ""
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return names


@pytest.mark.parametrize("path", sorted(RADIX.glob("*.py")), ids=lambda p: p.name)
def test_radix_imports_nothing_above_it(path: Path) -> None:
    bad = [n for n in imported(path) if n.startswith(ABOVE) or n in {"policies", "bench"}]
    assert not bad, f"radix/{path.name} imports {bad}"


def test_the_check_sees_imports() -> None:
    """The parser finds an import of the kind the test forbids (so a pass means something)."""
    sample = RADIX.parent / "policies" / "eviction.py"
    assert any(n.startswith("jenga_sglang.radix") for n in imported(sample))


BENCH = RADIX.parent / "bench"
#: bench/'s subpackages, lowest first: each may import only from those before it
BENCH_LAYERS = ("traces", "simulation", "drivers", "runs", "studies", "cli")


@pytest.mark.parametrize(
    "path", sorted(BENCH.glob("*/*.py")), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_bench_imports_only_layers_below(path: Path) -> None:
    own = BENCH_LAYERS.index(path.parent.name)
    above = tuple(f"jenga_sglang.bench.{layer}" for layer in BENCH_LAYERS[own + 1 :])
    bad = [n for n in imported(path) if n.startswith(above)]
    assert not bad, f"bench/{path.parent.name}/{path.name} imports {bad}"


def test_bench_has_no_module_outside_its_layers() -> None:
    assert not list(BENCH.glob("*.py")), "every bench module belongs to one subpackage"
    assert {p.name for p in BENCH.iterdir() if p.is_dir() and p.name != "__pycache__"} <= {
        *BENCH_LAYERS,
        ".packed",
    }
