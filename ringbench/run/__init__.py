"""The run: the parent side of a measured run, and the record it writes.

Owns spawning local ranks and joining launched ones (``launch``), the sweep over cases (``sweep``: local,
launched, resumed), the results folder that turns the ranks' rows into a record written atomically case by case
(``results``), and the exactness self-check that runs every ring variant against float64 (``selfcheck``).

May import: every floor below (the rank, traces, figures, record, engine, kernels, topology, vocabulary). Never the
simulator, an analysis, a report, the gate or the CLI.
"""
