"""Write the packs of documents the magi-h100-varlen table is priced with (one file per sequence length).

    python benchmarks/published/magi_varlen/make_packs.py

MagiAttention's distributed benchmark samples documents from a published length histogram
(exps/dist_attn/benchmark/datasets/default/doc_length_distribution.csv: 14 bins from [0, 10] to [131073, 196608]
tokens, with counts), packs them to the sequence length and splits any document longer than a quarter of the pack
(benchmark_conf.py: chunk_ratio 0.25). Here: a bin drawn by its count, a length uniform within it (numpy's PCG64,
seed 0), chunks of a quarter of the pack, packed in draw order until S tokens, the last one cut; one pack per S
(the source averages 20). Each file: one length per line (ringbench's ``docs: file:PATH``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

BINS = [(0, 10, 30254), (11, 50, 391188), (51, 100, 699596), (101, 200, 1377757), (201, 500, 3794735),
        (501, 1024, 3316785), (1025, 2048, 2106566), (2049, 4096, 988525), (4097, 8192, 410002),
        (8193, 16384, 173574), (16385, 32768, 115007), (32769, 65536, 18428), (65537, 131072, 22513),
        (131073, 196608, 18284)]  # fmt: skip
PER_RANK = 8192


def pack(seq: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    counts = np.array([b[2] for b in BINS], float)
    cap = seq // 4
    lengths: list[int] = []
    while sum(lengths) < seq:
        low, high, _ = BINS[rng.choice(len(BINS), p=counts / counts.sum())]
        length = int(rng.integers(max(low, 1), high + 1))
        while length > cap:
            lengths.append(cap)
            length -= cap
        lengths.append(length)
    excess = sum(lengths) - seq
    while excess > 0:  # cut the last documents to fill exactly S
        cut = min(excess, lengths[-1] - 1) if lengths[-1] > 1 else 0
        if cut == 0:
            excess -= lengths.pop()
            continue
        lengths[-1] -= cut
        excess -= cut
    return lengths


def main() -> None:
    here = Path(__file__).resolve().parent
    for world in (8, 16, 32, 64):
        seq = PER_RANK * world
        lengths = pack(seq)
        assert sum(lengths) == seq
        (here / f"pack_{world}.txt").write_text(
            f"# MagiAttention varlen pack, S = {seq} ({world} x 8K): {len(lengths)} documents (make_packs.py)\n"
            + "\n".join(map(str, lengths))
            + "\n"
        )


if __name__ == "__main__":
    main()
