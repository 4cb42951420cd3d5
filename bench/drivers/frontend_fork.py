"""An SGLang frontend program against a running server: a shared few-shot prefix, then `fork`.

    prefix (few-shot) ──┬── "Question: q1 Answer:" gen
                        ├── "Question: q2 Answer:" gen
                        └── "Question: q3 Answer:" gen

The program calls `s.sync()` before `fork`: `ProgramState.fork` (sglang/lang/interpreter.py)
checks for uncommitted text *before* it syncs, so without it the prefix is never sent alone and
the branches race to prefill it (docs/e2e-cpu.md). With it, the prefix is prefilled once and
every branch should report the prefix as cached tokens.
"""

from __future__ import annotations

import time
from typing import Any

FEW_SHOT = (
    "The cache keeps the state of every conversation so that the next turn does not start "
    "over. A hybrid model mixes attention layers with state space layers. "
) * 4
QUESTIONS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Which planet is the largest?",
)


def run_fork(
    url: str, questions: tuple[str, ...] = QUESTIONS, max_tokens: int = 6
) -> dict[str, Any]:
    """Run the program against `url`; cached and prompt tokens of each branch."""
    import sglang as sgl
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    @sgl.function  # type: ignore[untyped-decorator]
    def branches(s: Any, questions: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
        s += FEW_SHOT
        s.sync()  # commit the prefix before forking (see the module doc)
        forks = s.fork(len(questions))
        for f, q in zip(forks, questions, strict=True):
            f += "Question: " + q + " Answer:"
            f += sgl.gen("answer", max_tokens=max_tokens, temperature=0)
        return [f["answer"] for f in forks], [f.get_meta_info("answer") for f in forks]

    start = time.monotonic()
    state = branches.run(questions=list(questions), backend=RuntimeEndpoint(url))
    answers, metas = state.ret_value
    return {
        "wall_s": round(time.monotonic() - start, 2),
        "prompt_tokens": [m.get("prompt_tokens") for m in metas],
        "cached_tokens": [m.get("cached_tokens") for m in metas],
        "answers": answers,
    }
