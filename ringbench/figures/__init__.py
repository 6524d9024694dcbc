"""The figures: what each reported number means, defined once.

Owns the transfers matched across ranks and the critical-path walk (``critical_path``) and every figure of a case
(``metrics``: step time, exposed communication, overlap, imbalance, per-hop bandwidth), as functions of the events
table. Every consumer (run, simulate, import, analyses, report, gate) calls these definitions.

May import: the vocabulary and the record. Never a producer, an analysis or a report.
"""
