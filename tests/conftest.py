import os

import pytest
import torch

# One thread per process: tests launch several ranks on 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    for item in items:
        timing = item.get_closest_marker("timing")
        if timing is not None:
            # A measured margin can lose to a busy machine's noise once; a real defect fails twice. No other test
            # is rerun (the default tier excludes these: make test), and each says why it depends on timing.
            if not timing.kwargs.get("reason"):
                raise pytest.UsageError(
                    f"{item.nodeid}: @pytest.mark.timing needs reason=... (what margin it measures)"
                )
            item.add_marker(pytest.mark.flaky(reruns=1))
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "multinode" in item.keywords and not os.environ.get("RINGBENCH_MULTINODE"):
            item.add_marker(pytest.mark.skip(reason="needs several hosts (set RINGBENCH_MULTINODE=1 on a cluster)"))
