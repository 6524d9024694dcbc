"""The built-in adapters besides ``torch-ring``: ringbench's own engine, the optional peers, a user's function.

Peers are optional (``pip install ringbench[peers]``), imported only when used; one that is absent, or needs
CUDA on a machine without it, gives one line saying so (``missing``).

* ``ringbench``: ringbench.engine.api.ring_attention with the case's mask, layout, buffer, order and kernel.
* ``ring-attention-pytorch`` (lucidrains): ``ring_flash_attn(q, k, v, causal=..., ring_reduce_col=True,
  striped_ring_attn=...)``, tensors (B, L, H, D); contiguous or striped shards; one bucket per rank (its striped
  mask is exact only then); the default process group only (it caches rank and world size per process).
* ``ring-flash-attn`` (zhuzilin): ``ring_flash_attn_func`` (contiguous), ``zigzag_ring_flash_attn_func``
  (zigzag, causal), ``stripe_flash_attn_func`` (striped, causal); (B, L, H, D); CUDA, bf16 (flash-attn; its
  backward rounds dq through bf16, so fp16 would be held to a tolerance it cannot meet).
* ``transformer-engine``: ``DotProductAttention`` with context parallelism over the group (``cp_comm_type``
  "p2p", the ring); qkv_format "bshd"; its load-balanced causal layout is zigzag; CUDA, fp16 / bf16.
* ``module:function``: a user's ring, called as ``function(q, k, v, *, mask, layout, group)`` with this rank's
  (B, H, S/N, D) shards in ringbench's layout and returning this rank's (B, H, S/N, D) output, differentiable
  (autograd). Optional attributes on the function: ``ringbench_layouts`` (a tuple of layout names it accepts;
  default all three) and ``ringbench_masks`` (default none and causal).
"""

from __future__ import annotations

import importlib

import torch

from ringbench.errors import UsageError
from ringbench.rank.impls.base import Adapter, AttentionFn, Support, flash_layout, world_group

ALL_LAYOUTS = ("contiguous", "zigzag", "striped")
RING_FLASH_FUNCTIONS = {"contiguous": "ring_flash_attn_func", "zigzag": "zigzag_ring_flash_attn_func",
                        "striped": "stripe_flash_attn_func"}  # fmt: skip


class RingbenchAdapter(Adapter):
    name = "ringbench"
    description = "ringbench's own ring engine (ringbench.engine.api.ring_attention)"
    support = Support(layouts={m: ALL_LAYOUTS for m in ("none", "causal", "causal-naive")}, orders=("*",))

    def build(self, case, *, group, device, recorder) -> AttentionFn:
        from ringbench.engine.api import ring_attention

        options = dict(mask=case.mask, layout=case.layout, buffer=case.buffer, order=case.order, kernel=case.kernel,
                       group=group, recorder=recorder)  # fmt: skip
        return AttentionFn(call=lambda q, k, v: ring_attention(q, k, v, **options))


def _installed(module: str, package: str) -> str | None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"{package} is not installed ({exc.__class__.__name__}: {exc}); pip install ringbench[peers]"
    return None


class RingAttentionPytorchAdapter(Adapter):
    name = "ring-attention-pytorch"
    description = "lucidrains' ring-attention-pytorch (ring_flash_attn, P2P ring with a barrier per pass)"
    requires = "pip install ring-attention-pytorch"
    support = Support(layouts={"causal": ("contiguous", "striped"), "none": ("contiguous", "striped")},
                      dtypes=("float32",), notes="default process group only; fp32 (its -finfo.max fill overflows fp64 "
                      "buffers made in fp32)")  # fmt: skip
    compute_patterns = (r"^aten::einsum$",)  # it computes attention with einsums, bucket by bucket

    def missing(self, device_type: str = "cpu") -> str | None:
        return _installed("ring_attention_pytorch", "ring-attention-pytorch")

    def check(self, case, device_type: str) -> None:
        super().check(case, device_type)
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() != case.world:
            raise UsageError(f"impl={self.name!r} runs on the default process group only (world {case.world})")

    def build(self, case, *, group, device, recorder) -> AttentionFn:
        from ring_attention_pytorch import ring_flash_attn

        striped = case.layout == "striped"
        local = case.seq // case.world

        def call(q, k, v):
            out = ring_flash_attn(flash_layout(q), flash_layout(k), flash_layout(v), causal=case.mask == "causal",
                                  bucket_size=local, ring_reduce_col=case.world > 1, striped_ring_attn=striped,
                                  ring_size=case.world)  # fmt: skip
            return flash_layout(out)  # (B, L, H, D) -> (B, H, L, D)

        return AttentionFn(call=call)


class RingFlashAttnAdapter(Adapter):
    name = "ring-flash-attn"
    description = "zhuzilin's ring-flash-attention (flash-attn kernels, P2P ring with double buffering)"
    requires = "pip install ring-flash-attn flash-attn (CUDA)"
    # Upstream's zigzag and stripe functions assert causal=True: mask none runs on contiguous shards only. Its
    # backward accumulates dq through bf16 buffers whatever the input dtype, so fp16 gradients would carry bf16's
    # rounding and fail fp16's tolerance by construction: bf16 only.
    support = Support(layouts={"causal": ALL_LAYOUTS, "none": ("contiguous",)}, dtypes=("bfloat16",),
                      devices=("cuda",), notes="bf16 only: upstream's backward rounds dq through bf16; zigzag and "
                      "striped shards need mask causal (upstream asserts it)")  # fmt: skip

    def missing(self, device_type: str = "cpu") -> str | None:
        if device_type != "cuda" or not torch.cuda.is_available():
            return "ring-flash-attn runs on CUDA only (flash-attn kernels); this machine has no CUDA device"
        return _installed("ring_flash_attn", "ring-flash-attn")

    def build(self, case, *, group, device, recorder) -> AttentionFn:
        module = importlib.import_module("ring_flash_attn")
        function = getattr(module, RING_FLASH_FUNCTIONS[case.layout])
        causal = case.mask == "causal"

        def call(q, k, v):
            out = function(flash_layout(q), flash_layout(k), flash_layout(v), causal=causal, group=group)
            return flash_layout(out)

        return AttentionFn(call=call)


class TransformerEngineAdapter(Adapter):
    name = "transformer-engine"
    description = "NVIDIA TransformerEngine DotProductAttention with context parallelism (p2p ring)"
    requires = "pip install transformer-engine[pytorch] (CUDA)"
    support = Support(layouts={"causal": ("zigzag",), "none": ("zigzag", "contiguous")},
                      dtypes=("bfloat16", "float16"), devices=("cuda",))  # fmt: skip

    def missing(self, device_type: str = "cpu") -> str | None:
        if device_type != "cuda" or not torch.cuda.is_available():
            return "transformer-engine runs on CUDA only; this machine has no CUDA device"
        return _installed("transformer_engine.pytorch", "transformer-engine")

    def build(self, case, *, group, device, recorder) -> AttentionFn:
        import torch.distributed as dist
        import transformer_engine.pytorch as te

        process_group = world_group(group)
        stream = torch.cuda.Stream()
        attention = te.DotProductAttention(
            num_attention_heads=case.heads, kv_channels=case.head_dim, qkv_format="bshd",
            attn_mask_type="causal" if case.mask == "causal" else "no_mask", cp_group=process_group,
            cp_global_ranks=dist.get_process_group_ranks(process_group), cp_stream=stream, cp_comm_type="p2p",
        )  # fmt: skip

        def call(q, k, v):
            out = attention(flash_layout(q), flash_layout(k), flash_layout(v))  # (B, L, H * D)
            batch, local = q.shape[0], q.shape[2]
            return out.view(batch, local, case.heads, case.head_dim).transpose(1, 2)

        return AttentionFn(call=call)


class UserAdapter(Adapter):
    """``module:function`` (see the module doc for the signature)."""

    def __init__(self, spec: str) -> None:
        self.name = spec
        self.description = f"user implementation {spec}"
        self.requires = "an importable module"
        self._function = None
        module, _, function = spec.partition(":")
        self._module, self._attribute = module, function
        self.support = Support(layouts=dict.fromkeys(("none", "causal"), ALL_LAYOUTS), orders=("*",))

    def _load(self):
        if self._function is None:
            try:
                module = importlib.import_module(self._module)
            except ImportError as exc:
                raise UsageError(f"impl={self.name!r}: cannot import {self._module!r} ({exc})") from None
            function = getattr(module, self._attribute, None)
            if not callable(function):
                raise UsageError(f"impl={self.name!r}: {self._module!r} has no function {self._attribute!r}")
            self._function = function
            masks = tuple(getattr(function, "ringbench_masks", ("none", "causal")))
            layouts = tuple(getattr(function, "ringbench_layouts", ALL_LAYOUTS))
            self.compute_patterns = tuple(getattr(function, "ringbench_compute_patterns", ()))
            self.support = Support(layouts=dict.fromkeys(masks, layouts), orders=("*",))
        return self._function

    def missing(self, device_type: str = "cpu") -> str | None:
        try:
            self._load()
        except UsageError as exc:
            return str(exc)
        return None

    def build(self, case, *, group, device, recorder) -> AttentionFn:
        function = self._load()
        return AttentionFn(call=lambda q, k, v: function(q, k, v, mask=case.mask, layout=case.layout,
                                                         group=group))  # fmt: skip


__all__ = ["RingAttentionPytorchAdapter", "RingFlashAttnAdapter", "RingbenchAdapter", "TransformerEngineAdapter",
           "UserAdapter"]  # fmt: skip
