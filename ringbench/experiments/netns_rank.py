"""One rank of a network-namespace run (`ringbench.experiments.netns`): ``python -m ringbench.experiments.netns_rank``.

Reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT (as torchrun sets them) and RINGBENCH_NETNS_SPEC (a
JSON file: the cases and the run settings), joins the gloo group on the namespace's interface (GLOO_SOCKET_IFNAME),
runs each case with `ringbench.rank.runner.run_case` and prints one ``RINGBENCH_NETNS_RESULT {json}`` line per case.
Errors go to stderr as one line, with exit code 1.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    import torch.distributed as dist

    from ringbench.experiments.netns import RESULT_PREFIX
    from ringbench.rank.dist import init_launched
    from ringbench.rank.runner import RunSettings, open_session, run_case
    from ringbench.scenario.scenario import Case

    with open(os.environ["RINGBENCH_NETNS_SPEC"], encoding="utf-8") as handle:
        spec = json.load(handle)
    settings = RunSettings(**spec["settings"])
    env = init_launched(settings.timeout, "cpu")
    session = open_session(env)
    for index, fields in enumerate(spec["cases"]):
        case = Case.from_axes(**fields)
        result = run_case(case, session=session, progress=None, settings=settings, case_index=index, repeat=0)
        sys.stdout.write(RESULT_PREFIX + json.dumps(result.to_dict()) + "\n")
        sys.stdout.flush()
    dist.barrier()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        code = main()
    except BaseException as exc:  # one line for the parent
        text = str(exc).strip()
        sys.stderr.write((text.splitlines()[0] if text else type(exc).__name__) + "\n")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: gloo threads must not keep the process alive
