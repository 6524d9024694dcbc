"""The built-in adapters besides ``torch-ring``: ringbench's own engine, the optional peers, a user's function.

Peers are optional (``pip install ringbench[peers]``), imported only when used; one that is absent, or needs
CUDA on a machine without it, gives one line saying so (``missing``).

* ``ringbench``: ringbench.engine.api.ring_attention with the case's mask, layout, buffer, order and kernel; K and V
  of the case's KV heads (grouped-query attention); returns (out, lse).
* ``ring-attention-pytorch`` (lucidrains): ``ring_flash_attn(q, k, v, causal=..., ring_reduce_col=True,
  striped_ring_attn=...)``, tensors (B, L, H, D); contiguous or striped shards; one bucket per rank (its striped
  mask is exact only then); the default process group only (it caches rank and world size per process).
* ``ring-flash-attn`` (zhuzilin): ``ring_flash_attn_func`` (contiguous), ``zigzag_ring_flash_attn_func``
  (zigzag, causal), ``stripe_flash_attn_func`` (striped, causal); (B, L, H, D); CUDA, bf16 (flash-attn; its
  backward rounds dq through bf16, so fp16 would be held to a tolerance it cannot meet).
* ``transformer-engine``: ``DotProductAttention`` with context parallelism over the group (``cp_comm_type``
  "p2p", the ring); qkv_format "bshd"; its load-balanced causal layout is zigzag; CUDA, fp16 / bf16.
* ``module:function``: a user's ring, called as ``function(q, k, v, *, mask, layout, group, **what_it_takes)``
  with this rank's (B, H, S/N, D) shards in ringbench's layout (K, V: KV heads) and returning this rank's
  (B, H, S/N, D) output, or (out, lse) with lse (B, H, S/N), differentiable (autograd). Besides mask, layout and
  group it receives whichever of USER_KEYWORDS its signature names (all of them with ``**kwargs``): what every
  mask needs. Optional attributes on the function declare what it supports (USER_DECLARATIONS); the defaults are
  masks none and causal, the three layouts, every dtype, no GQA, even shards. docs/implementations.md has the
  worked example.
"""

from __future__ import annotations

import importlib
import inspect
import itertools

import torch

from ringbench.errors import UsageError
from ringbench.rank.impls.base import Adapter, AttentionFn, Support, flash_layout, world_group

ALL_LAYOUTS = ("contiguous", "zigzag", "striped")
RING_FLASH_FUNCTIONS = {"contiguous": "ring_flash_attn_func", "zigzag": "zigzag_ring_flash_attn_func",
                        "striped": "stripe_flash_attn_func"}  # fmt: skip


DOCUMENT_MASKS = ("causal-document", "full-document", "causal-document+window")


class RingbenchAdapter(Adapter):
    name = "ringbench"
    description = "ringbench's own ring engine (ringbench.engine.api.ring_attention)"
    support = Support(layouts={m: ALL_LAYOUTS for m in ("none", "causal", "causal-naive", "window")}
                      | dict.fromkeys(DOCUMENT_MASKS, (*ALL_LAYOUTS, "doc-balanced")), orders=("*",),
                      gqa=True)  # fmt: skip

    def build(self, case, *, group, device, recorder) -> AttentionFn:
        from ringbench.engine.api import ring_attention

        options = dict(mask=case.mask, layout=case.layout, buffer=case.buffer, order=case.order, kernel=case.kernel,
                       group=group, recorder=recorder, docs=case.docs, return_lse=True)  # fmt: skip
        return AttentionFn(call=lambda q, k, v: ring_attention(q, k, v, **options))  # (out, lse): both checked


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


USER_KEYWORDS = {
    "causal": "bool: keys at or before the query only",
    "window": "int or None: causal sliding window W (query t sees keys t-W+1..t)",
    "doc_lengths": "tuple of ints or None: the packed documents' lengths, in sequence order (they sum to seq)",
    "kv_heads": "int: key/value heads (k and v have this many; heads is q.shape[1])",
    "seq": "int: the global sequence length S",
    "positions": "LongTensor (S/N,): the global token positions of this rank's rows, in row order",
    "scale": "float: the softmax scale, head_dim ** -0.5",
}
"""What a user's function may take besides mask, layout and group (it gets those its signature names)."""
USER_DECLARATIONS = {
    "ringbench_masks": "mask names or families: none, causal, causal-naive, causal-document, full-document, window "
                       "(any window:W), causal-document+window (default: none, causal)",
    "ringbench_layouts": "layout names (default: contiguous, zigzag, striped), or a dict mask -> layouts",
    "ringbench_dtypes": "dtype names (default: float64, float32, bfloat16, float16)",
    "ringbench_gqa": "bool: takes K/V with fewer heads than Q (default False)",
    "ringbench_uneven": "bool: takes shards of unequal length, S not a multiple of N (default False)",
    "ringbench_min_world": "int: the fewest ranks it runs on (default 1)",
    "ringbench_multiple": "int: every run of consecutive tokens a rank holds (a contiguous shard, a zigzag chunk) "
                          "is a multiple of this (default 1)",
    "ringbench_backward": "bool: differentiable (default True)",
}  # fmt: skip
"""Optional attributes on a user's function: what it declares it supports."""


def _accepted(function) -> set[str]:
    """The USER_KEYWORDS ``function`` takes: those it names, or all with ``**kwargs``."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return set(USER_KEYWORDS)
    return {p.name for p in parameters} & set(USER_KEYWORDS)


def user_keywords(case, rank: int) -> dict:
    """Every USER_KEYWORDS value for ``case`` on ``rank``."""
    from ringbench.engine.layout import token_positions
    from ringbench.engine.masks import mask_rule

    rule = mask_rule(case.mask, case.docs, case.seq)
    positions = (case.positions(rank) if hasattr(case, "positions")
                 else token_positions(case.layout, case.seq, case.world, rank, rule))  # fmt: skip
    lengths = None
    if rule.documents:
        ends = (0, *rule.doc_ends)
        lengths = tuple(b - a for a, b in itertools.pairwise(ends))
    return {"causal": rule.causal, "window": rule.window, "doc_lengths": lengths, "kv_heads": case.key_value_heads,
            "seq": case.seq, "positions": positions, "scale": case.head_dim**-0.5}  # fmt: skip


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
            except Exception as exc:
                raise UsageError(f"impl={self.name!r}: cannot import {self._module!r} ({type(exc).__name__}: "
                                 f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from None  # fmt: skip
            function = getattr(module, self._attribute, None)
            if not callable(function):
                raise UsageError(f"impl={self.name!r}: {self._module!r} has no function {self._attribute!r}")
            self._function = function
            self.support = _declared(self.name, function)
            self.compute_patterns = tuple(getattr(function, "ringbench_compute_patterns", ()))
        return self._function

    def missing(self, device_type: str = "cpu") -> str | None:
        try:
            self._load()
        except UsageError as exc:
            return str(exc)
        return None

    def build(self, case, *, group, device, recorder) -> AttentionFn:
        import torch.distributed as dist

        function = self._load()
        taken = _accepted(function)
        rank = dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0
        extra = {key: value for key, value in user_keywords(case, rank).items() if key in taken}
        return AttentionFn(call=lambda q, k, v: function(q, k, v, mask=case.mask, layout=case.layout,
                                                         group=group, **extra))  # fmt: skip


def _declared(name: str, function) -> Support:
    """The Support a user's function declares (USER_DECLARATIONS), each attribute checked: one line when wrong."""

    def names(attribute: str, default: tuple) -> tuple:
        value = getattr(function, attribute, default)
        if isinstance(value, str) or not all(isinstance(x, str) for x in value):
            raise UsageError(f"impl={name!r}: {attribute}={value!r} is not allowed; expected a tuple of names")
        return tuple(value)

    masks = names("ringbench_masks", ("none", "causal"))
    layouts = getattr(function, "ringbench_layouts", ALL_LAYOUTS)
    if isinstance(layouts, dict):
        by_mask = {str(m): tuple(layouts.get(m, ())) for m in masks}
    else:
        by_mask = dict.fromkeys(masks, names("ringbench_layouts", ALL_LAYOUTS))
    flags = {}
    for attribute, field_name, default in (("ringbench_gqa", "gqa", False), ("ringbench_uneven", "uneven", False),
                                           ("ringbench_backward", "backward", True)):  # fmt: skip
        value = getattr(function, attribute, default)
        if not isinstance(value, bool):
            raise UsageError(f"impl={name!r}: {attribute}={value!r} is not allowed; expected True or False")
        flags[field_name] = value
    dtypes = names("ringbench_dtypes", ("float64", "float32", "bfloat16", "float16"))
    counts = {}
    for attribute in ("ringbench_multiple", "ringbench_min_world"):
        value = getattr(function, attribute, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"impl={name!r}: {attribute}={value!r} is not allowed; expected an integer >= 1")
        counts[attribute.removeprefix("ringbench_")] = value
    return Support(layouts=by_mask, dtypes=dtypes, orders=("*",), **counts, **flags)


__all__ = ["USER_DECLARATIONS", "USER_KEYWORDS", "RingAttentionPytorchAdapter", "RingFlashAttnAdapter",
           "RingbenchAdapter", "TransformerEngineAdapter", "UserAdapter", "user_keywords"]  # fmt: skip
