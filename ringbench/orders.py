"""Ring orderings: which rank neighbours which. The ordering changes the links used, never the result.

Specs: ``identity``, ``reverse``, ``random:SEED``, ``stride:K`` (0, K, 2K, .., 1, 1+K, ..: deliberately
topology-hostile), or an explicit ring such as ``0-3-1-2``.
"""

from __future__ import annotations

import random

from ringbench.errors import UsageError, bad_value
from ringbench.fmt import ring_text

ORDER_HELP = "identity, reverse, random:SEED, stride:K, or an explicit ring such as 0-3-1-2"


def parse_order(spec: str, world: int, field: str = "order") -> list[int]:
    """The ranks in ring order (ring position p -> rank) for ``spec`` on ``world`` ranks."""
    if not isinstance(spec, str) or not spec:
        raise bad_value(field, spec, ORDER_HELP)
    spec = spec.strip()
    name, _, arg = spec.partition(":")
    if spec == "identity":
        return list(range(world))
    if spec == "reverse":
        # Rank 0 stays at ring position 0 so that only the direction changes.
        return [0, *range(world - 1, 0, -1)]
    if name == "random" and arg:
        try:
            seed = int(arg)
        except ValueError:
            raise bad_value(field, spec, "random:SEED with an integer SEED") from None
        ring = list(range(world))
        random.Random(seed).shuffle(ring)
        return ring
    if name == "stride" and arg:
        try:
            stride = int(arg)
        except ValueError:
            raise bad_value(field, spec, "stride:K with an integer K >= 1") from None
        if stride < 1:
            raise bad_value(field, spec, "stride:K with an integer K >= 1")
        ring = _stride_ring(stride, world)
        if world > 1 and ring in (list(range(world)), parse_order("reverse", world)):
            allowed = [k for k in range(2, world) if _stride_ring(k, world) not in (
                list(range(world)), parse_order("reverse", world))]  # fmt: skip
            what = "identity" if ring == list(range(world)) else "reverse"
            hint = f"K in {', '.join(map(str, allowed))}" if allowed else "no stride: use identity or reverse"
            raise UsageError(
                f"{field}={spec!r} is not allowed on {world} ranks: it is the {what} ring; expected {hint}"
            )
        return ring
    if "-" in spec or spec.isdigit():
        try:
            ring = [int(part) for part in spec.split("-")]
        except ValueError:
            raise bad_value(field, spec, ORDER_HELP) from None
        return validate_ring(ring, world, field, shown=spec)
    raise bad_value(field, spec, ORDER_HELP)


def _stride_ring(stride: int, world: int) -> list[int]:
    """0, K, 2K, .., then 1, 1+K, ..: every K-th rank first (topology-hostile on hosts of consecutive ranks)."""
    return [rank for start in range(min(stride, world)) for rank in range(start, world, stride)]


def validate_ring(ring: object, world: int, field: str = "order", shown: object = None) -> list[int]:
    """``ring`` as a list of ints if it is a permutation of 0..world-1 (the project's one check), else UsageError."""
    try:
        ranks = [int(rank) for rank in ring]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise bad_value(field, ring, "a list of ranks") from None
    if sorted(ranks) != list(range(world)):
        shown = ranks if shown is None else shown
        raise UsageError(f"{field}={shown!r} is not a permutation of ranks 0..{world - 1}; give each rank once")
    return ranks


def format_ring(ring: list[int]) -> str:
    return ring_text(ring)


# -- placements: which ranks form the groups of a grouped strategy (hybrid, double ring) --------------------------
PLACEMENT_HELP = (
    "heads-first (groups of consecutive ranks), interleaved (group g holds g, g+G, g+2G, .. for G groups), or an "
    "ORDER spec read as ranks cut into consecutive groups (0-2-4-6-1-3-5-7, stride:K, random:SEED)"
)
PLACEMENTS = ("heads-first", "interleaved")


def ring_of(order: str, placement: str, world: int, strategy: str) -> list[int]:
    """Ranks in ring order; for a grouped strategy given a placement, in placement order (its groups are
    consecutive runs). The one rule for a run's case and a simulated one."""
    if placement:
        from ringbench.vocab import Strategy

        return parse_placement(placement, world, Strategy.parse(strategy).group_size(world))
    return parse_order(order, world)


def parse_placement(spec: str, world: int, group_size: int, field: str = "placement") -> list[int]:
    """The ranks in placement order: consecutive runs of ``group_size`` ranks form the groups (group 0 first).

    ``heads-first``: Ulysses groups (or inner rings) of consecutive ranks, i.e. inside a host when ranks are
    numbered host by host (USP's "ulysses low"); ``interleaved``: each group takes every G-th rank, so the ring
    across groups stays inside a host instead. Within a group the placement's order is the inner ring's order;
    across groups, the ring visits groups in placement order.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise bad_value(field, spec, PLACEMENT_HELP)
    spec = spec.strip()
    if spec == "heads-first":
        return list(range(world))
    if spec == "interleaved":
        groups = world // max(group_size, 1)
        return [g + j * groups for g in range(groups) for j in range(group_size)]
    try:
        return parse_order(spec, world, field)
    except UsageError as exc:
        if "not a permutation" in str(exc):
            raise
        raise bad_value(field, spec, PLACEMENT_HELP) from None
