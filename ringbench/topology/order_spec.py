"""ORDER strings (``identity``, ``reverse``, ``stride:K``, ``random:SEED``, ``0-3-1-2``) for `recommend --order`.

The parser is the project's `ringbench.orders.parse_order`, the one `ringbench run --order` uses, so that
``recommend --order random:7`` names the same ring as ``run --order random:7``. A bad spec is a UsageError.
"""

from __future__ import annotations

from ringbench.errors import UsageError
from ringbench.orders import ORDER_HELP
from ringbench.orders import parse_order as project_parse_order

__all__ = ["ORDER_HELP", "parse_order"]


def parse_order(spec: str, world: int, field: str = "order") -> list[int]:
    """Ranks in ring order for ``spec`` on ``world`` ranks.

    Errors read ``order: order='0-1' is not a permutation ..``: the option's name, then the parser's line.
    """
    try:
        return project_parse_order(spec, world)
    except (UsageError, TypeError, ValueError) as exc:
        raise UsageError(f"{field}: {exc}") from None
