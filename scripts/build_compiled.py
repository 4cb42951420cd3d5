"""Compile the simulator's hot modules with mypyc, in place (optional; `make accelerate`).

Not named accelerate.py: scripts run with scripts/ first on sys.path, where a module named
`accelerate` would shadow Hugging Face's package (transformers then fails to read its version).

    python scripts/build_compiled.py           build (replaces an earlier build)
    python scripts/build_compiled.py --clean   remove the build: back to pure Python (and
                                               `make install` no longer builds it)

The modules are `jenga_sglang.compiled.MODULES`. Each gets an extension module next to its
source, plus one shared library `jenga_sglang/_accel__mypyc*.so` holding the code of all of
them; the C sources go to build/mypyc. Without mypyc or a C compiler this prints why and exits
0: the pure-Python modules stay in use. A failed build removes what it left behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import sysconfig
import time
from importlib.util import find_spec, module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"


def _registry() -> ModuleType:
    """jenga_sglang/compiled.py, loaded by path: importing the package would refuse the stale
    build this script is about to replace."""
    spec = spec_from_file_location("_jenga_compiled", ROOT / "jenga_sglang" / "compiled.py")
    assert spec is not None and spec.loader is not None
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clean(reg: ModuleType) -> None:
    for path in [*reg.built_files(), reg.STAMP]:
        path.unlink(missing_ok=True)
    shutil.rmtree(BUILD / "mypyc", ignore_errors=True)
    shutil.rmtree(BUILD / "mypyc-tmp", ignore_errors=True)


def missing_tool() -> str | None:
    """Why a build cannot run here, or None."""
    if find_spec("mypyc") is None:
        return "mypyc is not installed (it comes with mypy: pip install mypy)"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(os.environ.get("CC", cc)) is None:
        return f"no C compiler ({os.environ.get('CC', cc)!r} not found)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "the Python headers (Python.h) are missing (e.g. apt-get install python3-dev)"
    return None


def build(reg: ModuleType) -> None:
    from mypyc.build import mypycify
    from setuptools import Distribution

    os.chdir(ROOT)  # mypy derives module names from the paths below
    paths = [str(reg.source(m).relative_to(ROOT)) for m in reg.MODULES]
    extensions = mypycify(paths, group_name="jenga_sglang._accel", target_dir="build/mypyc")
    dist = Distribution({"ext_modules": extensions, "script_name": "build_compiled.py"})
    dist.script_args = ["build_ext", "--inplace", "--build-temp", "build/mypyc-tmp"]
    dist.parse_command_line()
    dist.run_commands()
    reg.STAMP.write_text(reg.source_digest() + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove the build")
    args = parser.parse_args()
    reg = _registry()
    clean(reg)
    if args.clean:
        # The stamp stays, saying so: `make install` builds only where no stamp is.
        reg.STAMP.write_text("pure Python (make unaccelerate)\n")
        print("accelerate: build removed; the pure-Python modules are in use")
        return 0
    reason = missing_tool()
    if reason is not None:
        print(f"accelerate: skipped, {reason}; the pure-Python modules stay in use")
        return 0
    start = time.perf_counter()
    try:
        build(reg)
    except BaseException:
        clean(reg)
        print("accelerate: build failed (above); the pure-Python modules stay in use")
        raise
    took = time.perf_counter() - start
    print(f"accelerate: compiled {len(reg.MODULES)} modules in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
