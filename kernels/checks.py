"""Host-side argument checks shared by the kernels in this folder.

Every launcher validates shapes, dtypes, devices and index ranges here *before* a launch, so a
bad argument raises a ``ValueError`` naming the field and sizes instead of writing out of bounds.
Index checks read the index tensors on the host (one small device-to-host copy per launch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def require(ok: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``ok``."""
    if not ok:
        raise ValueError(message)


def check_shape(name: str, t: torch.Tensor, expected: Sequence[int]) -> None:
    """``t`` must have exactly the shape ``expected``."""
    require(
        tuple(t.shape) == tuple(expected),
        f"{name}: expected shape {tuple(expected)}, got {tuple(t.shape)}",
    )


def check_state_blocks(name: str, t: torch.Tensor) -> None:
    """Each (n, heads, rows, cols) entry's (rows, cols) block must be contiguous (any slot and
    head strides, as a pool view has): the capture kernels compile the tile offsets in."""
    rows, cols = t.shape[-2], t.shape[-1]
    ok = (t.stride(-1) == 1 or cols == 1) and (t.stride(-2) == cols or rows == 1)
    require(ok, f"{name}: each head's ({rows}, {cols}) state must be contiguous: {t.stride()}")


def check_float(name: str, t: torch.Tensor) -> None:
    """``t`` must be a floating-point tensor (fp32, fp16 or bf16)."""
    import torch

    allowed = (torch.float32, torch.float16, torch.bfloat16)
    require(t.dtype in allowed, f"{name}: dtype {t.dtype} is not one of fp32/fp16/bf16")


def check_same_device(tensors: dict[str, torch.Tensor]) -> None:
    """All tensors must live on one device."""
    devices = {name: str(t.device) for name, t in tensors.items()}
    require(len(set(devices.values())) <= 1, f"tensors on different devices: {devices}")


def index_list(name: str, t: torch.Tensor, n: int) -> list[int]:
    """A 1-D integer tensor of length ``n``, returned as a host list."""
    import torch

    require(t.dim() == 1, f"{name}: expected a 1-D tensor, got shape {tuple(t.shape)}")
    require(t.numel() == n, f"{name}: expected {n} entries, got {t.numel()}")
    require(
        t.dtype in (torch.int32, torch.int64),
        f"{name}: expected an int32/int64 tensor, got {t.dtype}",
    )
    return [int(v) for v in t.tolist()]


def check_range(
    name: str, values: Sequence[int], low: int, high: int, allow: Sequence[int] = ()
) -> None:
    """Every value must satisfy ``low <= v < high`` (or be one of ``allow``)."""
    bad = [(i, v) for i, v in enumerate(values) if v not in allow and not low <= v < high]
    if bad:
        i, v = bad[0]
        raise ValueError(
            f"{name}[{i}] = {v} is out of range [{low}, {high})"
            + (f" (allowed sentinels: {list(allow)})" if allow else "")
            + (f"; {len(bad)} bad entries in all" if len(bad) > 1 else "")
        )


def check_unique(name: str, values: Sequence[int], ignore: Sequence[int] = ()) -> None:
    """No value may repeat (two programs writing one slot would race)."""
    seen: dict[int, int] = {}
    for i, v in enumerate(values):
        if v in ignore:
            continue
        require(v not in seen, f"{name}: entries {seen.get(v)} and {i} both name slot {v}")
        seen[v] = i
