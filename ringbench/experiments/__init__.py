"""Experiments that measure the machine with the run layer: the link probe, network-namespace clusters, calibration runs.

May import every floor below the CLI (the run layer, the simulator, the analyses).
"""
