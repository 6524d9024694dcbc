"""Layers inside a rank: each layer's mask rule on the sequence, and the float64 check of every layer (the layer
specs are ringbench/scenario/layers.py)."""

from __future__ import annotations

import math


def layer_rules(case) -> list:
    """The MaskRule of every layer of ``case`` (a ringbench.scenario.scenario.Case; ringbench.engine.masks)."""
    from ringbench.engine.masks import mask_rule

    return [mask_rule(mask, case.docs, case.seq) for mask in case.layer_masks]


def check_layers(rules, outs, grads, shard, device, budget_s: float, tick):
    """The float64 check of every layer (each distinct mask once: layers with one mask compute the same) of this
    rank's ``shard`` (ringbench.engine.inputs.ShardSpec), the worst errors over them, and the budget shared out."""
    from ringbench.engine.reference import TENSORS, CheckResult, check_errors

    first = {}
    for layer, rule in enumerate(rules):
        first.setdefault(rule, layer)
    results = []
    for rule, layer in first.items():
        layer_grads = grads[layer] if grads is not None else None
        results.append(check_errors(outs[layer].detach(), layer_grads, shard, rule, device=device,
                                    budget_s=budget_s / len(first), tick=tick))  # fmt: skip
    if len(results) == 1:
        return results[0]
    worst = min(results, key=lambda r: len(r.grads))  # the gradients every layer's check covered
    notes = sorted({r.note for r in results if r.note})

    def worst_of(values) -> float:  # NaN wins: a NaN anywhere fails the check
        values = list(values)
        return math.nan if any(math.isnan(x) for x in values) else max(values)

    per_tensor = {f"{name}_err": worst_of(r.errors()[name] for r in results) for name in TENSORS}
    return CheckResult(
        fwd_err=worst_of(r.fwd_err for r in results), bwd_err=worst_of(r.bwd_err for r in results),
        sampled=any(r.sampled for r in results), rows_checked=min(r.rows_checked for r in results),
        rows_total=worst.rows_total, grads=worst.grads, estimated_s=sum(r.estimated_s for r in results),
        note="; ".join(notes), **per_tensor,
    )  # fmt: skip


def nonfinite_tensors(outs, grads) -> str:
    """The tensors holding a NaN or an infinity on this rank, comma-joined ("out,dk"; "" when none): the check's
    errors are NaN then, which alone would read like a case never checked. ``outs``: a tensor or one per layer;
    ``grads``: (dq, dk, dv), one such triple per layer, or None."""
    import torch

    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    if grads is not None and len(grads) and isinstance(grads[0], torch.Tensor):
        grads = [grads]
    named = [("out", t) for t in outs if t is not None]
    for layer in grads or ():
        named += [(name, t) for name, t in zip(("dq", "dk", "dv"), layer, strict=False) if t is not None]
    bad = {name for name, tensor in named if not bool(torch.isfinite(tensor.detach()).all())}
    return ",".join(name for name in ("out", "dq", "dk", "dv") if name in bad)


__all__ = ["check_layers", "layer_rules", "nonfinite_tensors"]
