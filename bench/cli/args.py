"""What every `jenga-bench` subcommand parses the same way, and how it rejects bad input:
`BadInput` is one line on stderr and exit status 2 (bench/cli/main.py `main`)."""

from __future__ import annotations

import argparse
from typing import Any

EXIT_BAD_INPUT = 2


class BadInput(Exception):
    """User input the CLI rejects with one line and exit status 2."""


def checked(what: Any, *args: Any) -> Any:
    """Call `what`, turning ValueError / OSError (bad names, files, traces) into BadInput."""
    try:
        return what(*args)
    except (ValueError, OSError) as exc:
        raise BadInput(str(exc)) from None


def floats(text: str) -> list[float]:
    """Comma-separated numbers, at least one."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def names(text: str) -> list[str]:
    """Comma-separated names, blanks dropped."""
    return [x.strip() for x in text.split(",") if x.strip()]


def cost_pair(text: str) -> tuple[str, str]:
    """NAME=VALUE (a cost-model field and its value)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name.strip(), value.strip()


def host_size(text: str) -> str:
    """A host tier's size: GB (a number >= 0) or "Rx", R times the cache size."""
    number = text[:-1] if text.endswith("x") else text
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected GB or a multiple of --cache-gb such as 4x, got {text!r}"
        ) from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"a host tier's size must be >= 0, got {text!r}")
    return text
