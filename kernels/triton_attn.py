"""The ``triton`` block kernel: FlashAttention-2 forward and backward for one (query block, key block) pair.

Credits: the structure follows Triton's fused-attention tutorial (python/tutorials/06-fused-attention.py, after
Tri Dao's FlashAttention-2, https://tridao.me/publications/flash2/flash2.pdf). Changes for ringbench: any Lq and
Lk (tails are masked), grouped-query attention (query head h reads K/V head h // group; the dK/dV program of a
K/V head walks its group's query heads), three mask kinds (FULL, CAUSAL top-left aligned, PARTIAL from an explicit (Lq, Lk) mask or
from a positional rule -- token positions, document ids, a causal flag and a window -- evaluated inside each tile,
fully masked tiles skipped without arithmetic), rows that see no key return (out=0, lse=-inf), strided inputs (the ring passes slices), fp32 dots in IEEE
precision, fp64 on the interpreter, and a backward that takes the *final* out and lse of the whole ring.

Derivation (per query row, natural units). Forward: s_j = scale * q.k_j over visible keys j,
lse = log sum_j exp(s_j), out = sum_j exp(s_j - lse) v_j. Streaming over key tiles keeps the running max m, the
running sum l = sum_j exp(s_j - m) and acc = sum_j exp(s_j - m) v_j; a new tile with max m' rescales l and acc by
exp(m - m'). At the end out = acc / l and lse = m + log l. Exponentials are exp2 with log2(e) folded into the
scale, so m is kept in base-2 units and lse = (m + log2 l) * ln 2.
Backward with the final lse and out of the ring: p_ij = exp(s_ij - lse_i) is this block's exact share of the
final softmax, dv_j = sum_i p_ij do_i, dp_ij = do_i.v_j, ds_ij = p_ij (dp_ij - delta_i) with
delta_i = do_i.out_i (the preprocess kernel), dq_i = scale sum_j ds_ij k_j, dk_j = scale sum_i ds_ij q_i.
dK/dV and dQ are separate kernels (one walks query tiles for a key tile, the other key tiles for a query tile),
so no atomics are needed, which also keeps the interpreter deterministic.

On a machine without CUDA the kernels run on the CPU under TRITON_INTERPRET=1, which this module sets (unless
already set) before importing triton; Triton reads it when a kernel is decorated, i.e. at this module's import.
"""

from __future__ import annotations

import inspect
import os

import torch

from ringbench.errors import UsageError, bad_value
from ringbench.kernels.base import BlockKernel, BlockMask, MaskKind, MaskTensors, stats_dtype

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl
except ImportError:  # the module still imports; TritonKernel.check() says why the kernel cannot run
    triton = tl = None

HEAD_DIMS = (16, 32, 64, 128)  # tl.arange needs a power of two; tl.dot needs at least 16
MAX_BLOCK = 64


# Plain int arguments that vary between calls of one run: the head count and its KV group, the block lengths and the
# mask's row stride or window. Triton would specialise each (an int equal to 1, or divisible by 16, gets a variant of
# its own), so a check or a warm-up at other heads or lengths than the measured run compiles the same kernel again,
# seconds each, inside a deadline or a timed iteration. Strides stay specialised: their classes follow HEAD_DIM.
RUNTIME_INTS = ("mask_arg", "heads", "group", "q_len", "k_len")


def _jit(fn):
    return triton.jit(fn) if triton is not None else fn


def _kernel(fn):
    """A launched kernel: jitted, its RUNTIME_INTS not specialised."""
    if triton is None:
        return fn
    names = [name for name in inspect.signature(fn).parameters if name in RUNTIME_INTS]
    return triton.jit(fn, do_not_specialize=names)


# ----------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------


@_jit
def _load_rows(base, offs_rows, offs_d, stride_row, n_rows):
    """(len(offs_rows), HEAD_DIM) tile of a (rows, HEAD_DIM) matrix whose last dim is contiguous; 0 past n_rows."""
    return tl.load(
        base + offs_rows[:, None] * stride_row + offs_d[None, :], mask=offs_rows[:, None] < n_rows, other=0.0
    )


@_jit
def _dot(a, b, acc, ACC_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """a @ b (+ acc) accumulated in ACC_DTYPE. UPCAST_DOT: bf16 under the interpreter, whose tl.dot multiplies
    bf16 operands wrongly (it stores them as uint16, Triton 3.9); bf16 products are exact in fp32 anyway."""
    if UPCAST_DOT:
        a = a.to(ACC_DTYPE)
        b = b.to(ACC_DTYPE)
    return tl.dot(a, b, acc, out_dtype=ACC_DTYPE, input_precision=DOT_PRECISION)


@_jit
def _visible(offs_m, offs_n, q_len, k_len, mask_ptr, mask_arg, IS_CAUSAL: tl.constexpr, MASK_MODE: tl.constexpr):
    """(BLOCK_M, BLOCK_N) bool: the key exists, the query exists, and the mask lets the query see the key.

    MASK_MODE bits: 1 an explicit (Lq, Lk) int8 mask at mask_ptr with row stride mask_arg (1 = visible); 2 a
    positional rule, mask_ptr = int32 [q_pos (Lq) | k_pos (Lk) | q_doc (Lq) | k_doc (Lk)] and mask_arg = the window,
    with 4 causal (k_pos <= q_pos), 8 windowed (q_pos - k_pos < window) and 16 documents (q_doc == k_doc)."""
    visible = (offs_m[:, None] < q_len) & (offs_n[None, :] < k_len)
    if IS_CAUSAL:  # square block, top-left aligned: query i sees keys 0..i
        visible = visible & (offs_n[None, :] <= offs_m[:, None])
    if MASK_MODE & 1:
        allowed = tl.load(mask_ptr + offs_m[:, None] * mask_arg + offs_n[None, :], mask=visible, other=0)
        visible = visible & (allowed != 0)
    if MASK_MODE & 2:
        q_pos = tl.load(mask_ptr + offs_m, mask=offs_m < q_len, other=0)  # (BLOCK_M,)
        k_pos = tl.load(mask_ptr + q_len + offs_n, mask=offs_n < k_len, other=0)  # (BLOCK_N,)
        if MASK_MODE & 4:
            visible = visible & (k_pos[None, :] <= q_pos[:, None])
        if MASK_MODE & 8:
            visible = visible & ((q_pos[:, None] - k_pos[None, :]) < mask_arg)
        if MASK_MODE & 16:
            q_doc = tl.load(mask_ptr + q_len + k_len + offs_m, mask=offs_m < q_len, other=-1)
            k_doc = tl.load(mask_ptr + 2 * q_len + k_len + offs_n, mask=offs_n < k_len, other=-2)
            visible = visible & (q_doc[:, None] == k_doc[None, :])
    return visible


@_jit
def _live(visible, MASK_MODE: tl.constexpr):
    """1 when some entry of the tile is visible (0: the tile is skipped); always 1 without a PARTIAL mask."""
    live = 1
    if MASK_MODE != 0:
        live = tl.max(tl.max(visible.to(tl.int32), 1), 0)
    return live


# ----------------------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------------------


@_jit
def _attn_fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_kn,
    stride_vn,
    mask_ptr,
    mask_arg,
    offs_m,
    offs_d,
    k_hi,
    q_len,
    k_len,
    qk_scale,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    MASK_MODE: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """Stream key tiles [0, k_hi) into the running (acc, l_i, m_i) of one query tile."""
    for start_n in range(0, k_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        visible = _visible(offs_m, offs_n, q_len, k_len, mask_ptr, mask_arg, IS_CAUSAL, MASK_MODE)
        if _live(visible, MASK_MODE) > 0:  # a fully masked tile costs no arithmetic
            k = _load_rows(k_base, offs_n, offs_d, stride_kn, k_len)  # (BLOCK_N, HEAD_DIM)
            s = _dot(q, tl.trans(k), None, ACC_DTYPE, DOT_PRECISION, UPCAST_DOT) * qk_scale  # (BLOCK_M, BLOCK_N)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
            # A row that has seen no visible key yet keeps m = -inf; subtracting 0 instead keeps p = 0, not NaN.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])  # (BLOCK_M, BLOCK_N)
            alpha = tl.exp2(m_i - m_safe)  # (BLOCK_M,) rescales what was accumulated under the old max
            l_i = l_i * alpha + tl.sum(p, 1)
            v = _load_rows(v_base, offs_n, offs_d, stride_vn, k_len)  # (BLOCK_N, HEAD_DIM)
            acc = acc * alpha[:, None]
            acc = _dot(p.to(v.dtype), v, acc, ACC_DTYPE, DOT_PRECISION, UPCAST_DOT)
            m_i = m_new
    return acc, l_i, m_i


@_kernel
def _attn_fwd(
    q_ptr,
    k_ptr,
    v_ptr,
    mask_ptr,
    out_ptr,
    lse_ptr,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_om,
    mask_arg,
    heads,
    group,
    q_len,
    k_len,
    SM_SCALE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    MASK_MODE: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """One program per (query tile, batch*head): out (B, H, Lq, D) and lse (B, H, Lq), natural units; query head h
    reads K/V head h // group (grouped-query attention; group 1 without).

    Long because a Triton kernel takes no structs: every pointer, stride and block size is its own parameter (31,
    one a line), and 22 of them pass on to ``_attn_fwd_inner``, which already holds the key loop; what is left is
    the tile's set-up and the store of its output, some 25 lines.
    """
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // heads).to(tl.int64)
    off_h = (off_bh % heads).to(tl.int64)
    off_kvh = off_h // group
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    # Constants are made in the accumulator dtype: a Python float would enter the kernel as fp32.
    qk_scale = tl.full([], SM_SCALE * 1.4426950408889634, ACC_DTYPE)  # scale * log2(e): exp(x) = exp2(x log2 e)
    ln2 = tl.full([], 0.6931471805599453, ACC_DTYPE)

    q = _load_rows(q_ptr + off_b * stride_qb + off_h * stride_qh, offs_m, offs_d, stride_qm, q_len)  # (BLOCK_M, D)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=ACC_DTYPE)
    l_i = tl.zeros([BLOCK_M], dtype=ACC_DTYPE)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=ACC_DTYPE)
    k_hi = k_len
    if IS_CAUSAL:  # keys past the tile's last query are all hidden
        k_hi = tl.minimum(k_len, (start_m + 1) * BLOCK_M)
    acc, l_i, m_i = _attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_ptr + off_b * stride_kb + off_kvh * stride_kh,
        v_ptr + off_b * stride_vb + off_kvh * stride_vh,
        stride_kn,
        stride_vn,
        mask_ptr,
        mask_arg,
        offs_m,
        offs_d,
        k_hi,
        q_len,
        k_len,
        qk_scale,
        BLOCK_N,
        IS_CAUSAL,
        MASK_MODE,
        ACC_DTYPE,
        DOT_PRECISION,
        UPCAST_DOT,
    )
    # Rows with no visible key have l = 0: they get the merge's identity (out = 0, lse = -inf).
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]  # (BLOCK_M, HEAD_DIM)
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * ln2)  # (BLOCK_M,)
    row_ok = offs_m < q_len
    out_ptrs = out_ptr + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(lse_ptr + off_bh.to(tl.int64) * q_len + offs_m, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------------------


@_kernel
def _attn_bwd_preprocess(
    out_ptr,
    dout_ptr,
    delta_ptr,
    stride_ob,
    stride_oh,
    stride_om,
    stride_dob,
    stride_doh,
    stride_dom,
    heads,
    q_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
):
    """delta (B, H, Lq) = rowsum(dO * O) of the final output."""
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // heads).to(tl.int64)
    off_h = (off_bh % heads).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    out = _load_rows(out_ptr + off_b * stride_ob + off_h * stride_oh, offs_m, offs_d, stride_om, q_len)
    dout = _load_rows(dout_ptr + off_b * stride_dob + off_h * stride_doh, offs_m, offs_d, stride_dom, q_len)
    delta = tl.sum(out.to(ACC_DTYPE) * dout.to(ACC_DTYPE), 1)  # (BLOCK_M,)
    tl.store(delta_ptr + off_bh.to(tl.int64) * q_len + offs_m, delta, mask=offs_m < q_len)


@_jit
def _load_row_stats(lse_ptr, delta_ptr, offs_m, q_len, ACC_DTYPE: tl.constexpr):
    """(lse in base-2 units, delta), both (BLOCK_M,). A row without visible keys (lse = -inf) or past Lq gets
    lse = +inf, so every p in it is exp2(-inf) = 0 instead of exp2(+inf)."""
    log2e = tl.full([], 1.4426950408889634, ACC_DTYPE)
    lse = tl.load(lse_ptr + offs_m, mask=offs_m < q_len, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse) * log2e
    delta = tl.load(delta_ptr + offs_m, mask=offs_m < q_len, other=0.0)
    return lse, delta


@_kernel
def _attn_bwd_dkdv(
    q_ptr,
    k_ptr,
    v_ptr,
    mask_ptr,
    dout_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_dob,
    stride_doh,
    stride_dom,
    mask_arg,
    heads,
    group,
    q_len,
    k_len,
    SM_SCALE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    MASK_MODE: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """One program per (key tile, batch*KV head): walks the query tiles of each of the ``group`` query heads that
    read this K/V head, so its dk and dv are summed over them in the tile's accumulators (no atomics); dk and dv
    are (B, KV, Lk, D), contiguous.

    Long because a Triton kernel takes no structs (every pointer, stride and block size is a parameter, one a line).
    """
    start_n = tl.program_id(0)
    off_bkv = tl.program_id(1)
    kv_heads = heads // group
    off_b = (off_bkv // kv_heads).to(tl.int64)
    off_kvh = (off_bkv % kv_heads).to(tl.int64)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    qk_scale = tl.full([], SM_SCALE * 1.4426950408889634, ACC_DTYPE)
    sm_scale = tl.full([], SM_SCALE, ACC_DTYPE)

    k = _load_rows(k_ptr + off_b * stride_kb + off_kvh * stride_kh, offs_n, offs_d, stride_kn, k_len)  # (BLOCK_N, D)
    v = _load_rows(v_ptr + off_b * stride_vb + off_kvh * stride_vh, offs_n, offs_d, stride_vn, k_len)  # (BLOCK_N, D)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=ACC_DTYPE)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=ACC_DTYPE)
    q_lo = 0
    if IS_CAUSAL:  # queries above the tile's first key see none of it
        q_lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for member in range(0, group):  # the query heads that read this K/V head
        off_h = off_kvh * group + member
        q_base = q_ptr + off_b * stride_qb + off_h * stride_qh
        dout_base = dout_ptr + off_b * stride_dob + off_h * stride_doh
        stats_offset = (off_b * heads + off_h) * q_len
        for start_m in range(q_lo, q_len, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            visible = _visible(offs_m, offs_n, q_len, k_len, mask_ptr, mask_arg, IS_CAUSAL, MASK_MODE)
            if _live(visible, MASK_MODE) > 0:
                q = _load_rows(q_base, offs_m, offs_d, stride_qm, q_len)  # (BLOCK_M, D)
                dout = _load_rows(dout_base, offs_m, offs_d, stride_dom, q_len)  # (BLOCK_M, D)
                lse, delta = _load_row_stats(lse_ptr + stats_offset, delta_ptr + stats_offset, offs_m, q_len,
                                             ACC_DTYPE)  # fmt: skip
                s = _dot(q, tl.trans(k), None, ACC_DTYPE, DOT_PRECISION, UPCAST_DOT) * qk_scale  # (BLOCK_M, BLOCK_N)
                p = tl.where(visible, tl.exp2(s - lse[:, None]), 0.0)  # (BLOCK_M, BLOCK_N): share of the final softmax
                dv = _dot(tl.trans(p.to(dout.dtype)), dout, dv, ACC_DTYPE, DOT_PRECISION, UPCAST_DOT)
                dp = _dot(dout, tl.trans(v), None, ACC_DTYPE, DOT_PRECISION, UPCAST_DOT)  # (BLOCK_M, BLOCK_N)
                ds = p * (dp - delta[:, None])  # (BLOCK_M, BLOCK_N)
                dk = _dot(tl.trans(ds.to(q.dtype)), q, dk, ACC_DTYPE, DOT_PRECISION, UPCAST_DOT)
    dk = dk * sm_scale
    row_ok = offs_n[:, None] < k_len
    tile = off_bkv.to(tl.int64) * k_len * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dk_ptr + tile, dk.to(dk_ptr.dtype.element_ty), mask=row_ok)
    tl.store(dv_ptr + tile, dv.to(dv_ptr.dtype.element_ty), mask=row_ok)


@_kernel
def _attn_bwd_dq(
    q_ptr,
    k_ptr,
    v_ptr,
    mask_ptr,
    dout_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_dob,
    stride_doh,
    stride_dom,
    mask_arg,
    heads,
    group,
    q_len,
    k_len,
    SM_SCALE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    MASK_MODE: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """One program per (query tile, batch*head): walks the key tiles of K/V head h // group; dq is (B, H, Lq, D),
    contiguous."""
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // heads).to(tl.int64)
    off_h = (off_bh % heads).to(tl.int64)
    off_kvh = off_h // group
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    qk_scale = tl.full([], SM_SCALE * 1.4426950408889634, ACC_DTYPE)
    sm_scale = tl.full([], SM_SCALE, ACC_DTYPE)

    q = _load_rows(q_ptr + off_b * stride_qb + off_h * stride_qh, offs_m, offs_d, stride_qm, q_len)  # (BLOCK_M, D)
    dout = _load_rows(dout_ptr + off_b * stride_dob + off_h * stride_doh, offs_m, offs_d, stride_dom, q_len)
    stats_offset = off_bh.to(tl.int64) * q_len
    lse, delta = _load_row_stats(lse_ptr + stats_offset, delta_ptr + stats_offset, offs_m, q_len, ACC_DTYPE)
    k_base = k_ptr + off_b * stride_kb + off_kvh * stride_kh
    v_base = v_ptr + off_b * stride_vb + off_kvh * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=ACC_DTYPE)
    k_hi = k_len
    if IS_CAUSAL:
        k_hi = tl.minimum(k_len, (start_m + 1) * BLOCK_M)
    for start_n in range(0, k_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        visible = _visible(offs_m, offs_n, q_len, k_len, mask_ptr, mask_arg, IS_CAUSAL, MASK_MODE)
        if _live(visible, MASK_MODE) > 0:
            k = _load_rows(k_base, offs_n, offs_d, stride_kn, k_len)  # (BLOCK_N, D)
            v = _load_rows(v_base, offs_n, offs_d, stride_vn, k_len)  # (BLOCK_N, D)
            s = _dot(q, tl.trans(k), None, ACC_DTYPE, DOT_PRECISION, UPCAST_DOT) * qk_scale  # (BLOCK_M, BLOCK_N)
            p = tl.where(visible, tl.exp2(s - lse[:, None]), 0.0)  # (BLOCK_M, BLOCK_N)
            dp = _dot(dout, tl.trans(v), None, ACC_DTYPE, DOT_PRECISION, UPCAST_DOT)  # (BLOCK_M, BLOCK_N)
            ds = p * (dp - delta[:, None])
            dq = _dot(ds.to(k.dtype), k, dq, ACC_DTYPE, DOT_PRECISION, UPCAST_DOT)
    dq = dq * sm_scale
    tile = off_bh.to(tl.int64) * q_len * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dq_ptr + tile, dq.to(dq_ptr.dtype.element_ty), mask=offs_m[:, None] < q_len)


# ----------------------------------------------------------------------------------------------------------------
# The block kernel
# ----------------------------------------------------------------------------------------------------------------


@_jit
def _count_to(out_ptr, n):
    """The interpreter probe: a loop bounded by a plain int argument, as every kernel above has."""
    total = 0
    for _ in range(0, n, 1):
        total += 1
    tl.store(out_ptr, total)


_INTERPRETER_PROBLEM: list[str | None] = []  # the one answer of this process


def interpreter_problem() -> str | None:
    """One line when this Triton's CPU interpreter cannot run the kernels, else None (also when not interpreted).

    Triton 3.6's interpreter turns an int argument into a 1-element array and reads it back with int(), which
    NumPy 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars"; Triton 3.9 squeezes it
    first). Compiled kernels on a GPU are not concerned: the probe runs only under the interpreter."""
    if not _interpreted():
        return None
    if not _INTERPRETER_PROBLEM:
        out = torch.zeros(1, dtype=torch.int32)
        try:
            _count_to[(1,)](out, 3)
            problem = None if int(out[0]) == 3 else f"counted {int(out[0])} for 3"
        except Exception as exc:  # the interpreter raises its own error types, wrapping the cause
            problem = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        if problem is not None:
            import numpy

            problem = (f"Triton {triton.__version__}'s CPU interpreter cannot run the kernels with NumPy "
                       f"{numpy.__version__} ({problem}); use a newer Triton (3.9 works) or an older NumPy")  # fmt: skip
        _INTERPRETER_PROBLEM.append(problem)
    return _INTERPRETER_PROBLEM[0]


def _interpreted() -> bool:
    """True when the kernels above were decorated for the CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return triton is not None and type(_attn_fwd).__name__ == "InterpretedFunction"


def _block(length: int) -> int:
    """Tile size along one sequence axis: a power of two in [16, MAX_BLOCK], no larger than the axis needs."""
    return min(MAX_BLOCK, max(16, triton.next_power_of_2(length)))


def _launch_options(q: torch.Tensor) -> dict:
    """num_warps and num_stages for GPU launches (ignored by the interpreter). Fixed, not autotuned: a
    benchmark's first call must not hide a tuning sweep, and the same shape must always run the same code."""
    if q.device.type != "cuda":
        return {}
    wide = q.element_size() * q.shape[-1] > 256  # fp32 at D=128: leave shared memory for one stage only
    return {"num_warps": 4, "num_stages": 1 if wide else 2}


def _rows_strided(t: torch.Tensor) -> torch.Tensor:
    """The kernels take any batch/head/row strides but need a contiguous last dim."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _upcast_dot(dtype: torch.dtype) -> bool:
    return dtype == torch.bfloat16 and _interpreted()


def _tl_dtype(dtype: torch.dtype):
    """The accumulator dtype as Triton spells it."""
    return tl.float64 if dtype == torch.float64 else tl.float32


class TritonKernel(BlockKernel):
    """Triton FlashAttention-2 block kernel; compiled on CUDA, interpreted (TRITON_INTERPRET=1) on the CPU."""

    name = "triton"
    max_head_dim = 128
    compiles = (
        True  # JIT: each new (mask mode, dtype, shape class) compiles on its first call (ringbench/engine/warm.py)
    )
    # float64 only under the interpreter (check() rejects it on CUDA, where it is not validated).
    dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

    def __init__(self) -> None:
        # PARTIAL masks as (Lq, Lk) int8 on the device, built once per plan mask (plans are cached, so the same
        # mask comes back every ring step) and copied without blocking the host.
        self.mask_tensors = MaskTensors()

    def check(self, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        device = torch.device(device)
        if triton is None:
            raise UsageError("kernel='triton' is not allowed here: triton is not installed (pip install triton)")
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise UsageError("kernel='triton' is not allowed here: no CUDA device")
            allowed = tuple(d for d in self.dtypes if _interpreted() or d != torch.float64)
        elif device.type == "cpu":
            if not _interpreted():
                reason = (
                    "tensors are on the CPU" if torch.cuda.is_available() else "there is no CUDA device"
                ) + " and TRITON_INTERPRET=1 was not set when ringbench.kernels.triton_attn was imported"
                raise UsageError(f"kernel='triton' is not allowed here: {reason}")
            if interpreter_problem():
                raise UsageError(f"kernel='triton' is not allowed here: {interpreter_problem()}")
            allowed = self.dtypes
        else:
            raise bad_value("device", str(device), "cuda, or cpu under TRITON_INTERPRET=1, for kernel 'triton'")
        if head_dim not in HEAD_DIMS:
            raise bad_value("head_dim", head_dim, f"a power of two from 16 to {self.max_head_dim} for kernel 'triton'")
        if dtype not in allowed:
            names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
            raise bad_value(
                "dtype", str(dtype).removeprefix("torch."), f"one of {names} for kernel 'triton' on {device}"
            )

    def _check_inputs(self, q, k, v, mask: BlockMask) -> None:
        if (q.dim() != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[-1] != q.shape[-1]
                or k.shape[1] < 1 or q.shape[1] % k.shape[1]):  # fmt: skip
            raise ValueError(
                f"expected q (B, H, Lq, D) and k, v (B, KV, Lk, D) with KV dividing H; got {tuple(q.shape)}, "
                f"{tuple(k.shape)}, {tuple(v.shape)}"
            )
        if not q.dtype == k.dtype == v.dtype:
            raise ValueError(f"q, k and v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
        self.check(q.shape[-1], q.dtype, q.device)
        q_len, k_len = q.shape[-2], k.shape[-2]
        if mask.kind is MaskKind.CAUSAL and q_len != k_len:
            raise ValueError(f"a CAUSAL block must be square; got Lq={q_len}, Lk={k_len}")
        if mask.kind is MaskKind.PARTIAL and mask.shape != (q_len, k_len):
            raise ValueError(f"a PARTIAL mask must be (Lq, Lk) = {(q_len, k_len)}; got {mask.shape}")

    def _mask_args(self, mask: BlockMask, q: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """(mask pointer, its argument, MASK_MODE) for _visible. Without a PARTIAL mask q stands in for the unused
        pointer. A positional rule goes to the kernel as one packed int32 tensor, evaluated tile by tile."""
        if mask.kind is not MaskKind.PARTIAL:
            return q, 0, 0
        if mask.allowed is None and mask.rule is not None:
            rule = mask.rule
            packed = self._packed_rule(mask, q.device)
            mode = 2 | (4 if rule.causal else 0) | (8 if rule.window else 0) | (16 if rule.q_doc is not None else 0)
            return packed, int(rule.window), mode
        allowed = self.mask_tensors.allowed(mask, q.device, torch.int8)  # (Lq, Lk), 1 = visible, contiguous
        return allowed, allowed.stride(0), 1

    def _packed_rule(self, mask: BlockMask, device: torch.device) -> torch.Tensor:
        """[q_pos | k_pos | q_doc | k_doc] int32 on ``device``, built once per plan mask."""
        return self.mask_tensors._get(
            (id(mask), "packed-rule", torch.device(device)),
            mask,
            lambda: torch.cat(self.mask_tensors.rule_tensors(mask, device)).contiguous(),
        )

    def forward(self, q, k, v, mask, scale):
        self._check_inputs(q, k, v, mask)
        q, k, v = (_rows_strided(t) for t in (q, k, v))
        batch, heads, q_len, head_dim = q.shape
        k_len = k.shape[-2]
        acc = stats_dtype(q.dtype)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (B, H, Lq, D)
        lse = torch.empty((batch, heads, q_len), dtype=acc, device=q.device)  # (B, H, Lq)
        if q_len == 0 or batch * heads == 0:
            return out, lse
        if k_len == 0:
            return out.zero_(), lse.fill_(float("-inf"))
        mask_ptr, mask_arg, mask_mode = self._mask_args(mask, q)
        block_m, block_n = _block(q_len), _block(k_len)
        grid = (triton.cdiv(q_len, block_m), batch * heads)
        _attn_fwd[grid](
            q, k, v, mask_ptr, out, lse,
            *_strides(q), *_strides(k), *_strides(v), *_strides(out),
            mask_arg, heads, heads // k.shape[1], q_len, k_len,
            SM_SCALE=float(scale),
            HEAD_DIM=head_dim,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            IS_CAUSAL=mask.kind is MaskKind.CAUSAL,
            MASK_MODE=mask_mode,
            ACC_DTYPE=_tl_dtype(acc),
            DOT_PRECISION="ieee",  # fp32 inputs must not be rounded to tf32; ignored for 16-bit inputs
            UPCAST_DOT=_upcast_dot(q.dtype),
            **_launch_options(q),
        )  # fmt: skip
        return out, lse

    def backward(self, dout, q, k, v, out, lse, mask, scale):
        self._check_inputs(q, k, v, mask)
        q, k, v, out, dout = (_rows_strided(t) for t in (q, k, v, out, dout))
        batch, heads, q_len, head_dim = q.shape
        k_len = k.shape[-2]
        acc = stats_dtype(q.dtype)
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (B, H, Lq, D)
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)  # (B, KV, Lk, D)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)  # (B, KV, Lk, D)
        if q_len == 0 or k_len == 0 or batch * heads == 0:
            return dq, dk, dv
        lse = lse.to(acc).contiguous()  # (B, H, Lq), the final lse of the ring
        delta = torch.empty_like(lse)  # (B, H, Lq)
        mask_ptr, mask_arg, mask_mode = self._mask_args(mask, q)
        block_m, block_n = _block(q_len), _block(k_len)
        options = _launch_options(q)
        constants = {
            "SM_SCALE": float(scale),
            "HEAD_DIM": head_dim,
            "BLOCK_M": block_m,
            "BLOCK_N": block_n,
            "IS_CAUSAL": mask.kind is MaskKind.CAUSAL,
            "MASK_MODE": mask_mode,
            "ACC_DTYPE": _tl_dtype(acc),
            "DOT_PRECISION": "ieee",
            "UPCAST_DOT": _upcast_dot(q.dtype),
        }
        _attn_bwd_preprocess[(triton.cdiv(q_len, block_m), batch * heads)](
            out, dout, delta, *_strides(out), *_strides(dout), heads, q_len,
            HEAD_DIM=head_dim, BLOCK_M=block_m, ACC_DTYPE=constants["ACC_DTYPE"], **options,
        )  # fmt: skip
        group = heads // k.shape[1]
        strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(dout), mask_arg, heads, group, q_len, k_len)
        _attn_bwd_dkdv[(triton.cdiv(k_len, block_n), batch * k.shape[1])](
            q, k, v, mask_ptr, dout, lse, delta, dk, dv, *strides, **constants, **options
        )
        _attn_bwd_dq[(triton.cdiv(q_len, block_m), batch * heads)](
            q, k, v, mask_ptr, dout, lse, delta, dq, *strides, **constants, **options
        )
        return dq, dk, dv
