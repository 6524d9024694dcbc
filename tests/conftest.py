import os

import pytest
import torch

# One thread per process: tests launch several ranks on 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if "multinode" in item.keywords and not os.environ.get("RINGBENCH_MULTINODE"):
            item.add_marker(pytest.mark.skip(reason="needs several hosts (set RINGBENCH_MULTINODE=1 on a cluster)"))
