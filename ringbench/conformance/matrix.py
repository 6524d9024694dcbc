"""The cases `ringbench check` runs: the default matrix of what an implementation declares, or the axes given.

The full matrix (``full_matrix``) crosses, within what the adapter supports here:
* worlds 1-8 (odd ones included);
* every mask it declares, in the variants that break rings: documents tiny (1-3 tokens) and one document
  spanning every rank; a window smaller than a shard (3), one just over a shard, one longer than S;
* every layout it declares with that mask;
* float32, bfloat16 and float16 (those it declares);
* heads: 4 query heads with 4 KV heads, and with 2 and 1 (grouped-query attention) where declared;
* shard lengths of 12 (a multiple of nothing a kernel blocks by but 4), 16, and 26 / 13 per zigzag chunk (odd),
  and, where uneven shards are declared, S = N x L + N // 2 + 1.
Rows that see no key of some rank's block while they see keys elsewhere occur in all of them: causal striped,
documents, and windows under any layout.

The default is a sample of it (``default_matrix``), drawn with a seed and said so: first the *ladder* -- one
(mask, layout) at worlds 1, 2, 3, 4, 8 with one global problem per dtype, which gives the CP-degree invariance
check and the error-against-world table -- then one case of every (mask variant, layout) the implementation
declares, then cases drawn at random from the rest, until ``budget`` cases. ``--full`` runs the whole matrix.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random

from ringbench.conformance.check_case import ConformanceCase

WORLDS = (1, 2, 3, 4, 5, 6, 7, 8)
LADDER_WORLDS = (1, 2, 3, 4, 8)
DTYPES = ("float32", "bfloat16", "float16")
HEADS = ((4, 4), (4, 2), (4, 1))  # (heads, kv_heads)
LOCAL = (12, 16, 26)  # tokens per rank
DEFAULT_BUDGET = 72


def mask_variants(masks: list[str], seq: int, local: int) -> list[tuple[str, str, str]]:
    """(mask, docs, purpose) for every declared mask family (``window`` stands for any window)."""
    tiny = _tiny_documents(seq)
    spanning = _spanning_document(seq)
    out = []
    for mask in masks:
        if mask in ("causal-document", "full-document"):
            out += [(mask, tiny, "tiny documents"), (mask, spanning, "one document across every rank")]
        elif mask == "window":
            out += [("window:3", "none", "window smaller than a shard"),
                    (f"window:{local + 2}", "none", "window just over a shard"),
                    (f"window:{2 * seq + 1}", "none", "window longer than S")]  # fmt: skip
        elif mask == "causal-document+window":
            out += [("causal-document+window:3", spanning, "window inside one long document"),
                    ("causal-document+window:5", tiny, "window across tiny documents")]  # fmt: skip
        else:
            out.append((mask, "none", ""))
    return out


@functools.lru_cache(maxsize=256)
def _tiny_documents(seq: int) -> str:
    """Documents of 1, 2 and 3 tokens, repeating, with a long one in the middle (lengths summing to seq)."""
    lengths, total, cycle = [], 0, itertools.cycle((1, 3, 2, 1, 2))
    middle_at = seq // 3
    while total < seq:
        length = seq // 3 if (total >= middle_at and not any(x > 3 for x in lengths)) else next(cycle)
        length = min(length, seq - total)
        lengths.append(length)
        total += length
    return "lengths:" + ",".join(map(str, lengths))


@functools.lru_cache(maxsize=256)
def _spanning_document(seq: int) -> str:
    """One document covering all but a few tokens at each end: it spans every rank under every layout."""
    head, tail = min(3, seq // 4), min(2, seq // 4)
    parts = [x for x in (head, seq - head - tail, tail) if x > 0]
    return "lengths:" + ",".join(map(str, parts))


def _seq_for(world: int, layout: str, local: int, uneven: bool, multiple: int = 1) -> int:
    """S for ``local`` tokens per rank; zigzag chunks of ``local`` / 2 (rounded up); runs of consecutive tokens a
    multiple of ``multiple`` where the implementation works in blocks."""
    if uneven:
        return world * local + world // 2 + 1
    if layout in ("zigzag", "doc-balanced"):
        chunk = -(-((local + 1) // 2) // multiple) * multiple
        return world * 2 * chunk
    return world * (-(-local // multiple) * multiple)


def _points(support) -> list[tuple]:
    """The full matrix as plain tuples (world, seq, heads, kv_heads, dtype, mask, docs, layout, purpose): cheap to
    count and sample; ``_case`` makes the chosen ones. The loops keep what ``support`` declares."""
    masks = list(support.layouts)
    heads = [h for h in HEADS if support.gqa or h[0] == h[1]]
    shapes = [(local, False) for local in LOCAL] + ([(13, True)] if support.uneven and support.multiple == 1 else [])
    points = []
    for world, dtype, (local, uneven), (h, kv) in itertools.product(WORLDS, DTYPES, shapes, heads):
        if dtype not in support.dtypes or (uneven and world == 1) or world < support.min_world:
            continue
        for layout_kind in ("even", "zigzag"):
            seq = _seq_for(
                world, "zigzag" if layout_kind == "zigzag" else "contiguous", local, uneven, support.multiple
            )
            for mask, docs, purpose in mask_variants(masks, seq, local):
                for layout in support.layouts_for(mask) or ():
                    paired = "zigzag" if layout in ("zigzag", "doc-balanced") else "even"
                    if paired != layout_kind or ((uneven or "document" not in mask) and layout == "doc-balanced"):
                        continue
                    points.append((world, seq, h, kv if kv != h else 0, dtype, mask, docs, layout,
                                   purpose + (" uneven shards" if uneven else "")))  # fmt: skip
    return points


def _case(point: tuple, backward: bool = True) -> ConformanceCase:
    world, seq, heads, kv_heads, dtype, mask, docs, layout, purpose = point
    return ConformanceCase.of(world=world, seq=seq, heads=heads, kv_heads=kv_heads, dtype=dtype, mask=mask, docs=docs,
                              layout=layout, purpose=purpose, backward=backward)  # fmt: skip


def full_matrix(support, device_type: str = "cpu") -> list[ConformanceCase]:
    """Every case of the matrix the adapter's ``support`` (ringbench.rank.impls.base.Support) allows here."""
    cases = [_case(point, support.backward) for point in _points(support)]
    return [case for case in cases if not support.problems(case, device_type)]


def ladder(support, device_type: str = "cpu") -> list[ConformanceCase]:
    """One global problem per dtype at worlds 1, 2, 3, 4, 8: causal (else the first declared mask) on zigzag
    (else the first layout); S a multiple of 2N for each N."""
    mask = "causal" if "causal" in support.layouts else next(iter(support.layouts), None)
    if mask is None or mask_variants([mask], 48, 12)[0][1] != "none":
        mask = next((m for m in support.layouts if m in ("none", "causal", "causal-naive")), None)
    if mask is None:
        return []
    layouts = support.layouts_for(mask)
    layout = "zigzag" if "zigzag" in layouts else layouts[0]
    seq = 96  # a multiple of 2N for every ladder world (zigzag's chunks): 2 * lcm(1, 2, 3, 4, 8) = 48, twice
    if support.multiple > 1:  # runs of whole blocks at every ladder world: S = 2 x 24 x multiple
        seq = 48 * support.multiple
    out = []
    for dtype in DTYPES:
        if dtype not in support.dtypes:
            continue
        for world in LADDER_WORLDS:
            case = ConformanceCase.of(world=world, seq=seq, heads=4, dtype=dtype, mask=mask, layout=layout,
                                      purpose="ladder", backward=support.backward)  # fmt: skip
            if not support.problems(case, device_type):
                out.append(case)
    return out


def default_matrix(support, device_type: str = "cpu", *, seed: int = 0, budget: int = DEFAULT_BUDGET,
                   full: bool = False) -> tuple[list[ConformanceCase], int]:  # fmt: skip
    """(cases, size of the full matrix): the ladder, one case per (mask variant, layout), then a seeded sample."""
    chosen = ladder(support, device_type)
    points = _points(support)
    total = len(points) + len(chosen)
    if full:
        return sorted(chosen + full_matrix(support, device_type), key=lambda c: c.world), total
    rng = random.Random(seed)
    rng.shuffle(points)
    picked: list[tuple] = []
    taken: set[int] = set()

    def take(index: int) -> None:
        taken.add(index)
        picked.append(points[index])

    covered: set = set()
    for index, point in enumerate(points):  # one of every variant x layout, at a random world, dtype, shape
        key = (point[8].replace(" uneven shards", ""), point[5].split(":")[0], point[7])
        if key not in covered:
            covered.add(key)
            take(index)
    features = (lambda p: p[3] != 0, lambda p: "uneven" in p[8], lambda p: p[0] in (5, 7), lambda p: p[4] == "float16")
    for feature in features:  # grouped-query attention, uneven shards, odd worlds, fp16: a few of each
        for index in [i for i, p in enumerate(points) if i not in taken and feature(p)][:3]:
            take(index)
    for index in range(len(points)):
        if len(chosen) + len(picked) >= budget:
            break
        if index not in taken:
            take(index)
    cases = [_case(point, support.backward) for point in picked]
    cases = [case for case in cases if not support.problems(case, device_type)]
    return sorted(chosen + cases, key=lambda c: c.world), total


def cases_from_axes(axes: dict, support, device_type: str = "cpu") -> tuple[list[ConformanceCase], list[str]]:
    """The cartesian product of the axes given on the command line (defaults for the others); (cases, one line per
    combination the implementation does not support, skipped)."""
    worlds = axes.get("world") or [4]
    seqs = axes.get("seq") or [None]
    heads = axes.get("heads") or [4]
    kv_heads = axes.get("kv_heads") or [0]
    head_dims = axes.get("head_dim") or [16]
    batches = axes.get("batch") or [1]
    dtypes = axes.get("dtype") or ["float32"]
    masks = axes.get("mask") or ["causal"]
    docs_list = axes.get("docs") or ["none"]
    layouts = axes.get("layout") or ["contiguous"]
    cases, skipped = [], []
    for world, seq, h, kv, dim, batch, dtype, mask, docs, layout in itertools.product(
        worlds, seqs, heads, kv_heads, head_dims, batches, dtypes, masks, docs_list, layouts
    ):
        if seq is None:  # one S for every world given: the same global problem at each CP degree
            seq = _common_seq(worlds, layout)
        documented = "document" in mask
        if documented and docs == "none":
            docs = _tiny_documents(seq)
        case = ConformanceCase.of(world=world, seq=seq, heads=h, kv_heads=kv if kv != h else 0, head_dim=dim,
                                  batch=batch, dtype=_dtype(dtype), mask=mask, docs=docs if documented else "none",
                                  layout=layout, backward=support.backward)  # fmt: skip
        problems = support.problems(case, device_type)
        if problems:
            skipped.append(f"{case.case_id}: not supported ({'; '.join(problems)})")
        elif case not in cases:
            cases.append(case)
    return sorted(_ladders(cases), key=lambda c: c.world), skipped


def _common_seq(worlds: list[int], layout: str) -> int:
    """The smallest S of at least 16 tokens per rank of the largest world that every world's layout divides."""
    parts = [2 * w if layout in ("zigzag", "doc-balanced") else w for w in worlds]
    step = math.lcm(*parts)
    return step * math.ceil(16 * max(worlds) / step)


def _ladders(cases: list[ConformanceCase]) -> list[ConformanceCase]:
    """Cases of one global problem at several CP degrees are a ladder: the invariance check and the error
    against world size read them."""
    key = lambda c: (c.seq, c.heads, c.key_value_heads, c.head_dim, c.batch, c.dtype, c.mask, c.docs, c.layout)  # noqa: E731
    worlds: dict[tuple, set[int]] = {}
    for case in cases:
        worlds.setdefault(key(case), set()).add(case.world)
    return [dataclasses.replace(c, purpose="ladder") if len(worlds[key(c)]) > 1 else c for c in cases]


_DTYPE_ALIASES = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _dtype(name: str) -> str:
    return _DTYPE_ALIASES.get(name, name)


def sample_note(cases: list[ConformanceCase], total: int, seed: int, full: bool) -> str:
    if full or len(cases) >= total:
        return f"the whole matrix: {len(cases)} cases"
    return (f"a sample of {len(cases)} of the {total} cases of the matrix, drawn with seed {seed} (the ladder, one "
            "case of every mask variant and layout, then at random); --full runs all of them")  # fmt: skip


__all__ = ["DEFAULT_BUDGET", "cases_from_axes", "default_matrix", "full_matrix", "ladder", "sample_note"]
