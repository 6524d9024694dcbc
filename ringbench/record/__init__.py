"""The record: the one record at the centre of ringbench.

Owns the events / cases schema and its version (``schema``), atomic file writes (``atomic``), the meta.json key
registry with its writer and versioned reader (``meta``), and storing and loading a run folder (``store``). Every
producer writes through it and every consumer reads through it.

May import: the vocabulary only. Never the engine, a run, the figures, an analysis or a report.
"""
