"""Experiments that measure the machine with the run layer: the link probe, network-namespace clusters, detection trials."""
