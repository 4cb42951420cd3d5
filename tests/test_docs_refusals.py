"""docs/sglang.md's "Refused flags" table lists exactly the flags binding/refusals.py refuses,
each with the reason the start-up error gives, so the docs cannot drift from the code."""

from __future__ import annotations

from pathlib import Path

from jenga_sglang.binding.refusals import WITH_JENGA, WITH_POOL

DOC = Path(__file__).resolve().parents[1] / "docs" / "sglang.md"


def _table() -> dict[str, str]:
    text = DOC.read_text().split("### Refused flags", 1)[1]
    rows = {}
    for line in text.splitlines():
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            rows[cells[0].strip("`")] = cells[2]
    return rows


def test_the_docs_table_is_the_code_table() -> None:
    rows = _table()
    refusals = (*WITH_JENGA, *WITH_POOL)
    assert set(rows) == {r.flag for r in refusals}
    for refusal in refusals:
        assert rows[refusal.flag] == refusal.reason, refusal.flag
