"""The one-GPU check: what only a GPU can confirm, in one command, under one deadline, with one summary.

    benchmarks/gpu_check.sh [OUT_DIR]              # one CUDA GPU: 7 minutes at most, a cold Triton cache included
    benchmarks/gpu_check.sh --gpus N [OUT_DIR]     # a node: the ring, the recorder and the probe on N GPUs (torchrun)
    benchmarks/gpu_check.sh --dry-run [OUT_DIR]    # anywhere: the plan, then every check's code on CPU stand-ins

Checks, in order (benchmarks/gpu_probe.py measures what needs more than a `ringbench` command):
  env            the GPU, its memory, capability and compute mode, torch / CUDA / NCCL / Triton versions, read in a
                 child (this process never initialises CUDA: under EXCLUSIVE_PROCESS it would lock the children out);
  placement      `run --world 2 --device cuda` on one GPU: one line and exit code 2, not an NCCL crash;
  kernels        every Triton variant of kernels and coverage compiled first, side by side (gpu_compile.py), then
                 correctness at realistic blocks (4k tokens, H=32, D=128; fp16 / bf16 / fp32; torch and triton;
                 the full, causal and partial masks of causal-naive and striped rings) against float64, each dtype
                 saying whether it found its variants in the cache;
  timing         one fwd+bwd iteration under torch.cuda.set_sync_debug_mode("error") (bf16; flash, efficient and
                 triton kernels; partial masks; emulated pads; link-delay spins; tracing on); sync and double on the
                 one-rank NCCL loopback, sized by the transfer measured at the shape used, forward and backward:
                 the overlap CUPTI sees, judged relatively (gpu_overlap.py), recorder against profiler edges within
                 max(50 us, 0.5% of the transfer), nccl_ms against the SendRecv kernel and its wait for SMs;
  coverage       world-1 equivalents of the strategies and masks (gpu_coverage.py);
  adapters       torch-ring fp32 and bf16 at world 1 (ring-flash-attn, transformer-engine when installed; one line
                 when not; a torch without the private API torch-ring pins reads "not checked", never FAIL);
  memory         peak memory at S and 2S;
  spin-drift     pads queued behind attention after 20 s of it last their duration (the clock in use: the
                 nanosecond timer, or SM cycles once corrected); the SM-cycle rate at idle and under load;
  calibration    the emulated kernel on the GPU: measured against modelled compute per block;
  gpu-tests      a curated list of gpu-marked tests (GPU_TESTS), on the warm Triton cache.
With ``--gpus N`` (torchrun on one node): env, then the ring on N GPUs (sync, double, allgather; checked against
float64; profiled; `check-timeline`), and the probe's latency / bandwidth matrix.

One global deadline (``--budget``, 420 s): each check gets its share (PLAN) plus what the checks before it left
unused, as long as the later checks keep theirs, and never more than leaves them their minimums (``share_limit``);
the shares and a start-up reserve add up to the default budget (``--dry-run`` prints them). Every child runs in its own process group (session) and is killed as a group -- SIGTERM, then SIGKILL, then
any descendant still alive -- when its time is up. What a killed child had already printed counts. Every summary
line is a measured fact or says plainly what was not checked. Exit code: 0 when nothing failed, 1 when a check
failed, 2 without a GPU (unless --dry-run: the dry run exits 0 when every stand-in ran).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_child import Check, Deadline, json_document, killed_fact, ringbench_command, run_child  # noqa: E402
from gpu_coverage import CHECK_NAMES, coverage_lines  # noqa: E402
from gpu_runs import (  # noqa: E402
    GPU_TESTS,
    check_adapters,
    check_calibration,
    check_gpu_tests,
    check_memory,
    check_placement,
)

PROBE = ROOT / "benchmarks" / "gpu_probe.py"
MULTI_RANK = ("one GPU cannot show multi-rank behaviour (NCCL refuses two ranks on one GPU; see placement): hop "
              "bandwidths, stragglers and ring orders need a node -- run benchmarks/gpu_check.sh --gpus N there")  # fmt: skip


# -- the checks --------------------------------------------------------------------------------------------------
# The device facts, read in a child: initialising CUDA here would hold a context for the whole check, which under
# the EXCLUSIVE_PROCESS compute mode locks every child out of the GPU.
FACTS = """
import json, shutil, subprocess, torch
facts = {"torch": torch.__version__, "cuda": torch.version.cuda or "none", "available": torch.cuda.is_available()}
try:
    import triton
    facts["triton"] = triton.__version__
except ImportError:
    facts["triton"] = "not installed"
if facts["available"]:
    facts["count"] = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    facts.update(name=props.name, memory_gib=props.total_memory / 2**30, capability=[props.major, props.minor])
    try:
        version = torch.cuda.nccl.version()
        facts["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception:
        facts["nccl"] = "unavailable"
    if shutil.which("nvidia-smi"):
        query = "--query-gpu=compute_mode,clocks.sm,clocks.max.sm,power.draw"
        try:
            done = subprocess.run(["nvidia-smi", query, "--format=csv,noheader", "-i", "0"], capture_output=True,
                                  text=True, timeout=20)
            facts["smi"] = done.stdout.strip() or done.stderr.strip()[:200]
        except Exception as exc:  # a fact not read is said so; it stops nothing
            facts["smi"] = f"not read ({type(exc).__name__})"
print("GPU_FACTS " + json.dumps(facts))
"""


def device_facts(timeout_s: float = 90.0) -> dict:
    """torch's view of the GPUs (FACTS), from a child; {} with ``error`` set when the child could not say."""
    child = run_child([sys.executable, "-c", FACTS], timeout_s)
    for line in child.stdout.splitlines():
        if line.startswith("GPU_FACTS "):
            return json.loads(line[len("GPU_FACTS ") :])
    return {"error": killed_fact(child, timeout_s) if child.code is None else f"exit {child.code}: {child.tail()}"}


def check_env(facts: dict, dry: bool, gpus: int) -> Check:
    check = Check("env", ok=True)
    versions = f"torch {facts['torch']}, Triton {facts['triton']}"
    if dry:
        check.ok = None
        check.facts = [f"dry run on {os.cpu_count()} CPU cores: no GPU measured; {versions} (read in a child)"]
        return check
    major, minor = facts["capability"]
    check.facts = [f"{facts['count']} visible GPU(s), checking {gpus}: {facts['name']}, {facts['memory_gib']:.0f} GiB, "
                   f"capability {major}.{minor}; torch {facts['torch']}, CUDA {facts['cuda']}, NCCL {facts['nccl']}, "
                   f"Triton {facts['triton']} (read in a child: this process holds no CUDA context)"]  # fmt: skip
    if facts.get("smi"):
        check.facts.append(f"nvidia-smi (compute mode, SM clock, max SM clock, power): {facts['smi']}")
    return check


def probe_checks(what: str, dry: bool, limit: float, out: Path, names: list[str], env: dict) -> list[Check]:
    """Run one gpu_probe.py subcommand; one Check per measurement it names (missing ones: not checked)."""
    command = [sys.executable, str(PROBE), what, str(out / f"probe-{what}"), *(["--dry-run"] if dry else [])]
    child = run_child(command, limit, env=env)
    by_name = {result["check"]: result for result in child.results}
    checks = []
    for name in names:
        check = Check(name, seconds=child.seconds)
        result = by_name.get(name)
        if result is not None:
            check.ok, check.facts, check.data = result["ok"], result["facts"], result.get("data", {})
        elif child.code is None:
            check.facts = [killed_fact(child, limit)]
        else:  # the child died before it measured this (a dry run too: its code must run)
            check.ok = False
            check.facts = [f"no result: gpu_probe.py {what} exited {child.code}: {child.tail()}"]
        checks.append(check)
    return checks


# -- a node: --gpus N ----------------------------------------------------------------------------------------------
def _torchrun(gpus: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus), "-m",
            "ringbench", *args]  # fmt: skip


def check_node_ring(gpus: int, dry: bool, limit: float, out: Path) -> list[Check]:
    ring, agree = Check("node-ring"), Check("node-timeline")
    shape = ["--seq", str(64 * gpus), "--heads", "2", "--head-dim", "16"] if dry else [
        "--seq", str(8192 * gpus), "--heads", "32", "--head-dim", "128", "--dtype", "bfloat16"]  # fmt: skip
    device = ["--device", "cpu"] if dry else ["--device", "cuda"]
    strategies = [arg for spec in node_strategies(gpus) for arg in ("--strategy", spec)]
    child = run_child(_torchrun(gpus, "run", "--world", str(gpus), *device, *shape, "--buffer", "sync", "--buffer",
                                "double", *strategies, "--mask", "causal", "--layout", "zigzag", "--kernel", "torch",
                                "--iters", "3", "--warmup", "2", "--profile", "--out", str(out), "--json"),
                      0.8 * limit, env={"TORCH_NCCL_ENABLE_TIMING": "1", "OMP_NUM_THREADS": "1", **FLIGHT_RECORDER,
                                        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(out / "nccl_trace_rank_")})  # fmt: skip
    ring.seconds = child.seconds
    document = json_document(child.stdout)
    if child.code is None or child.code != 0 or not document.get("cases"):
        ring.ok = None if child.code is None else False
        ring.facts = [
            killed_fact(child, limit) if child.code is None else f"torchrun exited {child.code}: {child.tail()}"
        ]
        dumps = sorted(out.glob("nccl_trace_rank_*"))
        if dumps:  # an NCCL timeout: what each rank's communicators had in flight (torch's flight recorder)
            ring.facts.append(f"NCCL flight-recorder dumps: {', '.join(str(p) for p in dumps[:8])} (several "
                              "communicators run at once on each GPU: a hang in their order, or in NCCL's "
                              "concurrency, shows there)")  # fmt: skip
        agree.facts = ["not checked: the ring run did not finish"]
        return [ring, agree]
    meta = json.loads((Path(document["run_dir"]) / "meta.json").read_text())
    ring.facts = [f"{gpus} ranks ({meta.get('backend')}, {meta.get('device_kind')}, NCCL options "
                  f"{meta.get('nccl_options')}): " + "; ".join(
                      f"{c['strategy']} {c['buffer']} step {c['step_ms']:.2f} ms, exposed {100 * (c['exposed_comm_frac'] or 0):.1f}%,"
                      f" check {'pass' if c['passed'] else 'FAIL'}" for c in document["cases"])]  # fmt: skip
    ring.ok = all(c["passed"] for c in document["cases"]) and (dry or meta.get("backend") == "nccl")
    if dry:
        ring.ok = None if ring.ok else False
    left = limit - child.seconds  # check-timeline shares node-ring's time: the whole check keeps its one deadline
    if left < 10.0:
        agree.facts = [f"not checked: node-ring's share left {max(left, 0):.0f} s for check-timeline (needs 10 s)"]
        return [ring, agree]
    timeline = run_child(ringbench_command("check-timeline", document["run_dir"], "--json"), left)
    agree.seconds = timeline.seconds
    result = json_document(timeline.stdout)
    kinds = result.get("kinds") or []
    agree.facts = [f"check-timeline: {k['kind']} {k['matched']} pairs, |dstart| median {_ms(k['start_median_ms'])}, "
                   f"|dduration| median {_ms(k['duration_median_ms'])}, overlap recorded/profiled "
                   f"{_share(k['recorded_overlap'])}/{_share(k['profiled_overlap'])}: "
                   f"{'pass' if k['passed'] else 'FAIL'}" for k in kinds] or [
        f"check-timeline exited {timeline.code}: {timeline.tail()}"]  # fmt: skip
    agree.ok = timeline.code == 0 if not dry else None
    ring.data["strategies"] = judge_strategies(document["cases"], result.get("cases") or [], dry)
    return [ring, agree]


def node_strategies(gpus: int) -> list[str]:
    """Every strategy at ``gpus`` ranks: the grouped ones at the smallest degree that makes both a group and a ring
    across groups (none for a prime count: said in the coverage lines)."""
    degree = next((d for d in range(2, gpus) if gpus % d == 0), None)
    grouped = [f"hybrid:{degree}", f"double-ring:{degree}"] if degree else []
    return ["ring", "ulysses", *grouped, "allgather"]


def judge_strategies(cases: list[dict], timeline_cases: list[dict], dry: bool) -> dict:
    """Per strategy: exact at N ranks, and (with sync and double) whether double hid the transfers CUPTI saw:
    the share of the receive spans during which the rank computed, from check-timeline's profiled side."""
    overlap = {row["case_id"]: row.get("profiled_overlap") for row in timeline_cases if row.get("kind") == "recv"}
    judged: dict[str, dict] = {}
    for case in cases:
        entry = judged.setdefault(case["strategy"], {"passed": True, "overlap": {}})
        entry["passed"] = entry["passed"] and bool(case["passed"])
        entry["overlap"][case["buffer"]] = overlap.get(case["case_id"])
    for entry in judged.values():
        sync, double = entry["overlap"].get("sync"), entry["overlap"].get("double")
        if sync is None or double is None or dry:
            entry["overlap_ok"] = None
        else:
            entry["overlap_ok"] = double >= sync + 0.2  # double must hide what sync exposes
    return judged


def _ms(value) -> str:
    return "n/a" if value is None else f"{1e3 * value:.1f} us" if value < 1 else f"{value:.2f} ms"


def _share(value) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def check_node_probe(gpus: int, dry: bool, limit: float, out: Path) -> Check:
    check = Check("node-probe")
    sizes = "8,64KiB" if dry else "8,64MiB"
    device = ["--device", "cpu"] if dry else ["--device", "cuda"]
    child = run_child(_torchrun(gpus, "probe", "--world", str(gpus), *device, "--sizes", sizes, "--round-trips", "5",
                                "--out", str(out), "--json"), limit, env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    check.seconds = child.seconds
    document = json_document(child.stdout)
    if child.code != 0 or "latency_us" not in document:
        check.ok = None if child.code is None else False
        check.facts = [
            killed_fact(child, limit) if child.code is None else f"probe exited {child.code}: {child.tail()}"
        ]
        return check
    latency = [v for row in document["latency_us"] for v in row if v is not None]
    bandwidth = [v for row in document["bandwidth_gbps"] for v in row if v is not None]
    check.facts = [f"probe over {gpus} ranks ({document.get('backend')}, timed by {document.get('timing')}): latency "
                   f"{min(latency):.1f}-{max(latency):.1f} us, bandwidth {min(bandwidth):.3g}-{max(bandwidth):.3g} "
                   f"GB/s at {sizes.split(',')[-1]} over {len(bandwidth)} ordered pairs"]  # fmt: skip
    check.ok = None if dry else True
    return check


# -- the whole check -----------------------------------------------------------------------------------------------
PLAN = [  # (name, share s, minimum s): the order is the order of value if the deadline bites
    ("placement", 12, 8), ("kernels", 125, 50), ("timing", 70, 30), ("coverage", 70, 25), ("adapters", 25, 10),
    ("memory", 20, 8), ("spin-drift", 33, 25), ("calibration", 20, 10), ("gpu-tests", 30, 15),
]  # fmt: skip
BUDGET_S = 420.0
STARTUP_S = 15.0  # interpreter start, the device-facts child, the summary: outside every share
NODE_PLAN = [("node-ring", 240, 60), ("node-probe", 120, 30)]
# torch's NCCL flight recorder: a node run that times out leaves each rank's last collectives and P2P per
# communicator (review D6: several communicators are in flight on each GPU at once).
FLIGHT_RECORDER = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "NCCL_DEBUG": "WARN"}
# The dry run measures nothing, so it runs the stand-ins side by side and the three probes in one process.
DRY_PLAN = [("placement", 40, 10), ("probes", 100, 30), ("coverage", 90, 20), ("adapters", 60, 15),
            ("memory", 60, 15), ("calibration", 60, 15), ("gpu-tests", 100, 30)]  # fmt: skip
KERNEL_CHECKS = ["triton-compile", "correctness-float16", "correctness-bfloat16", "correctness-float32"]


def share_limit(plan, index: int, left_s: float) -> float:
    """The seconds check ``index`` may take with ``left_s`` left: its share plus what the checks before it left
    unused, as long as every later check keeps its full share; when time is short, its share as far as the later
    checks' minimums allow (5 s of each kill's grace kept aside)."""
    _, share, _ = plan[index]
    later_shares = sum(s for _, s, _ in plan[index + 1 :])
    later_minimums = sum(m for _, _, m in plan[index + 1 :])
    return min(left_s - later_minimums - 5.0, max(share, left_s - later_shares - 5.0))


def plan_lines(budget_s: float) -> list[str]:
    """The one-GPU plan as the dry run prints it: each check's share, and whether they add up to the budget."""
    shares = sum(share for _, share, _ in PLAN)
    lines = ["plan on one GPU (share / minimum, s): " + ", ".join(f"{n} {s:g}/{m:g}" for n, s, m in PLAN)]
    total = shares + STARTUP_S
    fits = "adds up to" if total == budget_s else ("fits in" if total < budget_s else "is MORE than")
    lines.append(f"  shares {shares:g} s + start-up and summary {STARTUP_S:g} s = {total:g} s, which {fits} the "
                 f"budget of {budget_s:g} s" + ("" if total <= budget_s else ": the last checks get their minimum "
                                                "or nothing"))  # fmt: skip
    lines.append(f"  gpu-tests: {len(GPU_TESTS)} curated gpu-marked tests on the warm Triton cache:")
    lines += [f"    {test}" for test in GPU_TESTS]
    return lines


def main(argv: list[str] | None = None) -> int:
    started = Deadline(float("inf"))  # the budget counts from here: interpreter and torch start-up included
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU stand-ins (no GPU needed); exit 0 when they run")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of this node to check (>1: torchrun)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole check (one deadline)")
    parser.add_argument("out", nargs="?", default=None, help="folder for the runs, traces and summary.json")
    args = parser.parse_args(argv)
    facts = device_facts()
    if "error" in facts:
        print(f"gpu_check: could not read the device facts (python -c FACTS: {facts['error']}); nothing was checked",
              file=sys.stderr)  # fmt: skip
        return 2
    count = facts.get("count", 0) if facts["available"] else 0
    if not count and not args.dry_run:
        print("gpu_check: no CUDA device is visible (torch.cuda.is_available() is False); nothing was checked -- "
              "run with --dry-run for the CPU stand-ins", file=sys.stderr)  # fmt: skip
        return 2
    if args.gpus < 1 or (count and not args.dry_run and args.gpus > count):
        print(f"gpu_check: --gpus {args.gpus} is not allowed; expected 1 to {count or 1} (the GPUs visible here)",
              file=sys.stderr)  # fmt: skip
        return 2
    dry = args.dry_run
    deadline = Deadline(args.budget)
    deadline.started = started.started
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ringbench-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="triton-cold-", dir=out))  # a cold Triton cache, for the whole check
    env = {"TRITON_CACHE_DIR": str(cache), "TORCH_NCCL_ENABLE_TIMING": "1", "OMP_NUM_THREADS": "1"}
    if dry:
        env["TRITON_INTERPRET"] = "1"
    label = "DRY RUN (CPU stand-ins)" if dry else facts["name"]
    print(f"gpu_check: {label}; budget {args.budget:.0f} s; out {out}", flush=True)
    if dry and args.gpus == 1:
        print("\n".join(plan_lines(args.budget)), flush=True)
    checks = [check_env(facts, dry, args.gpus)]
    plan = NODE_PLAN if args.gpus > 1 else (DRY_PLAN if dry else PLAN)
    if dry:  # nothing measured, nothing to disturb: the stand-ins run side by side, each within its share
        checks += _run_side_by_side(plan, dry, deadline, out, env, args.gpus)
    for index, (name, _, minimum) in enumerate(plan if not dry else []):
        limit = share_limit(plan, index, deadline.left())
        if limit < minimum:
            checks.append(Check(name, facts=[f"not checked: the deadline left {max(limit, 0):.0f} s (needs "
                                             f"{minimum} s)"]))  # fmt: skip
            continue
        found = _run(name, dry, limit, out, env, args.gpus)
        for check in found:
            checks.append(check)
            _show(check)
    if args.gpus == 1:
        checks.append(Check("multi-rank", facts=[MULTI_RANK]))
    node_plan = _node_plan(checks)  # adds a check per strategy of a node run
    covered = coverage_lines({c.name: (c.ok, (c.facts or [""])[0]) for c in checks}, node_plan)
    failed = [c for c in checks if c.ok is False]
    passed = [c for c in checks if c.ok]
    summary = {"dry_run": dry, "device": label, "gpus": args.gpus, "budget_s": args.budget,
               "seconds": round(deadline.elapsed(), 1), "passed": not failed, "checks": [c.as_dict() for c in checks],
               "coverage": [{"item": item, "ok": ok, "line": line} for item, ok, line in covered],
               "compile_s": _compile_seconds(checks), "command": shlex.join(sys.argv)}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"\ngpu_check summary ({label}, {deadline.elapsed():.0f} s of a {args.budget:.0f} s budget):")
    for check in checks:
        mark = {True: "ok", False: "FAIL", None: "--"}[check.ok]
        for i, fact in enumerate(check.facts or ["(no facts)"]):
            print(f"  [{mark:>4}] {check.name}: {fact}" if i == 0 else f"         {' ' * len(check.name)}  {fact}")
    print(
        f"coverage ({'one GPU' if args.gpus == 1 else f'{args.gpus} GPUs'}; cold Triton compile: "
        f"{_compile_seconds(checks)}):"
    )
    for item, ok, line in covered:
        print(f"  [{ {True: 'ok', False: 'FAIL', None: '--'}[ok]:>4}] {item}: {line}")
    unchecked = len(checks) - len(failed) - len(passed)  # (a coverage line fails only with a check it names)
    print(f"gpu_check: {len(passed)} passed, {len(failed)} failed, {unchecked} not checked"
          f"{' (dry run: nothing was measured on a GPU)' if dry else ''}; details in {out / 'summary.json'}")  # fmt: skip
    return 1 if failed else 0


def _compile_seconds(checks: list[Check]) -> str:
    compiled = next((c for c in checks if c.name == "triton-compile"), None)
    if compiled is None or not compiled.data.get("seconds"):
        return "not measured"
    per = ", ".join(f"{k} {v:.1f} s" for k, v in compiled.data["seconds"].items())
    return f"{compiled.data.get('wall_s', 0):.1f} s ({per})"


def _node_plan(checks: list[Check]) -> dict | None:
    """Coverage at N ranks: each strategy from the node run (exact, and double against sync as CUPTI saw it)."""
    ring = next((c for c in checks if c.name == "node-ring"), None)
    if ring is None:
        return None
    judged = ring.data.get("strategies") or {}
    plan: dict = {}
    for spec in ("ring", "ulysses", "hybrid", "double-ring", "allgather"):
        found = {name: entry for name, entry in judged.items() if name.split(":")[0] == spec}
        if not found:
            why = ring.facts[0] if ring.ok is not True and ring.facts else "no strategy of that kind at this world"
            plan[f"strategy {spec}"] = f"not checked: {why[:160]}"
            continue
        name, entry = next(iter(found.items()))
        key = f"node:{name}"
        plan[f"strategy {name}"] = [key]
        overlap = entry["overlap"]
        note = (f"sync {overlap.get('sync')} vs double {overlap.get('double')} (CUPTI receive overlap)"
                if entry["overlap_ok"] is not None else "overlap not judged (one buffer, or no CUPTI trace)")  # fmt: skip
        ok = False if not entry["passed"] or entry["overlap_ok"] is False else (True if ring.ok else None)
        checks.append(Check(key, ok=ok, facts=[f"exact at N ranks: {'pass' if entry['passed'] else 'FAIL'}; {note}"]))
    plan["masks"] = "at N ranks the node run takes the causal mask; the one-GPU check covers every mask's kernels"
    return plan


def _run_side_by_side(plan, dry: bool, deadline: Deadline, out: Path, env: dict, gpus: int, jobs: int = 3):
    from concurrent.futures import ThreadPoolExecutor

    futures, found = [], []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for name, share, minimum in plan:
            limit = min(share, deadline.left() - 5.0)
            if limit < minimum:
                futures.append(Check(name, facts=[f"not checked: the deadline left {max(limit, 0):.0f} s (needs "
                                                  f"{minimum} s)"]))  # fmt: skip
                continue
            futures.append(pool.submit(_run, name, dry, limit, out, env, gpus))
        for future in futures:
            found += [future] if isinstance(future, Check) else future.result()
    for check in found:
        _show(check)
    return found


def _show(check: Check) -> None:
    mark = {True: "ok", False: "FAIL", None: "--"}[check.ok]
    print(f"  [{mark:>4}] {check.name} ({check.seconds:.0f} s): {check.facts[0] if check.facts else ''}", flush=True)


def _run(name: str, dry: bool, limit: float, out: Path, env: dict, gpus: int) -> list[Check]:
    if name == "placement":
        return [check_placement(dry, limit)]
    if name == "kernels":
        return probe_checks("kernels", dry, limit, out, KERNEL_CHECKS, env)
    if name == "timing":
        return probe_checks("timing", dry, limit, out, ["no-host-sync", "overlap"], env)
    if name == "adapters":
        return [check_adapters(dry, limit, out)]
    if name == "memory":
        return [check_memory(dry, limit, out)]
    if name == "spin-drift":
        return probe_checks("drift", dry, limit, out, ["spin-drift"], env)
    if name == "probes":
        return probe_checks("all", dry, limit, out, [*KERNEL_CHECKS, "no-host-sync", "overlap", "spin-drift"], env)
    if name == "coverage":
        return probe_checks("coverage", dry, limit, out, CHECK_NAMES, env)
    if name == "calibration":
        return [check_calibration(dry, limit, out)]
    if name == "gpu-tests":
        return [check_gpu_tests(dry, limit, env)]
    if name == "node-ring":
        return check_node_ring(gpus, dry, limit, out)
    if name == "node-probe":
        return [check_node_probe(gpus, dry, limit, out)]
    raise ValueError(name)


if __name__ == "__main__":
    sys.exit(main())
