"""The one record at the centre: events, cases and metadata, with their version.

Every producer (real runs, the simulator, imported traces) writes these tables and every consumer (analyses,
reports, the CI gate) reads them. A feature that needs more data adds columns here; it never opens a side channel.

Schema versions (readers accept every one of them; missing columns read as null, ``censored`` as false,
``layer`` as 0):
  4 -- one process group per ring: events gain ``comm_group`` (the channel an exchange used, as
       ringbench/engine/pgroups.py labels it: ``<role>:<ranks>`` such as ``inner-kv:0-1`` or ``outer-kv:1-3``,
       ``shared:<role>`` when it rode on the caller's group; null in older records, in imported and simulated ones,
       and on spans that are no exchange). Later in version 4: cases gain the axis ``kv_heads`` (grouped-query
       attention; 0 -- and absent in older records -- as many as heads) and the per-tensor errors ``out_err``,
       ``lse_err``, ``dq_err``, ``dk_err``, ``dv_err`` (null in older records).
  3 -- strategies beyond one ring: cases gain the ``strategy`` and ``placement`` axes and ``attn_mem_mb`` (the
       peak of the attention's own tensors per rank); events gain ``exchange`` (what a send / recv / wait moved:
       ``qkv``, ``out``, ``dout``, ``dqkv`` for the all-to-alls, ``kv`` / ``dkv`` where a strategy labels its ring
       exchanges; null where the record infers it, as for the ring's own). Older records: strategy null reads as
       the ring (``allgather`` for buffer allgather), placement null as none. Attribution on evidence: events gain
       the kinds ``own`` (a rank busy outside its compute: other ops and unprofiled time), ``sync`` (a barrier or
       another collective that is no rotation of the ring) and ``post`` (an exchange's post held back on one hop),
       and the column ``censored`` (send / recv rows whose end is an upper bound: nobody was waiting when the block
       completed). Imported traces write them.
       Masks beyond one causal sequence: events gain ``layer`` (the attention layer of a multi-layer iteration, 0
       for one layer); cases gain the ``docs`` and ``layers`` axes, the documents' ``docs_count``, ``docs_mean``,
       ``docs_max``, the balance figure (``imbalance``, ``predicted_imbalance``), ``bytes_moved``, ``kernel_calls``
       and ``ring_steps``; later ``short_ring_bytes`` (what the short ring would move; null in records before it)
       and ``nonfinite`` (the tensors that held a NaN or an infinity: a failed check, never an unchecked one).
  2 -- events gain ``nccl_ms`` (NCCL's own duration of an exchange, when NCCL timing is on); cases gain
       ``peak_mem_mb``, ``saturated_blocks``, ``emulated_blocks``, ``emulated_gflops``, ``check_note`` and the ``impl`` axis.
  1 -- first version. Files of version 1 are kept as test fixtures (tests/data/).

Events: one row per span on one rank.
  kind       meaning of [start_ns, end_ns]                                    src / dst
  iteration  one phase of one timed iteration on this rank: a "fwd" row and,   rank / rank
             with backward, a "bwd" row starting where the forward ended
  compute    block arithmetic for one ring step (absent when the pair skips)  owner of the KV block / rank
  send       exchange posted .. this rank's send completed                    rank / ring successor
  recv       exchange posted .. the block from the predecessor is in hand     ring predecessor / rank
  wait       time this rank sat blocked waiting for the exchange (exposed)    ring predecessor / rank
  collective an all-gather / all-reduce (buffer strategy `allgather`)          -1 / rank
  own        the rank busy with its own work that is no compute span: other ops,   rank / rank
             and time in no op that was not spent waiting (imported traces)
  sync       a barrier or another collective that is no rotation of the ring:      -1 / rank
             from this rank's join to its release (imported traces)
  post       an exchange's post held back on one hop: from the exchange's first op  the hop held back
             to the late op's post, time in no op (imported traces)

An all-to-all (Ulysses, the hybrid) is a send and a recv per peer (src / dst the two ranks, its bytes) and one
wait, charged to the peer whose chunk came last; its rows carry ``exchange``.

Exchanges: with ``sync`` the exchange of step s (s >= 1) is posted at the start of step s and waited for before
its compute; with ``double`` the exchange posted in step s (s <= N-2) brings the block of step s+1 and is waited
for after step s's compute. The backward has two exchanges per step: K/V (as in the forward) and the dK/dV
accumulator, posted after step s's compute and waited for in step s+1 (double) or at
once (sync); the last one (step N-1) brings each rank its own fully summed accumulator. Rows of one step are in
posting order; the dK/dV exchange moves fp32 (or fp64) accumulators.

Times are integer nanoseconds on one aligned clock (rank 0's), relative to the case's origin, so the spans of
different ranks can be laid on one timeline; the residual of the alignment is in the metadata.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)

EVENT_KINDS = ("iteration", "compute", "send", "recv", "wait", "collective", "own", "sync", "post")
PHASES = ("fwd", "bwd")
PAIR_KINDS = ("full", "causal", "partial", "skip", "")

EVENTS_SCHEMA = pa.schema(
    [
        pa.field("case_id", pa.string()),
        pa.field("repeat", pa.int32()),  # fresh process group index (run --repeat K)
        pa.field("iteration", pa.int32()),  # timed iteration index (warm-up iterations are not recorded)
        pa.field("phase", pa.string()),  # fwd | bwd
        pa.field("rank", pa.int32()),
        pa.field("ring_position", pa.int32()),
        pa.field("step", pa.int32()),  # ring step 0..N-1 (-1 for iteration rows)
        pa.field("kind", pa.string()),  # see EVENT_KINDS
        pa.field("start_ns", pa.int64()),
        pa.field("end_ns", pa.int64()),
        pa.field("src", pa.int32()),
        pa.field("dst", pa.int32()),
        pa.field("bytes", pa.int64()),
        pa.field("block", pa.int32()),  # rank that owns the KV block in hand at this step (-1 if none)
        pa.field("pair", pa.string()),  # compute rows: full | causal | partial (masks); "" otherwise
        pa.field("flops", pa.float64()),  # compute rows: arithmetic of this step (0 otherwise)
        # send / recv rows on NCCL with TORCH_NCCL_ENABLE_TIMING=1: NCCL's own kernel time of the exchange, ms;
        # null elsewhere (gloo, timing off, other kinds). Added in version 2.
        pa.field("nccl_ms", pa.float64()),
        # send / recv / wait rows: what moved, when the producer says so (version 3); null: inferred (kv / dkv)
        pa.field("exchange", pa.string()),
        # send / recv rows: the end is an upper bound, not a measurement (a host-side trace saw the completion only
        # when its ranks came to take it, and neither was waiting). False elsewhere. Added in version 3.
        pa.field("censored", pa.bool_()),
        # the attention layer of the iteration this span belongs to (0 for a one-layer model). Added in version 3.
        pa.field("layer", pa.int32()),
        # send / recv / wait / collective rows: the process group (channel) the exchange used. Added in version 4.
        pa.field("comm_group", pa.string()),
    ]
)
EVENT_COLUMNS = tuple(EVENTS_SCHEMA.names)
# What a column an older file (or a producer) lacks reads as: null, except these.
EVENT_DEFAULTS = {"censored": False, "layer": 0}

# Columns of the per-case summary table (cases.parquet / cases.csv / the `--json` cases list).
CASE_AXES = (
    "world",
    "seq",
    "heads",
    "kv_heads",  # key/value heads, grouped-query attention (0: as many as heads; older records: 0)
    "head_dim",
    "batch",
    "dtype",
    "mask",
    "layout",
    "buffer",
    "order",
    "kernel",
    "backward",
    "impl",  # the ring-attention implementation (version 2; older records: ringbench)
    "strategy",  # ring, ulysses, hybrid:U, double-ring:W, allgather (version 3; older records: null = ring)
    "placement",  # grouped strategies: how ranks form groups (version 3; "" / null for the others)
    "docs",  # the packed documents' spec (version 3; "none" without documents)
    "layers",  # attention layers per iteration: a count or a pattern of masks (version 3; older records: 1)
)
# Per tensor: its max abs error over all ranks, as `ringbench check` reports them; NaN when not compared (lse: only
# where the implementation exposes it; dk, dv: over the check's budget) or when the tensor held a NaN (``nonfinite``
# names it). fwd_max_abs_err is out_err; bwd_max_abs_err the worst gradient's.
ERROR_COLUMNS = ("out_err", "lse_err", "dq_err", "dk_err", "dv_err")
CASE_COLUMNS = (
    "case_id",
    "repeat",
    *CASE_AXES,
    "ring",  # ranks in ring order, e.g. "0-1-2-3"
    "emulated",  # bool: compute time is modelled (emulated kernel), not measured arithmetic
    "faults",  # injected faults, ";"-joined specs ("" when none)
    "iters",
    "warmup",
    "step_ms",  # median time per iteration (first start to last end over ranks), ms
    "step_ms_p10",
    "step_ms_p90",
    "fwd_ms",  # median forward time per iteration, ms
    "bwd_ms",  # median backward time per iteration, ms (NaN without backward)
    "tokens_per_s",
    "tflops",  # useful (non-masked) arithmetic per second, TFLOP/s
    "exposed_comm_ms",  # median per iteration of the wait / collective time on the critical path, ms
    "exposed_comm_frac",  # exposed_comm_ms / step_ms
    "fwd_max_abs_err",  # against the float64 single-device reference (NaN when --no-check)
    "bwd_max_abs_err",
    *ERROR_COLUMNS,
    "passed",  # bool: errors within the dtype's tolerance (True when unchecked)
    "status",  # ok | failed
    "peak_mem_mb",  # largest peak memory of any rank during the case, MB (NaN: not reported)
    "saturated_blocks",  # emulated kernel calls whose real arithmetic outlasted the modelled time, all ranks
    "emulated_blocks",  # every emulated kernel call of the case, all ranks (saturated_blocks' denominator)
    "emulated_gflops",  # the emulated kernel's rate (emulated:auto: the rate it chose), NaN when not emulated
    "check_note",  # what the float64 check left out to stay in its time budget ("" when it checked everything)
    "nonfinite",  # tensors that held a NaN or an infinity on some rank, e.g. "out,dk" ("" none; null in older records)
    "attn_mem_mb",  # largest per-rank peak of the attention's own tensors, inputs included, MiB (version 3)
    "docs_count",  # documents in the sequence (version 3; NaN without documents)
    "docs_mean",  # their mean length, tokens
    "docs_max",  # the longest, tokens
    "imbalance",  # max / mean over ranks of measured compute ms per iteration (figures.metrics.imbalance)
    "predicted_imbalance",  # max / mean over ranks of the plan's visible score entries (all layers)
    "bytes_moved",  # median per iteration of the bytes all ranks sent (send and collective rows), NaN untraced
    "kernel_calls",  # block-kernel calls per iteration, all ranks, forward and backward, from the plan
    "ring_steps",  # ring steps per phase and layer (N for the full ring; D + 1 for the short ring's deepest layer)
    "short_ring_bytes",  # what one iteration would move on the short ring, all ranks (the plan's route; NaN: no ring)
)
CASE_DEFAULTS = {"docs": "none", "layers": "1", "kv_heads": 0}  # what an axis an older record lacks reads as


def empty_events():
    """An empty events table with the right columns and dtypes."""
    return EVENTS_SCHEMA.empty_table().to_pandas()
