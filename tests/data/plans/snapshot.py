"""Digest of every pair's mask plan, per (mask, layout, seq, world): tests/test_mask_plans.py holds the plans of the
original three masks to the digests stored in legacy.json (made by this script before the document and window
masks existed: ``python tests/data/plans/snapshot.py > tests/data/plans/legacy.json``)."""

from __future__ import annotations

import hashlib
import json
import sys

import torch

LEGACY_MASKS = ("none", "causal", "causal-naive")
LAYOUTS = ("contiguous", "zigzag", "striped")
WORLDS = (1, 2, 3, 4, 5, 6, 7, 8)
SEQ_PER_RANK = (4, 6, 16)


def plan_text(plan) -> str:
    """The sub-blocks of one pair plan as text: rows, columns, kind and (PARTIAL) the visible pattern."""
    parts = []
    for b in plan.blocks:
        mask = b.mask
        pattern = ""
        if mask.kind.value == "partial":
            allowed = mask.allowed if mask.allowed is not None else None
            if allowed is None:  # a positional rule: the pattern it stands for
                from ringbench.kernels.base import MaskTensors

                allowed = MaskTensors().allowed(mask, torch.device("cpu"))
            pattern = hashlib.sha256(allowed.to(torch.uint8).numpy().tobytes()).hexdigest()[:16]
        parts.append(
            f"{b.q_lo}:{b.q_hi}x{b.k_lo}:{b.k_hi}/{mask.kind.value}/{pattern}/{b.work_pairs():.6g}/{b.visible_pairs():.6g}"
        )
    return ";".join(parts)


def digests() -> dict[str, str]:
    from ringbench.engine.plan import pair_plan
    from ringbench.vocab import Layout, Mask

    out = {}
    for mask in LEGACY_MASKS:
        for layout in LAYOUTS:
            for world in WORLDS:
                for per_rank in SEQ_PER_RANK:
                    seq = per_rank * world
                    if layout == "zigzag" and seq % (2 * world):
                        continue
                    text = "|".join(
                        plan_text(pair_plan(Mask(mask), Layout(layout), seq, world, q, k))
                        for q in range(world)
                        for k in range(world)
                    )
                    out[f"{mask}/{layout}/{seq}/{world}"] = hashlib.sha256(text.encode()).hexdigest()
    return out


if __name__ == "__main__":
    json.dump(digests(), sys.stdout, indent=0, sort_keys=True)
    sys.stdout.write("\n")
