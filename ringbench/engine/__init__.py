"""The engine: exact ring attention and the strategies built from it, on any process group, with no timing storage.

The ring: the shards (``layout``), the positional rule of a mask (``masks``) over documents packed in one sequence
(``documents``), the plan of every (query segment, key segment) pair (``plan``, its diagonal bands: ``bands``) and
what it predicts for a whole case, as plain data for the record (``plan_summary``), the fp32 (out, lse) merge
(``merge``), where spans get their times (``timeline``: the host clock on CPU, stream events on a GPU), the one
class that moves blocks between neighbours (``comm``), one process group per ring and group, the channel each
exchange records (``pgroups``), the ring loops forward and backward (``ring``) and the short ring that stops when
the window is covered (``short_ring``), the recorder interface the loops call (``recorder``: no-op by default),
and the compilation of a JIT kernel's block variants before timing (``warm``).
The face: what a rank computes and where it runs (``spec``: ``AttentionSpec``, ``Runtime``), the one context
builder and the public ``attention`` with its ring alias ``ring_attention`` (``api``), and the exactness side:
inputs from (seed, token chunk) (``inputs``: ``ShardSpec``) and float64 attention (``reference``).
Strategies beyond one ring, made of those pieces (docs/strategies.md): groups of ranks and the plan of a block of
several shards (``groups``), the ring loops over sub-rings (``subring``), the all-to-all (``alltoall``), Ulysses and
the hybrid (``ulysses``), the double ring (``double_ring``), and their contexts and autograd call (``strategy``).

May import: the vocabulary (``ringbench.errors``, ``vocab``, ``fmt``, ``orders``, ``markers``) and the kernels.
Never the record, a run, the figures or an analysis: the ring knows nothing of timing storage.
"""
