"""Compare two directories of decision records (scripts/decision_records.sh, engine_records.sh).

    python scripts/compare_records.py BEFORE_DIR AFTER_DIR

Every JSON line of every `*.jsonl` file under BEFORE_DIR must have a twin (same file, same key
fields) under AFTER_DIR with every field it had unchanged (fields added since are allowed),
once the fields that measure host time or the build are dropped, at any depth. Also reads the
one-object outputs of scripts/engine_records.sh. Prints one line per file and exits 1 on any
difference or on a file with nothing to compare.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: fields that measure the run (host time, the build), not its decisions; simulated times stay
VOLATILE = frozenset({"wall_s", "cpu_s", "tuning_s", "tuning_cpu_s", "compiled", "peak_rss_mb"})


def _stable(value: Any) -> Any:
    """`value` without the volatile fields, at any depth (engine records nest per-run dicts)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _key(record: dict[str, Any]) -> str:
    fields = ("trace", "workload", "model", "mode", "memory", "policy", "cache_gb", "via")
    return json.dumps([record.get(f) for f in fields])


def _load(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip().startswith("{"):
            record = json.loads(line)
            out[_key(record)] = _stable(record)
    return out


def main(before: Path, after: Path) -> int:
    bad = 0
    for old_path in sorted(before.rglob("*.jsonl")):
        rel = old_path.relative_to(before)
        new_path = after / rel
        if not new_path.exists():
            print(f"{rel}: missing after")
            bad += 1
            continue
        old, new = _load(old_path), _load(new_path)
        if not old:  # nothing compared is no evidence: say so
            print(f"{rel}: no JSON object lines before")
            bad += 1
            continue
        # fields added after BEFORE are allowed; every field BEFORE had must be unchanged
        diffs = [
            k
            for k in old.keys() | new.keys()
            if k not in old or k not in new or any(new[k].get(f) != v for f, v in old[k].items())
        ]
        for k in sorted(diffs)[:5]:
            a, b = old.get(k, {}), new.get(k, {})
            changed = {f: (v, b.get(f)) for f, v in a.items() if b.get(f) != v}
            print(f"  {k}: {changed}")
        print(f"{rel}: {len(old)} records, {len(diffs)} differ")
        bad += len(diffs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
