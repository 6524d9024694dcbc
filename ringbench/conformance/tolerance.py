"""What "right" means for one tensor of one dtype: |got - float64| <= atol + rtol * scale, elementwise.

``scale`` is the largest magnitude of the float64 reference tensor over the whole sequence (every rank), so one
tensor has one tolerance on every rank and a rank whose rows happen to be small is held to the same bar.

Why a share of the tensor's scale and not of each element: attention outputs and gradients are sums of many
terms of both signs; an element that cancels to near zero carries the absolute rounding error of its terms, not
one of its own size, so an elementwise relative test fails correct implementations on such elements.

The bounds (docs/implementations.md, "Tolerances", gives the measurements behind them), with u the unit roundoff
of the dtype (2^-53, 2^-24, 2^-8, 2^-11):
* float64: 1e-10. A ring merges N blocks; every operation rounds at u ~ 1.1e-16; a few thousand terms per row
  keep the error below 1e-13 of the scale. 1e-10 leaves three orders of magnitude and still exposes a wrong mask,
  a missing block or a stale K/V (errors of order 1e-2 and up).
* float32: 1e-5 of the scale (plus 1e-6 absolute). Correct implementations measured at most 6.3e-7 of the scale
  (about 5u) across their default matrices: a 16x margin.
* bfloat16: 4u = 1.6e-2 of the scale. A correct implementation rounds each block's output to the dtype (u/2), may
  round the probabilities before P.V (u/2 of |V|, about twice the output's scale), rounds the result (u/2) and,
  in the backward, rounds dS before the matmuls: a few u; measured at most 1.6u (6.3e-3, torch's ring, dK).
* float16: 4u = 2.0e-3 of the scale, by the same argument (u = 2^-11); measured at most 2.0u (9.9e-4, torch's
  ring, dK at N = 2).
Partials kept in low precision (the running output, log-sum-exp or dK/dV accumulators rounded at every merge) add
a rounding per block, about N * u/2 at N ranks: at small N that may stay within 4u, so the check does not rely on
the tolerance alone -- the ladder's RMS error against the CP degree catches it (ringbench/analysis/conformance.py,
GROWTH).
"""

from __future__ import annotations

CHECK_TOLERANCE = {  # dtype -> (rtol: share of the tensor's scale, atol)
    "float64": (1e-10, 1e-12),
    "float32": (1e-5, 1e-6),
    "bfloat16": (4 * 2.0**-8, 1e-3),
    "float16": (4 * 2.0**-11, 1e-4),
}
WRONG_FACTOR = 8.0
"""An error above WRONG_FACTOR x the tolerance (or above 10% of the scale) is ``wrong``; between 1x and that,
``imprecise``: a right computation rounded too coarsely lands within a few tolerances, a wrong one far above."""
WRONG_SHARE = 0.1


def tolerance(dtype: str, scale: float) -> float:
    """The absolute error allowed for a tensor of ``dtype`` whose float64 reference has largest magnitude ``scale``."""
    rtol, atol = CHECK_TOLERANCE[dtype]
    return atol + rtol * float(scale)


def error_kind(max_abs_err: float, tol: float, scale: float, nonfinite: int) -> str:
    """``ok``, ``nonfinite``, ``wrong`` or ``imprecise`` for one tensor (see WRONG_FACTOR)."""
    if nonfinite:
        return "nonfinite"
    if max_abs_err <= tol:
        return "ok"
    if max_abs_err > WRONG_FACTOR * tol or max_abs_err > WRONG_SHARE * max(scale, 1e-30):
        return "wrong"
    return "imprecise"


__all__ = ["CHECK_TOLERANCE", "WRONG_FACTOR", "WRONG_SHARE", "error_kind", "tolerance"]
