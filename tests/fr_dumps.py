"""Real flight-recorder dumps of stuck jobs, made on CPU (gloo) with torch's own recorder.

torch 2.13's flight recorder (``TORCH_FR_BUFFER_SIZE`` entries per process) records gloo's collectives -- all_to_all,
all_gather, all_reduce, barrier -- but not its point-to-point sends and receives. So the ring here rotates its
blocks the way torch's own ring attention does with all-to-all (each rank's input split sends its block to the next
rank only), and one rank stops before a chosen ring step: the others block in that step's all-to-all. Every rank
then dumps its recorder (``torch._C._distributed_c10d._dump_fr_trace_json`` and ``_dump_fr_trace``, the pickled
form torch writes by default) from a watchdog thread and leaves; the gloo timeout bounds the wait.

    python tests/fr_dumps.py OUT [--world 4] [--stuck-rank 2] [--stuck-step 2] [--no-ring]

``--no-ring``: all-reduces and a barrier only (a job with no ring: the dumps the import refuses).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from pathlib import Path

BUFFER = "2000"
DUMP_AFTER_S = 3.0


def _dump(folder: Path, rank: int) -> None:
    import torch._C._distributed_c10d as c10d

    (folder / f"rank{rank}.json").write_bytes(c10d._dump_fr_trace_json())
    (folder / f"nccl_trace_rank_{rank}").write_bytes(c10d._dump_fr_trace())


def _rank(rank: int, world: int, folder: str, port: int, stuck_rank: int, stuck_step: int, ring: bool) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = BUFFER
    out = Path(folder)

    def dump_and_leave() -> None:
        _dump(out, rank)
        threading.Event().wait(
            2.0
        )  # every rank dumps before any leaves (a rank that leaves closes its peers' connections)
        os._exit(0)

    watchdog = threading.Timer(DUMP_AFTER_S, dump_and_leave)
    watchdog.daemon = True
    watchdog.start()
    with contextlib.suppress(RuntimeError):  # a peer left first: wait for this rank's own dump all the same
        _ring(rank, world, port, stuck_rank, stuck_step, ring)
    threading.Event().wait(30.0)  # a finished (or failed) rank waits for the watchdog's dump and exit


def _ring(rank: int, world: int, port: int, stuck_rank: int, stuck_step: int, ring: bool) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))  # fmt: skip
    block = torch.full((2, 4, 16), float(rank))  # (K and V, heads, tokens): one rank's block
    for iteration in range(2):
        dist.all_reduce(torch.ones(1))  # the step's loss, say: a collective between ring passes
        for step in range(world - 1):
            if not ring:
                dist.all_reduce(block)
                continue
            if rank == stuck_rank and iteration == 1 and step == stuck_step:
                threading.Event().wait(30.0)  # stuck in its own code: never posts this step (the watchdog ends it)
            splits = [block.numel() if peer == (rank + 1) % world else 0 for peer in range(world)]
            arrives = [block.numel() if peer == (rank - 1) % world else 0 for peer in range(world)]
            received = torch.empty_like(block).reshape(-1)
            dist.all_to_all_single(received, block.reshape(-1), arrives, splits)
            block = received.reshape(block.shape)
    dist.barrier()


def main() -> int:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--stuck-rank", type=int, default=2)
    parser.add_argument("--stuck-step", type=int, default=1)
    parser.add_argument("--no-ring", action="store_true")
    parser.add_argument("--port", type=int, default=29731)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_rank, args=(args.world, str(args.out), args.port, args.stuck_rank, args.stuck_step,
                                    not args.no_ring), nprocs=args.world, start_method="spawn")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
