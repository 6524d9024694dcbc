"""Validate `ringbench plan`'s predictions against published measurements of context-parallel attention.

    python benchmarks/validate_published.py                    # every table of benchmarks/published/tables.yaml
    python benchmarks/validate_published.py --table usp-l20-pcie --rows
    python benchmarks/validate_published.py --dev             # the dev set the framework families were fitted on
    python benchmarks/validate_published.py --json > validation.json

For every row of every table, the configurations it measured are priced as `ringbench plan` prices its candidates
(the catalogue's PRIOR figures for the table's GPU, attention kernel and implementation family -- `framework:`, the
families' host times fitted on the dev set only -- and the table's topology; nothing fitted to the table), and set
beside the measured values. Per table it prints:

  first choice   rows where the configuration predicted fastest measures within 10 % of the measured best
                 (regret = measured time of the predicted best / measured best - 1)
  Spearman       the pooled rank correlation between predicted and measured time over every (row, configuration),
                 each time divided by its row's geometric mean first, so that the rows' own scale (sequence
                 length, world) does not count and only the order within rows does; and the mean of the rows' own
  |error|        the median over every (row, configuration) of |predicted / measured absolute time - 1|
  acceptance     first choice within 10 % in at least 7 rows of 8 and pooled Spearman >= 0.8

Over every held-out table together (the issue's targets): first choice within 10 % in >= 85 % of the rows, pooled
Spearman >= 0.85, median |error| <= 20 %.

Times: ``iters_per_s`` tables give 1 / value per iteration; ``tflops_per_gpu`` tables (MagiAttention's) the
FLOPs 4 x mask area x batch x heads x head dim (causal area S (S + 1) / 2; the backward 2.5 x) over value x 1e12
x world, as the source computes them. Ties in the measurements are not resolved: published differences under about
4 % are noise.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import yaml
from scipy.stats import spearmanr

from ringbench.advise.planner import PlanRequest, price_configurations
from ringbench.scenario.workload import Workload

HERE = Path(__file__).resolve().parent / "published"
WITHIN = 0.10
FIRST_SHARE = 7 / 8
SPEARMAN = 0.8
TARGETS = {"first_share": 0.85, "spearman": 0.85, "median_error": 0.20}  # over every held-out table together


def _request(table: dict, row: dict, topology: Path) -> tuple[PlanRequest, str]:
    fields = {**table.get("workload", {}), **{k: v for k, v in row.items() if k != "measured"}}
    world = int(fields["world"])
    seq = int(fields.get("seq") or fields["seq_per_rank"] * world)
    phase = str(fields.get("pass", "fwd"))
    backward = bool(fields.get("backward", phase != "fwd"))
    workload = Workload(world=world, seq=seq, heads=int(fields["heads"]), kv_heads=int(fields.get("kv_heads", 0)),
                        head_dim=int(fields["head_dim"]), batch=int(fields.get("batch", 1)),
                        dtype=str(fields.get("dtype", "bfloat16")), mask=str(fields.get("mask", "causal")),
                        layout=str(fields.get("layout", "zigzag")), docs=_docs(fields))  # fmt: skip
    request = PlanRequest(workload=workload, topology=topology, backward=backward, gpu=str(fields["gpu"]),
                          attention=fields.get("attention"), detect=False,
                          framework=fields.get("framework"))  # fmt: skip
    return request, phase


def _docs(fields: dict) -> str:
    """The row's documents spec, a ``file:`` path taken from this folder."""
    docs = str(fields.get("docs", "none"))
    return f"file:{HERE / docs[5:]}" if docs.startswith("file:") and not Path(docs[5:]).is_absolute() else docs


def measured_ms_of(table: dict, row: dict, value: float) -> float:
    """The absolute time (ms) a published value stands for (module docstring)."""
    if table.get("metric", "iters_per_s") == "iters_per_s":
        return 1e3 / value
    fields = {**table.get("workload", {}), **row}
    world = int(fields["world"])
    seq = int(fields.get("seq") or fields["seq_per_rank"] * world)
    mask = str(fields.get("mask", "causal"))
    lengths = [seq]
    if "document" in mask:
        from ringbench.engine.documents import documents

        lengths = list(documents(_docs(fields), seq).lengths)
    area = sum(n * n if mask.startswith(("none", "full")) else n * (n + 1) / 2 for n in lengths)
    flops = 4 * area * int(fields.get("batch", 1)) * int(fields["heads"]) * int(fields["head_dim"])
    flops *= {"fwd": 1.0, "bwd": 2.5}.get(str(fields.get("pass", "fwd")), 3.5)
    return flops / (value * 1e12 * world) * 1e3


def _predicted_ms(candidate, phase: str) -> float:
    if phase == "fwd":
        return candidate.fwd_ms
    if phase == "bwd":
        return candidate.bwd_ms
    return candidate.step_ms


def validate_table(table: dict, framework=None) -> dict:
    """Every row of ``table``: predicted and measured times per configuration, first-choice regret, Spearman, the
    errors of absolute time. ``framework``: a Framework replacing the table's family (the fit's trial values)."""
    rows = []
    for row in table["rows"]:
        fields = {**table, **row}
        topology = (HERE / fields["topology"]).resolve()
        request, phase = _request({"workload": {**table.get("workload", {}), "gpu": fields["gpu"],
                                                "attention": fields.get("attention"),
                                                "framework": fields.get("framework")}}, row, topology)  # fmt: skip
        measured = {label: float(value) for label, value in row["measured"].items()}
        configs = {label: table["configs"][label] for label in measured}
        priced = price_configurations(request, configs, found_gpus=[], framework=framework)
        predicted = {label: _predicted_ms(priced[label], phase) for label in measured}
        measured_ms = {label: measured_ms_of(table, row, value) for label, value in measured.items()}
        best_predicted = min(predicted, key=predicted.get)
        best_measured = min(measured_ms, key=measured_ms.get)
        regret = measured_ms[best_predicted] / measured_ms[best_measured] - 1
        labels = list(measured)
        rho = spearmanr([predicted[k] for k in labels], [measured_ms[k] for k in labels]).statistic if len(labels) > 2 \
            else (1.0 if (best_predicted == best_measured) else -1.0)  # fmt: skip
        errors = {label: predicted[label] / measured_ms[label] - 1 for label in labels}
        rows.append({"row": {k: v for k, v in row.items() if k != "measured"}, "measured": measured,
                     "predicted_ms": predicted, "measured_ms": measured_ms, "errors": errors,
                     "first_choice": best_predicted, "measured_best": best_measured,
                     "regret": regret, "spearman": float(rho) if rho == rho else math.nan})  # fmt: skip
    pooled_predicted, pooled_measured = [], []
    for entry in rows:
        labels = list(entry["measured"])
        p = np.array([entry["predicted_ms"][k] for k in labels])
        m = np.array([1.0 / entry["measured"][k] for k in labels])
        pooled_predicted += list(p / np.exp(np.log(p).mean()))
        pooled_measured += list(m / np.exp(np.log(m).mean()))
    pooled = float(spearmanr(pooled_predicted, pooled_measured).statistic)
    within = sum(entry["regret"] <= WITHIN for entry in rows)
    share = within / len(rows)
    errors = [abs(e) for entry in rows for e in entry["errors"].values()]
    return {"id": table["id"], "title": table["title"], "source": table["source"], "rows": rows,
            "publisher": table.get("publisher") or table["id"], "framework": table.get("framework") or "ringbench",
            "first_choice_within": within, "row_count": len(rows), "pooled_spearman": pooled,
            "mean_row_spearman": float(np.nanmean([r["spearman"] for r in rows])),
            "median_abs_error": float(np.median(errors)), "pooled": (pooled_predicted, pooled_measured),
            "passes": share >= FIRST_SHARE and pooled >= SPEARMAN}  # fmt: skip


def overall(results: list[dict]) -> dict:
    """The issue's figures over every table together: rows within 10 %, the pooled Spearman (each row normalised
    as in each table), the median |error| of absolute time, and whether each meets its target."""
    rows = sum(r["row_count"] for r in results)
    within = sum(r["first_choice_within"] for r in results)
    predicted = [v for r in results for v in r["pooled"][0]]
    measured = [v for r in results for v in r["pooled"][1]]
    errors = [abs(e) for r in results for entry in r["rows"] for e in entry["errors"].values()]
    out = {"tables": len(results), "rows": rows, "first_choice_within": within, "first_share": within / rows,
           "pooled_spearman": float(spearmanr(predicted, measured).statistic),
           "median_abs_error": float(np.median(errors))}  # fmt: skip
    out["meets"] = {"first_share": out["first_share"] >= TARGETS["first_share"],
                    "spearman": out["pooled_spearman"] >= TARGETS["spearman"],
                    "median_error": out["median_abs_error"] <= TARGETS["median_error"]}  # fmt: skip
    return out


def by_publisher(results: list[dict]) -> dict[str, dict]:
    """The issue's figures per publisher: tables of one publisher are one source, not independent of each other."""
    groups: dict[str, list[dict]] = {}
    for result in results:
        groups.setdefault(result["publisher"], []).append(result)
    return {publisher: overall(tables) | {"table_ids": [t["id"] for t in tables]}
            for publisher, tables in groups.items()}  # fmt: skip


def _row_text(entry: dict) -> str:
    row = entry["row"]
    shape = ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("topology",))
    cells = "  ".join(f"{label} {entry['predicted_ms'][label]:,.2f} | {entry['measured_ms'][label]:,.2f} ms"
                      for label in entry["measured"])  # fmt: skip
    return (
        f"  {shape}\n    predicted | measured: {cells}\n    first choice {entry['first_choice']} (measured best "
        f"{entry['measured_best']}, regret {100 * entry['regret']:.1f}%), Spearman {entry['spearman']:.2f}"
    )


def _markdown(result: dict) -> str:
    """One table: a line per row, each configuration's predicted ms beside its measured value, then the verdict."""
    labels = list(dict.fromkeys(label for entry in result["rows"] for label in entry["measured"]))
    lines = [f"**{result['id']}**: {result['title']}", "",
             "| row | " + " | ".join(f"{label} predicted ms / measured" for label in labels) +
             " | first choice (measured best, regret) | Spearman |",
             "|---|" + "---:|" * len(labels) + "---|---:|"]  # fmt: skip
    for entry in result["rows"]:
        row = ", ".join(f"{k}={v}" for k, v in entry["row"].items() if k not in ("topology", "gpu", "attention"))
        cells = [f"{entry['predicted_ms'][k]:,.1f} / {entry['measured'][k]:g}" if k in entry["measured"] else "-"
                 for k in labels]  # fmt: skip
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {entry['first_choice']} ({entry['measured_best']}, "
                     f"{100 * entry['regret']:.1f}%) | {entry['spearman']:.2f} |")  # fmt: skip
    lines += ["", f"First choice within {100 * WITHIN:.0f}% of the measured best in {result['first_choice_within']} of "
              f"{result['row_count']} rows; pooled Spearman {result['pooled_spearman']:.2f} (rows' mean "
              f"{result['mean_row_spearman']:.2f}); median |error| of absolute time "
              f"{100 * result['median_abs_error']:.0f}% (framework {result['framework']}): "
              f"{'PASS' if result['passes'] else 'FAIL'}.", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="append", help="only this table id (repeatable)")
    parser.add_argument("--rows", action="store_true", help="print every row")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--markdown", action="store_true", help="markdown tables (docs/plan.md)")
    parser.add_argument("--dev", action="store_true", help="the dev set (dev.yaml) instead of the held-out tables")
    args = parser.parse_args()
    document = yaml.safe_load((HERE / ("dev.yaml" if args.dev else "tables.yaml")).read_text())
    results = [validate_table(t) for t in document["tables"] if not args.table or t["id"] in args.table]
    summary = overall(results)
    publishers = by_publisher(results)
    if args.json:
        for group in publishers.values():
            group.pop("meets")
        for result in results:
            result.pop("pooled")
        print(json.dumps({"format": "ringbench-validate-published", "format_version": 3, "tables": results,
                          "publishers": publishers, "overall": summary}, indent=1, default=str))  # fmt: skip
        return
    if args.markdown:
        for result in results:
            print(_markdown(result))
        return
    for result in results:
        print(f"{result['id']}: {result['title']}")
        if args.rows:
            for entry in result["rows"]:
                print(_row_text(entry))
        print(
            f"  first choice within {100 * WITHIN:.0f}% of the measured best in {result['first_choice_within']} "
            f"of {result['row_count']} rows; pooled Spearman {result['pooled_spearman']:.2f} (rows' mean "
            f"{result['mean_row_spearman']:.2f}); median |error| {100 * result['median_abs_error']:.0f}% "
            f"(framework {result['framework']}); {'PASS' if result['passes'] else 'FAIL'} (>= 7/8 rows and >= 0.8)"
        )
    passed = sum(r["passes"] for r in results)
    print(f"{passed} of {len(results)} tables pass")
    print(f"Per publisher ({len(publishers)} independent sources):")
    for publisher, group in publishers.items():
        print(f"  {publisher} ({', '.join(group['table_ids'])}): first choice within {100 * WITHIN:.0f}% in "
              f"{group['first_choice_within']} of {group['rows']} rows; pooled Spearman {group['pooled_spearman']:.2f};"
              f" median |error| {100 * group['median_abs_error']:.0f}%")  # fmt: skip
    meets = summary["meets"]
    print(
        f"Over all {summary['tables']} tables: first choice within {100 * WITHIN:.0f}% in "
        f"{summary['first_choice_within']} of {summary['rows']} rows ({100 * summary['first_share']:.0f}%, target "
        f">= 85%: {'met' if meets['first_share'] else 'MISSED'}); pooled Spearman {summary['pooled_spearman']:.2f} "
        f"(target >= 0.85: {'met' if meets['spearman'] else 'MISSED'}); median |error| of absolute time "
        f"{100 * summary['median_abs_error']:.0f}% (target <= 20%: {'met' if meets['median_error'] else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
