"""The rank: what runs inside each rank process, and what it needs.

Owns the cases a rank runs (``scenario``: the scenario file, its validation and its cases), the per-rank runner
and its frozen settings (``runner``), the process group and device choice (``dist``: the only module that reads
RANK / WORLD_SIZE / LOCAL_RANK and picks a backend), the harness's collectives on the group's device
(``collectives``), the clock alignment across hosts (``clock``), faults (``faults``), peak memory (``memory``),
``emulated:auto``'s measurement (``autorate``), profiler captures (``profiling``), the description of the machine
(``metadata``) and the adapters that run other ring implementations inside a rank (``impls``).

May import: the vocabulary, kernels, topology, the engine, the record and the figures. Never the parent side of a
run (``ringbench.run``), a producer, an analysis or a report.
"""
