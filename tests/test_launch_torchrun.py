"""`ringbench run` under torchrun: the launched process group is used (no spawning) and rank 0 writes the run."""

import json
import subprocess
import sys

from ringbench.rank.dist import free_port


def test_torchrun_launch_writes_one_run(tmp_path):
    port = free_port()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(port), "-m", "ringbench", "run", "--world", "2", "--seq", "32", "--heads", "2",
        "--head-dim", "8", "--iters", "2", "--warmup", "1", "--layout", "zigzag", "--buffer", "double", "--kernel", "emulated:50",
        "--out", str(tmp_path), "--json",
    ]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads(done.stdout)  # only rank 0 prints the document
    assert len(document["cases"]) == 1 and document["cases"][0]["passed"] is True
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["launcher"] == "torchrun" and meta["backend"] == "gloo"
