"""The run: the parent side of a measured run, and the record it writes.

Owns spawning local ranks (``launch``), the sweep over cases (``sweep``: local and resumed), the rank side of a
torchrun / SLURM run (``launched``), how a stop signal ends any of them (``interrupt``: ranks stopped within seconds,
the finished cases kept, the resume command said), and the results folder that turns the ranks' rows into a record
written atomically case by case (``results``). (The exactness self-check the tests drive is tests/support/selfcheck.py.)

May import: every floor below (the rank, traces, figures, record, engine, kernels, topology, vocabulary). Never the
simulator, an analysis, a report, the gate or the CLI.
"""
