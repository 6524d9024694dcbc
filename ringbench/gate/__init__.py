"""The CI gate: baselines, matching cases across runs, the statistics of a regression, and its verdict and exit code.

May import: the vocabulary, the record, the figures and the analyses. Never a producer or the engine.
"""
