"""Fit the attention kernel model (ringbench/hardware/kernel.py) to the catalogue's measured curves, and print it.

    python benchmarks/fit_kernel_rates.py            # every kernel and architecture with curves: fitted parameters,
                                                     # the stored ones, and each curve's worst error under both
    python benchmarks/fit_kernel_rates.py --yaml     # the fitted parameters as catalogue.yaml lines

The curves are FlashAttention's benchmark shape (batch x seqlen = 16k tokens, hidden 2048, so 2048 / head dim
heads), read from the published figures (catalogue.yaml names each source). Fitted in log space (relative errors),
with bounds that keep every parameter physical (matmul efficiency <= 1). The forward's exp_per_entry is fixed at 1
(one exponential per score entry): forward-only curves at one or two head dims cannot separate it from the matmul
efficiency (kernels whose schedule overlaps the exponentials with the matmuls, ``fit_forward_exp: true``, fit it,
within the bound matmul efficiency <= 1). The backward's is fitted where curves of two head dims exist, else taken
from the ampere fit.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
from scipy.optimize import least_squares

from ringbench.hardware.catalogue import load_catalogue
from ringbench.hardware.kernel import PassModel, benchmark_tflops

NAMES = ("matmul_efficiency", "exp_per_entry", "tile_overhead_keys", "causal_efficiency")
LOWER = {"matmul_efficiency": 0.05, "exp_per_entry": 0.0, "tile_overhead_keys": 0.0, "causal_efficiency": 0.5}
UPPER = {"matmul_efficiency": 1.0, "exp_per_entry": 8.0, "tile_overhead_keys": 2000.0, "causal_efficiency": 1.0}
FORWARD_EXP = 1.0


def predicted(rates, curve: dict, seqlen: list[int]) -> np.ndarray:
    """TFLOP/s the model gives for one measured curve (fwd, bwd or fwd+bwd)."""
    return np.array(benchmark_tflops(rates, curve["pass"], bool(curve["causal"]), int(curve["head_dim"]), seqlen))


def fit(family: str, arch: str, bwd_exp: float | None) -> tuple[object, dict]:
    catalogue = load_catalogue()
    entry = catalogue.kernels[family][arch]
    gpu = catalogue.find(entry["fitted_on"])
    base = gpu.kernel_rates("bfloat16", family)
    curves, seqlen = entry["measured"]["curves"], entry["measured"]["seqlen"]
    has_bwd = any(c["pass"] != "fwd" for c in curves)
    two_dims = len({c["head_dim"] for c in curves if c["pass"] != "fwd"}) > 1
    free = [("fwd", n) for n in NAMES if n != "exp_per_entry" or entry.get("fit_forward_exp")]
    if has_bwd:
        free += [("bwd", n) for n in NAMES if n != "exp_per_entry" or two_dims]

    def build(x) -> object:
        params = {"fwd": dict(vars_of(base.fwd), exp_per_entry=FORWARD_EXP),
                  "bwd": dict(vars_of(base.bwd), exp_per_entry=bwd_exp if bwd_exp is not None and not two_dims
                              else base.bwd.exp_per_entry)}  # fmt: skip
        for (phase, name), value in zip(free, x, strict=True):
            params[phase][name] = float(value)
        return replace(base, fwd=PassModel(**params["fwd"]), bwd=PassModel(**params["bwd"]))

    def residuals(x) -> np.ndarray:
        rates = build(x)
        return np.concatenate([np.log(predicted(rates, c, seqlen) / np.array(c["tflops"], float)) for c in curves])

    x0 = [min(max(getattr(base.pass_model(p), n), LOWER[n] + 1e-3), UPPER[n] - 1e-3) for p, n in free]
    result = least_squares(residuals, x0, bounds=([LOWER[n] for _, n in free], [UPPER[n] for _, n in free]))
    fitted = build(result.x)
    errors = {f"{c['pass']} {'causal' if c['causal'] else 'full'} d{c['head_dim']}":
              float(np.max(np.abs(predicted(fitted, c, seqlen) / np.array(c["tflops"], float) - 1)))
              for c in curves}  # fmt: skip
    return fitted, errors


def vars_of(model: PassModel) -> dict:
    return {name: getattr(model, name) for name in NAMES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--yaml", action="store_true", help="print catalogue.yaml lines")
    args = parser.parse_args()
    catalogue = load_catalogue()
    ampere, _ = fit("fa2", "ampere", None)
    for family, arches in catalogue.kernels.items():
        for arch, entry in arches.items():
            if not isinstance(entry, dict) or "measured" not in entry:
                continue
            fitted, errors = fit(family, arch, ampere.bwd.exp_per_entry)
            stored = catalogue.find(entry["fitted_on"]).kernel_rates("bfloat16", family)
            stored_err = {name: float(np.max(np.abs(predicted(stored, c, entry["measured"]["seqlen"]) /
                                                     np.array(c["tflops"], float) - 1)))
                          for name, c in zip(errors, entry["measured"]["curves"], strict=True)}  # fmt: skip
            print(f"{family}/{arch} (fitted on {entry['fitted_on']}):")
            for phase in ("fwd", "bwd"):
                values = vars_of(fitted.pass_model(phase))
                text = ", ".join(f"{k}: {round(v, 3)}" for k, v in values.items())
                print(f"      {phase}: {{{text}}}" if args.yaml else f"  {phase}: {text}")
            if not args.yaml:
                for name in errors:
                    print(f"  {name:<22} worst error fitted {100 * errors[name]:5.1f}%  stored "
                          f"{100 * stored_err[name]:5.1f}%")  # fmt: skip


if __name__ == "__main__":
    main()
