"""``torch-ring``: torch's own templated ring attention (context parallelism), forward and backward.

It is a private API, pinned here: torch/distributed/tensor/experimental/_context_parallel/_attention.py (torch
2.13) -- ``_templated_ring_attention``, ``_templated_ring_attention_backward``, ``_cp_options`` (its
``rotate_method``, ``enable_load_balance``, ``convert_to_f32``) and ``_RotateMethod`` (``ALL_TO_ALL``,
``ALL_GATHER``). A torch without them gives one line (``missing``), never a traceback.

The ring rotates K/V with an all-to-all permutation or a single all-gather (``torch-ring:alltoall``,
``torch-ring:allgather``; plain ``torch-ring`` is torch's default, all-gather); the backward always rotates the
dK/dV accumulators with all-to-all. Its load-balanced causal layout (rank i holds chunks i and 2N-1-i of 2N) is
ringbench's ``zigzag``; without load balance the causal ring runs on ``contiguous`` shards (skipping masked
blocks); mask ``none`` needs load balance off. The ring order is the group's rank order.

Attention per block: the CPU flash op (``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward) on
CPU, ``aten._scaled_dot_product_flash_attention`` on CUDA, both returning (out, logsumexp) as the ring needs.
"""

from __future__ import annotations

import contextlib

import torch

from ringbench.rank.impls.base import Adapter, AttentionFn, Support, world_group

MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"
PINNED = ("_templated_ring_attention", "_templated_ring_attention_backward", "_cp_options", "_RotateMethod")


def _private():
    """The pinned private module, or a one-line reason why it is not usable."""
    import importlib

    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:
        return None, f"torch {torch.__version__} has no {MODULE} ({exc})"
    absent = [name for name in PINNED if not hasattr(module, name)]
    options = getattr(module, "_cp_options", None)
    absent += [f"_cp_options.{n}" for n in ("rotate_method", "enable_load_balance") if not hasattr(options, n)]
    methods = getattr(module, "_RotateMethod", None)
    absent += [f"_RotateMethod.{n}" for n in ("ALL_TO_ALL", "ALL_GATHER") if not hasattr(methods, n)]
    if absent:
        return None, f"torch {torch.__version__}'s private ring API lacks {', '.join(absent)} (pinned to torch 2.13)"
    return module, None


@contextlib.contextmanager
def _options(module, rotate: str, load_balance: bool):
    options = module._cp_options
    saved = (options.rotate_method, options.enable_load_balance)
    options.rotate_method = getattr(module._RotateMethod, rotate)
    options.enable_load_balance = load_balance
    try:
        yield
    finally:
        options.rotate_method, options.enable_load_balance = saved


def _cpu_forward(query, key, value, *, is_causal, scale=None, **_):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p=0.0, is_causal=bool(is_causal), scale=scale
    )


def _cpu_backward(*, grad_out, query, key, value, out, logsumexp, is_causal, scale=None, **_):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, logsumexp, 0.0, bool(is_causal), scale=scale
    )


def _cuda_forward(query, key, value, *, is_causal, scale=None, **_):
    return torch.ops.aten._scaled_dot_product_flash_attention(
        query, key, value, dropout_p=0.0, is_causal=bool(is_causal), scale=scale
    )


def _cuda_backward(*, grad_out, query, key, value, out, logsumexp, is_causal, scale=None, rest=(), **_):
    cum_q, cum_k, max_q, max_k, seed, offset = rest[:6]
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        grad_out,
        query,
        key,
        value,
        out,
        logsumexp,
        cum_q,
        cum_k,
        max_q,
        max_k,
        0.0,
        bool(is_causal),
        seed,
        offset,
        scale=scale,
    )


class _TorchRing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, module, group, causal, rotate, load_balance, scale):
        cuda = q.device.type == "cuda"
        with _options(module, rotate, load_balance):
            out, lse, *rest = module._templated_ring_attention(
                group, 2, _cuda_forward if cuda else _cpu_forward, q, k, v, is_causal=causal, scale=scale
            )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.settings = (module, group, causal, rotate, load_balance, scale, tuple(rest))
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        module, group, causal, rotate, load_balance, scale, rest = ctx.settings
        cuda = q.device.type == "cuda"
        extra = {"rest": rest} if cuda else {}
        with _options(module, rotate, load_balance):
            dq, dk, dv, *_ = module._templated_ring_attention_backward(
                group, 2, _cuda_backward if cuda else _cpu_backward, dout.contiguous(), "grad_out", q, k, v, out,
                lse, causal, scale=scale, **extra,
            )  # fmt: skip
        return dq, dk, dv, None, None, None, None, None, None


class TorchRingAdapter(Adapter):
    name = "torch-ring"
    requires = "torch 2.13 (its private context-parallel ring)"
    support = Support(
        layouts={"causal": ("zigzag", "contiguous"), "none": ("contiguous",)},
        dtypes=("float64", "float32", "bfloat16", "float16"),
        notes="ring order: the group's rank order only; causal zigzag = torch's load balancing",
    )

    def __init__(self, rotate: str = "ALL_GATHER", name: str = "torch-ring") -> None:
        self.rotate = rotate
        self.name = name
        self.description = f"torch's templated ring attention, K/V rotated by {rotate.lower().replace('_', '-')}"

    def missing(self, device_type: str = "cpu") -> str | None:
        return _private()[1]

    def build(self, workload, *, group, device, recorder) -> AttentionFn:
        module, _ = _private()
        process_group = world_group(group)
        causal = workload.mask == "causal"
        load_balance = causal and workload.layout == "zigzag"
        scale = workload.head_dim**-0.5

        def call(q, k, v):
            return _TorchRing.apply(q, k, v, module, process_group, causal, self.rotate, load_balance, scale)

        return AttentionFn(call=call, info={"rotate": self.rotate, "load_balance": load_balance})


__all__ = ["TorchRingAdapter"]
