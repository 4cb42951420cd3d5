"""The optional mypyc build of the simulator's hot modules: which modules, and whether it is in use.

`scripts/build_compiled.py` (`make accelerate`) compiles `MODULES` in place: an extension module
(`tree.cpython-311-x86_64-linux-gnu.so`) next to each source, which Python imports instead of the
`.py`. The pure-Python sources stay the reference: the build changes speed, never decisions, and
removing it (`make unaccelerate`) goes back to them.

The sources carry mypyc's class options (`mypy_extensions.mypyc_attr`, a no-op in pure Python):

* `allow_interpreted_subclasses=True` on the bases that Python code subclasses (memories,
  policies, costs) and on every class marked serializable (below);
* `serializable=True` on the classes the tuner pickles with the cache whose `__init__` takes
  arguments (others unpickle through a no-argument `__init__`). With the mypyc this was built
  with, such a class created from Python code only runs its `__init__` when it also allows
  interpreted subclasses, hence both options together;
* `native_class=False` on exceptions and on frozen dataclasses sent between processes (a
  compiled frozen dataclass cannot be unpickled).

`make install` builds it where mypyc and a C compiler are present (and says why not where
they are missing), so the server's tree and policies run compiled by default.

A compiled module that no longer matches its source would silently run old code, so the build
records a digest of the sources (`check_fresh` raises on a stale build). Importing
`jenga_sglang` with a stale build warns and imports every one of `MODULES` from its source
instead (`prefer_sources`): editing a source never breaks a run, it only loses the speed until
`make accelerate` rebuilds. This module is never compiled itself.
"""

from __future__ import annotations

import hashlib
import sys
import warnings
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from importlib.util import spec_from_file_location
from pathlib import Path
from types import ModuleType

PACKAGE = Path(__file__).resolve().parent

MODULES: tuple[str, ...] = (
    "jenga_sglang.radix.node",
    "jenga_sglang.radix.tokens",
    "jenga_sglang.radix.pages",
    "jenga_sglang.radix.memory",
    "jenga_sglang.radix.match",
    "jenga_sglang.radix.rules",
    "jenga_sglang.radix.contracts",
    "jenga_sglang.radix.spaces",
    "jenga_sglang.radix.cost",
    "jenga_sglang.radix.insert",
    "jenga_sglang.radix.evict",
    "jenga_sglang.radix.tree",
    "jenga_sglang.radix.lease",
    "jenga_sglang.radix.commit",
    "jenga_sglang.radix.cache",
    "jenga_sglang.radix.host_copy",
    "jenga_sglang.radix.host_demote",
    "jenga_sglang.radix.host_load",
    "jenga_sglang.radix.host",
    "jenga_sglang.policies.ghost",
    "jenga_sglang.policies.eviction",
    "jenga_sglang.policies.ranking",
    "jenga_sglang.policies.admission",
    "jenga_sglang.policies.branching",
    "jenga_sglang.policies.bypass",
    "jenga_sglang.policies.superseded",
    "jenga_sglang.policies.tuning",
    "jenga_sglang.policies.tuners",
    "jenga_sglang.policies.replay_grid",
    "jenga_sglang.bench.simulation.replay",
    "jenga_sglang.bench.simulation.engine_config",
    "jenga_sglang.bench.simulation.engine_batch",
    "jenga_sglang.bench.simulation.engine_cache",
    "jenga_sglang.bench.simulation.engine",
)

#: Written by the build: the digest of the sources it compiled.
STAMP = PACKAGE / "_compiled.stamp"


def source(module: str) -> Path:
    """The .py file of one of MODULES (through the package's folder links)."""
    return PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")


def built_files() -> list[Path]:
    """Extension modules the build leaves in the package folders (and its shared library)."""
    folders = {PACKAGE, *(source(m).parent for m in MODULES)}
    return sorted(p for d in folders for s in EXTENSION_SUFFIXES for p in d.glob(f"*{s}"))


def source_digest() -> str:
    h = hashlib.sha256()
    for module in MODULES:
        h.update(module.encode())
        h.update(source(module).read_bytes())
    return h.hexdigest()


def check_fresh() -> None:
    """Raise ImportError when compiled modules exist that were built from other sources."""
    if not built_files():
        return
    built = STAMP.read_text().strip() if STAMP.exists() else "(no stamp)"
    if built != source_digest():
        raise ImportError(
            f"the mypyc build under {PACKAGE} is stale: its sources changed since it was "
            "compiled. Rebuild it (`make accelerate`) or remove it (`make unaccelerate`)."
        )


class _Sources(MetaPathFinder):
    """Finds `MODULES` at their .py sources, ahead of the extension modules beside them."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        return spec_from_file_location(fullname, source(fullname)) if fullname in MODULES else None


def prefer_sources() -> None:
    """Import `MODULES` from their sources from now on (before any of them is imported)."""
    if not any(isinstance(f, _Sources) for f in sys.meta_path):
        sys.meta_path.insert(0, _Sources())


def use_fresh_build() -> None:
    """At package import: a fresh build is used; a stale one is set aside, with a warning."""
    try:
        check_fresh()
    except ImportError as stale:
        warnings.warn(f"{stale} Running the pure-Python sources meanwhile.", stacklevel=2)
        prefer_sources()


def compiled() -> bool:
    """Whether the loaded simulator modules are the compiled ones (all of them or none)."""
    loaded = [sys.modules[m] for m in MODULES if m in sys.modules]
    return bool(loaded) and all(
        (getattr(mod, "__file__", None) or "").endswith(tuple(EXTENSION_SUFFIXES)) for mod in loaded
    )
