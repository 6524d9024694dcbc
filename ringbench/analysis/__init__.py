"""The analyses: answers as pure functions of the record (DataFrame -> DataFrame).

One topic per module: overlap, hops, stragglers (the critical path's culprit), balance, numerics, confidence (when a
verdict cannot be supported), placement (the ring against the topology), implementations, the profiler witness
(``timeline_check``), the answers block (``answers``) and ``findings`` (``analyze``: every analysis once, the verdict).

May import: the vocabulary, the topology model, the record, the figures and the trace readers. Never a producer
(run, simulate, rank) or the engine: an analysis gives the same answer on any machine, on measured, imported and
simulated records alike.
"""
