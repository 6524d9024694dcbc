"""Scaffolding the tests import (and a few benchmarks, through ``sys.path``): none of it serves a command.

Imported as ``support.<module>``: pytest puts ``tests/`` on ``sys.path`` (the rootdir conftest's folder, its default
``prepend`` import mode), and launched ranks unpickle their work function from the same path.

- ``selfcheck``: every ring variant against float64 single-device attention (``CheckCase``, ``run_selfcheck``).
- ``synthetic``: run folders with known step times, for the gate's tests.
- ``agreement``: an imported trace's record against ringbench's own record of the same run.
- ``given``: ``SimConfig``, a ring at given compute and link times on the simulator's model (SIMULATED).
- ``detection``: randomised trials of the straggler verdict on simulated rings with injected faults.
- ``channels``: exchanges of one rank in flight together on one process group (the engine promises none).
"""
