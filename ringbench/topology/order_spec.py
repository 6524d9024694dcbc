"""ORDER strings (``identity``, ``reverse``, ``stride:K``, ``random:SEED``, ``0-3-1-2``) for `--current`.

The parser is the project's `ringbench.orders.parse_order`, the one `ringbench run --order` uses, so that
``--current random:7`` names the same ring as ``run --order random:7``. A bad spec is a UsageError.
"""

from __future__ import annotations

from ringbench.errors import UsageError, bad_value
from ringbench.orders import ORDER_HELP
from ringbench.orders import parse_order as project_parse_order

__all__ = ["ORDER_HELP", "parse_order", "validate_permutation"]


def validate_permutation(ring: object, world: int, field: str = "order", shown: object = None) -> list[int]:
    """``ring`` as a list of ints if it is a permutation of 0..world-1, else UsageError naming ``field``."""
    try:
        ranks = [int(rank) for rank in ring]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise bad_value(field, ring, "a list of ranks") from None
    if sorted(ranks) != list(range(world)):
        shown = ring if shown is None else shown
        raise UsageError(f"{field}={shown!r} is not a permutation of ranks 0..{world - 1}; give each rank once")
    return ranks


def parse_order(spec: str, world: int, field: str = "current") -> list[int]:
    """Ranks in ring order for ``spec`` on ``world`` ranks.

    Errors read ``current: order='0-1' is not a permutation ..``: the option's name, then the parser's line.
    """
    try:
        return project_parse_order(spec, world)
    except (UsageError, TypeError, ValueError) as exc:
        raise UsageError(f"{field}: {exc}") from None
