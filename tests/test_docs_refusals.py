"""docs/sglang.md's "Refused flags" table lists exactly the flags binding/refusals.py refuses,
each with the reason the start-up error gives, and its "Flags the Jenga pool stands in for"
table exactly the flags the plugin drops, with the warning's reason, so the docs cannot drift
from the code."""

from __future__ import annotations

from pathlib import Path

from jenga_sglang.binding.refusals import POOL_STANDS_IN, WITH_JENGA, WITH_POOL

DOC = Path(__file__).resolve().parents[1] / "docs" / "sglang.md"


def _table(heading: str = "### Refused flags", columns: int = 3) -> dict[str, str]:
    text = DOC.read_text().split(heading, 1)[1]
    rows = {}
    for line in text.splitlines():
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `") and len(cells) == columns:
            rows[cells[0].strip("`")] = cells[-1]
    return rows


def test_the_docs_table_is_the_code_table() -> None:
    rows = _table()
    refusals = (*WITH_JENGA, *WITH_POOL)
    assert set(rows) == {r.flag for r in refusals}
    for refusal in refusals:
        assert rows[refusal.flag] == refusal.reason, refusal.flag


def test_the_docs_stand_in_table_is_the_code_table() -> None:
    rows = _table("### Flags the Jenga pool stands in for", 2)
    assert set(rows) == {s.flag for s in POOL_STANDS_IN}
    for stand_in in POOL_STANDS_IN:
        assert rows[stand_in.flag] == stand_in.reason, stand_in.flag
