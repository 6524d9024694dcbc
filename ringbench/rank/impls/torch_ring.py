"""``torch-ring``: torch's own templated ring attention (context parallelism), forward and backward.

It is a private API, pinned here: torch/distributed/tensor/experimental/_context_parallel/_attention.py (torch
2.13; 2.11 has the same) -- ``_templated_ring_attention``, ``_templated_ring_attention_backward`` (the parameters
passed by position: ``POSITIONAL``), ``_cp_options`` (its ``rotate_method``, ``enable_load_balance``,
``convert_to_f32``) and ``_RotateMethod`` (``ALL_TO_ALL``, ``ALL_GATHER``). A torch without them, or with other
signatures, gives one line (``missing``), never a traceback.

The ring rotates K/V with an all-to-all permutation or a single all-gather (``torch-ring:alltoall``,
``torch-ring:allgather``; plain ``torch-ring`` is torch's default, all-gather); the backward always rotates the
dK/dV accumulators with all-to-all. Its load-balanced causal layout (rank i holds chunks i and 2N-1-i of 2N) is
ringbench's ``zigzag``; without load balance the causal ring runs on ``contiguous`` shards (skipping masked
blocks); mask ``none`` needs load balance off. The ring order is the group's rank order.

Attention per block, each returning (out, logsumexp) as the ring needs: the CPU flash op
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward) on CPU; on CUDA, FlashAttention
(``aten._scaled_dot_product_flash_attention``) for fp16 / bf16 where it takes the head dim, and the memory-efficient op
otherwise -- fp32 above all, which flash refuses -- through ringbench's own wrappers (ringbench.kernels.torch_sdpa:
its lse padded to 32 rows and sliced back, ``out`` handed to the backward in the (B, M, H, K) memory it reads).
fp64 on CUDA has no fused op: refused in one line (``check``), so a sweep skips it.
"""

from __future__ import annotations

import contextlib

import torch

from ringbench.errors import UsageError
from ringbench.rank.impls.base import Adapter, AttentionFn, Support, world_group

MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"
PINNED = ("_templated_ring_attention", "_templated_ring_attention_backward", "_cp_options", "_RotateMethod")
# The parameters the calls below pass by position, in order (torch 2.11 and 2.13 alike); a signature without them
# would fail inside the run with a TypeError, so it is refused up front, in one line.
POSITIONAL = {
    "_templated_ring_attention": ("group", "seq_dim", "op", "query", "key", "value", "is_causal"),
    "_templated_ring_attention_backward": ("group", "seq_dim", "op", "grad_out", "grad_out_name", "query", "key",
                                           "value", "out", "logsumexp", "is_causal"),
}  # fmt: skip


def _signature_problems(module) -> list[str]:
    import inspect

    problems = []
    for name, expected in POSITIONAL.items():
        try:
            params = list(inspect.signature(getattr(module, name)).parameters.values())
        except (TypeError, ValueError):  # no signature to read: the call itself will tell
            continue
        names = tuple(p.name for p in params[: len(expected)])
        keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        if names != expected or not keywords:
            problems.append(f"{name}({', '.join(p.name for p in params)})")
    return problems


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
    changed = _signature_problems(module)
    if changed:
        return None, (f"torch {torch.__version__}'s private ring API lacks the signatures ringbench calls (has "
                      f"{'; '.join(changed)}; pinned to torch 2.13)")  # fmt: skip
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


def _flash_forward(query, key, value, *, is_causal, scale=None, **_):
    return torch.ops.aten._scaled_dot_product_flash_attention(
        query, key, value, dropout_p=0.0, is_causal=bool(is_causal), scale=scale
    )


def _flash_backward(*, grad_out, query, key, value, out, logsumexp, is_causal, scale=None, rest=(), **_):
    cum_q, cum_k, max_q, max_k, seed, offset = rest[:6]
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        grad_out, query, key, value, out, logsumexp, cum_q, cum_k, max_q, max_k, 0.0, bool(is_causal), seed, offset,
        scale=scale,
    )  # fmt: skip


def _efficient_forward(query, key, value, *, is_causal, scale=None, **_):
    from ringbench.kernels.torch_sdpa import efficient_forward

    out, lse = efficient_forward(query, key, value, None, bool(is_causal), scale)  # lse: (B, H, Lq), a view
    return out, lse.contiguous()


def _efficient_backward(*, grad_out, query, key, value, out, logsumexp, is_causal, scale=None, **_):
    from ringbench.kernels.torch_sdpa import efficient_backward

    return efficient_backward(grad_out, query, key, value, out, logsumexp, None, bool(is_causal), scale)


CUDA_OPS = {"flash": (_flash_forward, _flash_backward), "efficient": (_efficient_forward, _efficient_backward)}


def cuda_op(dtype: torch.dtype, head_dim: int, capability: tuple[int, int], *, flash_available: bool,
            flash_enabled: bool = True, efficient_enabled: bool = True) -> str:  # fmt: skip
    """The CUDA attention op for one dtype and head dim: 'flash', 'efficient', or 'none' (no fused op takes it).

    The ring calls its op on square blocks (causal: the diagonal) and on half-blocks against whole ones (not
    causal), so the choice for a FULL block is the choice for all of them."""
    from ringbench.kernels.base import MaskKind
    from ringbench.kernels.torch_sdpa import cuda_route

    route = cuda_route(MaskKind.FULL, dtype, 128, 128, head_dim, False, capability, flash_available=flash_available,
                       flash_enabled=flash_enabled, efficient_enabled=efficient_enabled)  # fmt: skip
    return route if route in CUDA_OPS else "none"


def _device_op(q: torch.Tensor) -> str:
    return cuda_op(q.dtype, q.shape[-1], torch.cuda.get_device_capability(q.device),
                   flash_available=torch.backends.cuda.is_flash_attention_available(),
                   flash_enabled=torch.backends.cuda.flash_sdp_enabled(),
                   efficient_enabled=torch.backends.cuda.mem_efficient_sdp_enabled())  # fmt: skip


class _TorchRing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, module, group, causal, rotate, load_balance, scale):
        op = _device_op(q) if q.device.type == "cuda" else "cpu"
        if op == "none":
            raise UsageError(f"impl='torch-ring' has no CUDA attention op for dtype {q.dtype} and head_dim "
                             f"{q.shape[-1]}")  # fmt: skip
        forward_op = CUDA_OPS[op][0] if op in CUDA_OPS else _cpu_forward
        with _options(module, rotate, load_balance):
            out, lse, *rest = module._templated_ring_attention(
                group, 2, forward_op, q, k, v, is_causal=causal, scale=scale
            )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.settings = (module, group, causal, rotate, load_balance, scale, tuple(rest), op)
        lse_out = lse.detach().float().clone()  # (B, H, L): exposed for `check`, no gradient through it
        ctx.mark_non_differentiable(lse_out)
        return out, lse_out

    @staticmethod
    def backward(ctx, dout, _dlse=None):
        q, k, v, out, lse = ctx.saved_tensors
        module, group, causal, rotate, load_balance, scale, rest, op = ctx.settings
        backward_op = CUDA_OPS[op][1] if op in CUDA_OPS else _cpu_backward
        extra = {"rest": rest} if op == "flash" else {}
        with _options(module, rotate, load_balance):
            dq, dk, dv, *_ = module._templated_ring_attention_backward(
                group, 2, backward_op, dout.contiguous(), "grad_out", q, k, v, out,
                lse, causal, scale=scale, **extra,
            )  # fmt: skip
        return dq, dk, dv, None, None, None, None, None, None


class TorchRingAdapter(Adapter):
    name = "torch-ring"
    requires = "torch 2.13 (its private context-parallel ring)"
    support = Support(
        layouts={"causal": ("zigzag", "contiguous"), "none": ("contiguous",)},
        dtypes=("float64", "float32", "bfloat16", "float16"),
        notes="ring order: the group's rank order only; causal zigzag = torch's load balancing; float64 on CPU only",
    )

    def __init__(self, rotate: str = "ALL_GATHER", name: str = "torch-ring") -> None:
        self.rotate = rotate
        self.name = name
        self.description = f"torch's templated ring attention, K/V rotated by {rotate.lower().replace('_', '-')}"

    def missing(self, device_type: str = "cpu") -> str | None:
        return _private()[1]

    def check(self, case, device_type: str) -> None:
        super().check(case, device_type)
        if device_type == "cuda" and case.dtype == "float64":  # flash and memory-efficient: 16/32-bit only
            raise UsageError(f"impl={self.name!r} does not support dtype='float64' on CUDA (its CUDA attention "
                             "ops take float32, bfloat16, float16)")  # fmt: skip

    def build(self, case, *, group, device, recorder) -> AttentionFn:
        module, _ = _private()
        process_group = world_group(group)
        causal = case.mask == "causal"
        load_balance = causal and case.layout == "zigzag"
        scale = case.head_dim**-0.5

        def call(q, k, v):  # (out, lse): run times out, check compares both
            return _TorchRing.apply(q, k, v, module, process_group, causal, self.rotate, load_balance, scale)

        return AttentionFn(call=call, info={"rotate": self.rotate, "load_balance": load_balance})


__all__ = ["TorchRingAdapter"]
