"""ORDER strings (``identity``, ``reverse``, ``stride:K``, ``random:SEED``, ``0-3-1-2``) for `--current`.

The project's parser is `ringbench.orders.parse_order`, which `ringbench run --order` uses; it is preferred whenever it
is importable so that ``--current random:7`` names the same ring as ``run --order random:7``. The private copy below
follows the same rules and only stands in while that module is absent. Either way a bad spec is a UsageError.
"""

from __future__ import annotations

import random

from ringbench.errors import UsageError, bad_value

ORDER_HELP = "identity, reverse, random:SEED, stride:K, or an explicit ring such as 0-3-1-2"


def _parse_order_private(spec: str, world: int, field: str = "order") -> list[int]:
    if not isinstance(spec, str) or not spec.strip():
        raise bad_value(field, spec, ORDER_HELP)
    spec = spec.strip()
    name, _, argument = spec.partition(":")
    if spec == "identity":
        return list(range(world))
    if spec == "reverse":
        return [0, *range(world - 1, 0, -1)]  # rank 0 keeps ring position 0; only the direction changes
    if name in ("random", "stride") and argument:
        try:
            value = int(argument)
        except ValueError:
            raise bad_value(field, spec, f"{name}:N with an integer N") from None
        if name == "random":
            ring = list(range(world))
            random.Random(value).shuffle(ring)
            return ring
        if value < 1:
            raise bad_value(field, spec, "stride:K with an integer K >= 1")
        return [rank for start in range(min(value, world)) for rank in range(start, world, value)]
    if "-" in spec or spec.isdigit():
        try:
            ring = [int(part) for part in spec.split("-")]
        except ValueError:
            raise bad_value(field, spec, ORDER_HELP) from None
        return validate_permutation(ring, world, field, spec)
    raise bad_value(field, spec, ORDER_HELP)


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
    """Ranks in ring order for ``spec`` on ``world`` ranks (the project's parser when present).

    Errors read ``current: order='0-1' is not a permutation ..``: the option's name, then the parser's line.
    """
    try:
        from ringbench.orders import parse_order as project_parse_order
    except ImportError:
        project_parse_order = _parse_order_private
    try:
        ring = project_parse_order(spec, world)
        return validate_permutation(ring, world, "order", spec)
    except (UsageError, TypeError, ValueError) as exc:
        raise UsageError(f"{field}: {exc}") from None
