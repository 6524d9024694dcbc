"""Differential diagnosis: which known wrong answer does a failing tensor match?

Each hypothesis is a precise wrong semantics, computed in float64 from the same inputs; a failing tensor that
matches one within its tolerance (and the hypothesis differs from the truth by more than that) is diagnosed with
it. Nothing here knows any implementation: the hypotheses are the ways a ring goes wrong.

Forward (any tensor): another visibility matrix -- positions local to the shard, a contiguous layout assumed, the
mask applied to the rank's own block only, the K/V of other ranks never arriving, a ring step missing, the mask,
documents or window ignored, the window off by one -- or the other query-to-KV head mapping, or another softmax
scale (``forward_hypotheses``).

Backward, with the forward right (``backward_matches``): dK = dK + dV ("dK carries dV"), dK and dV swapped, a
gradient off by a constant factor, dK/dV landing on another rank, the backward reusing the rank's own K/V at every
step, and a decomposition of each gradient into the contributions of every pair of ranks (least squares over the
pairs: which contributions are missing or counted twice, in ring steps).

Non-finite values (``nonfinite_diagnosis``): NaN only in rows that see no key of some rank's block while they see
keys elsewhere: "a fully masked block gives NaN".
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from ringbench.conformance.dense import KEY_TENSORS, Problem, expand_kv, solve, visibility
from ringbench.engine.masks import mask_rule

COEFFICIENT_SLACK = 0.05  # a fitted contribution weight within this of 0, 1 or 2 is read as that integer


def _step_text(steps: list[int], world: int) -> str:
    """Ring steps named so that one bug reads the same at every world size: the last step is "the last"."""
    steps = sorted(set(steps))
    if steps == [world - 1]:
        return "the last ring step (the ring stops one step short)"
    named = ", ".join(str(s) for s in steps)
    return f"ring step{'s' if len(steps) > 1 else ''} {named}"


def forward_hypotheses(problem: Problem) -> Iterator[tuple[str, dict]]:
    """(diagnosis, solved tensors) of every wrong forward semantics that differs from the truth (lazily)."""
    case, truth_visible = problem.case, problem.visible
    rule = case.rule()
    rank_q, rank_k = problem.rank_of[:, None], problem.rank_of[None, :]
    same = rank_q == rank_k
    seen: list[torch.Tensor] = [truth_visible]

    def fresh(visible: torch.Tensor) -> bool:
        if any(torch.equal(visible, other) for other in seen):
            return False
        seen.append(visible)
        return True

    candidates: list[tuple[str, object]] = []
    if case.world > 1:
        local = problem.local_of
        candidates.append(("positions look local to the shard: the mask is applied to local row indices",
                           lambda: visibility(rule, local, local)))  # fmt: skip
        if case.layout != "contiguous":
            offsets = torch.tensor([0] + [p.numel() for p in problem.positions]).cumsum(0)
            contiguous = offsets[problem.rank_of] + local
            candidates.append(("the implementation assumes a contiguous layout: rank r's rows are masked as "
                               "positions r*S/N onwards", lambda: visibility(rule, contiguous, contiguous)))  # fmt: skip
        candidates.append(("the mask is applied to the rank's own block only; other ranks' blocks are taken whole",
                           lambda: torch.where(same, truth_visible, torch.ones_like(same))))  # fmt: skip
        distance = (rank_q - rank_k) % case.world  # query rank r meets key rank r - s at ring step s
        for step in range(case.world - 1, 0, -1):  # the last first: at N = 2 it is also "own keys only"
            candidates.append((f"out misses the keys that arrive at {_step_text([step], case.world)}",
                               lambda step=step: truth_visible & (distance != step)))  # fmt: skip
        candidates.append(("only the rank's own keys count: K/V of other ranks never arrive",
                           lambda: truth_visible & same))  # fmt: skip
    everything = torch.arange(case.seq)
    spec = rule.spec
    candidates.append(("the mask is ignored (every key visible)", lambda: torch.ones_like(truth_visible)))
    if not spec.causal and not rule.documents:
        candidates.append(("a causal mask is applied to mask none", lambda: visibility(mask_rule("causal", "none",
                           case.seq), everything, everything)))  # fmt: skip
    if rule.documents:
        plain = f"window:{spec.window}" if spec.window else ("causal" if spec.causal else "none")
        candidates.append(("document boundaries are ignored",
                           lambda: visibility(mask_rule(plain, "none", case.seq), everything, everything)))  # fmt: skip
    if spec.window is not None:
        head = "causal-document" if rule.documents else "causal"
        candidates.append(("the window is ignored",
                           lambda: visibility(mask_rule(head, case.docs, case.seq), everything, everything)))  # fmt: skip
        for other in (spec.window - 1, spec.window + 1):
            if other < 1:
                continue
            text = f"{head}+window:{other}" if rule.documents else f"window:{other}"
            candidates.append((f"the window is off by one: a query sees {other} keys, not {spec.window} (the "
                               "window is measured from the wrong position)",
                               lambda text=text: visibility(mask_rule(text, case.docs, case.seq), everything,
                                                            everything)))  # fmt: skip
    for diagnosis, make in candidates:
        visible = make()
        if fresh(visible):
            yield diagnosis, solve(problem, visible)
    if case.gqa:
        yield ("KV heads are mapped to query heads as h % KV instead of h // (H / KV)",
               solve(problem, truth_visible, interleaved=True))  # fmt: skip
    for scale, text in ((1.0, "1"), (1.0 / case.head_dim, "1/D")):
        yield f"the softmax scale is {text}, not 1/sqrt(D)", solve(problem, truth_visible, scale=scale)


def close(got: torch.Tensor | None, want: torch.Tensor, tol: float) -> bool:
    """``got`` equals ``want`` within ``tol`` wherever ``want`` is defined (and is finite there)."""
    if got is None:
        return False
    defined = torch.isfinite(want)
    if not bool(defined.any()):
        return False
    part = got[defined]
    if not bool(torch.isfinite(part).all()):
        return False
    return float((part - want[defined]).abs().max()) <= tol


def differs(alt: torch.Tensor, truth: torch.Tensor, tol: float) -> bool:
    both = torch.isfinite(alt) & torch.isfinite(truth)
    return bool((alt.isfinite() != truth.isfinite()).any()) or (
        bool(both.any()) and float((alt[both] - truth[both]).abs().max()) > tol
    )


def forward_matches(problem: Problem, truth: dict, got: dict, tols: dict, failing: list[str]) -> dict[str, str]:
    """{tensor: diagnosis} for the failing tensors a wrong forward semantics explains (the first that matches)."""
    found: dict[str, str] = {}
    for diagnosis, alt in forward_hypotheses(problem):
        for name in failing:
            if name in found or got.get(name) is None:
                continue
            if differs(alt[name], truth[name], tols[name]) and close(got[name], alt[name], tols[name]):
                found[name] = diagnosis
        if len(found) == len(failing):
            break
    return found


# -- the backward ---------------------------------------------------------------------------------------------


def _reduce_heads(x: torch.Tensor, kv: int) -> torch.Tensor:
    """(B, H, S, D) per query head -> (B, KV, S, D): the gradient of a KV head sums its query heads."""
    batch, heads, seq, dim = x.shape
    return x.reshape(batch, kv, heads // kv, seq, dim).sum(2)


def _pieces(problem: Problem, truth: dict) -> dict:
    """P, dS and the expanded K, V of the truth (dense, float64)."""
    heads, scale = problem.case.heads, problem.scale
    k, v = expand_kv(problem.k, heads), expand_kv(problem.v, heads)
    scores = (torch.matmul(problem.q, k.transpose(-1, -2)) * scale).masked_fill(~problem.visible, -math.inf)
    lse = torch.nan_to_num(truth["lse"], nan=0.0)
    probs = torch.exp(scores - lse[..., None])  # (B, H, S, S)
    delta = (problem.dout * torch.nan_to_num(truth["out"])).sum(-1)  # (B, H, S)
    dscores = probs * (torch.matmul(problem.dout, v.transpose(-1, -2)) - delta[..., None])
    return {"probs": probs, "dscores": dscores, "k": k, "v": v, "lse": lse, "delta": delta}


def _contributions(problem: Problem, pieces: dict, name: str) -> list[torch.Tensor]:
    """``name``'s gradient split by the rank on the other side of each score: for dq the key ranks, for dk / dv
    the query ranks; element r is the part rank r's tokens contribute (global rows)."""
    kv, scale = problem.case.key_value_heads, problem.scale
    out = []
    for rank in range(problem.world):
        mine = (problem.rank_of == rank).to(torch.float64)
        if name == "dq":
            out.append(torch.matmul(pieces["dscores"] * mine[None, None, None, :], pieces["k"]) * scale)
        elif name == "dk":
            part = torch.matmul((pieces["dscores"] * mine[None, None, :, None]).transpose(-1, -2), problem.q) * scale
            out.append(_reduce_heads(part, kv))
        else:
            part = torch.matmul((pieces["probs"] * mine[None, None, :, None]).transpose(-1, -2), problem.dout)
            out.append(_reduce_heads(part, kv))
    return out


def _decompose(problem: Problem, got: torch.Tensor, parts: list[torch.Tensor], tol: float,
               shift: int = 0) -> dict | None:  # fmt: skip
    """Per rank r of ``got``'s rows, the integer weights w with got_r = sum_s w_s parts_s (least squares) on the rows
    of rank r + ``shift`` (an accumulator that ended ``shift`` hops from home), keyed by that rank; None when no
    integer combination in {0, 1, 2} explains every rank within ``tol``."""
    weights = {}
    for rank, rows in enumerate(problem.positions):
        owner = (rank + shift) % problem.world
        theirs = problem.positions[owner]
        if theirs.numel() != rows.numel():
            return None
        target = got[:, :, rows].reshape(-1)
        columns = [p[:, :, theirs].reshape(-1) for p in parts]
        live = [i for i, c in enumerate(columns) if float(c.abs().max()) > tol]
        if not live:
            continue
        basis = torch.stack([columns[i] for i in live], dim=1)  # (elements, live)
        solution = torch.linalg.lstsq(basis, target[:, None]).solution[:, 0]
        rounded = solution.round()
        if bool(((solution - rounded).abs() > COEFFICIENT_SLACK).any()) or bool(((rounded < 0) | (rounded > 2)).any()):
            return None
        if float((basis @ rounded - target).abs().max()) > tol:
            return None
        weights[owner] = {i: int(w) for i, w in zip(live, rounded.tolist(), strict=True)}
    return weights


def _decomposition_text(name: str, weights: dict, world: int) -> str | None:
    missing, doubled, others_missing = [], [], True
    for rank, by_source in weights.items():
        for source, weight in by_source.items():
            step = (source - rank) % world if name != "dq" else (rank - source) % world
            if weight == 0:
                missing.append(step)
            elif weight == 2:
                doubled.append(step)
            if source != rank and weight != 0:
                others_missing = False
            if source == rank and weight != 1:
                others_missing = False
    if not missing and not doubled:
        return None
    label = {"dq": "dQ", "dk": "dK", "dv": "dV"}[name]
    side = "keys" if name == "dq" else "queries"
    if others_missing and missing and not doubled:
        return f"{label} misses the contributions of other ranks' {side} (only its own rank's {side} count)"
    parts = []
    if missing:
        parts.append(f"{label} misses the contributions made at {_step_text(missing, world)}")
    if doubled:
        parts.append(f"{label} counts the contributions made at {_step_text(doubled, world)} twice")
    return "; ".join(parts)


def _stale_kv(problem: Problem, pieces: dict) -> dict | None:
    """The gradients a backward gives when it uses the rank's own K/V (saved at the first step) for every block."""
    sizes = {p.numel() for p in problem.positions}
    if len(sizes) != 1 or problem.world == 1:
        return None
    heads, kv, scale = problem.case.heads, problem.case.key_value_heads, problem.scale
    grads = {n: torch.zeros_like(t) for n, t in (("dq", problem.q), ("dk", problem.k), ("dv", problem.v))}
    for rows in problem.positions:
        q, dout = problem.q[:, :, rows], problem.dout[:, :, rows]
        k_own, v_own = expand_kv(problem.k[:, :, rows], heads), expand_kv(problem.v[:, :, rows], heads)
        lse, delta = pieces["lse"][:, :, rows], pieces["delta"][:, :, rows]
        for keys in problem.positions:
            visible = problem.visible[rows][:, keys]
            scores = (torch.matmul(q, k_own.transpose(-1, -2)) * scale).masked_fill(~visible, -math.inf)
            probs = torch.exp(scores - lse[..., None])
            dscores = probs * (torch.matmul(dout, v_own.transpose(-1, -2)) - delta[..., None])
            grads["dq"][:, :, rows] += torch.matmul(dscores, k_own) * scale
            grads["dk"][:, :, keys] += _reduce_heads(torch.matmul(dscores.transpose(-1, -2), q) * scale, kv)
            grads["dv"][:, :, keys] += _reduce_heads(torch.matmul(probs.transpose(-1, -2), dout), kv)
    return grads


def backward_matches(problem: Problem, truth: dict, got: dict, tols: dict, failing: list[str]) -> dict[str, str]:
    """{tensor: diagnosis} for failing gradients (the forward being right), from the backward hypotheses."""
    found: dict[str, str] = {}
    grads = [n for n in failing if n in ("dq", "dk", "dv") and got.get(n) is not None]
    if not grads:
        return found
    dk, dv = truth["dk"], truth["dv"]
    # dK and dV have one shape, (B, KV, S, D): the ways a (dK, dV) pair gets mixed up on its way home
    if "dk" in grads and close(got["dk"], dk + dv, tols["dk"]):
        found["dk"] = "dK carries dV: dK = dK_ref + dV_ref (a (dK, dV) pair summed on its way home)"
    if "dv" in grads and close(got["dv"], dv + dk, tols["dv"]):
        found["dv"] = "dV carries dK: dV = dV_ref + dK_ref"
    if "dk" in grads and "dv" in grads and close(got["dk"], dv, tols["dk"]) and close(got["dv"], dk, tols["dv"]):
        found["dk"] = found["dv"] = "dK and dV are swapped"
    elif "dk" in grads and "dk" not in found and close(got["dk"], dv, tols["dk"]):
        found["dk"] = "dK holds dV"
    elif "dv" in grads and "dv" not in found and close(got["dv"], dk, tols["dv"]):
        found["dv"] = "dV holds dK"
    for name in grads:
        if name in found:
            continue
        ref, have = truth[name], got[name]
        norm = float((ref * ref).sum())
        if norm > 0 and bool(torch.isfinite(have).all()):
            factor = float((have * ref).sum()) / norm
            if abs(factor - 1) > 0.01 and close(have, factor * ref, tols[name]):
                found[name] = f"{name} is {factor:.4g} x the right value (a scale applied twice or missing)"
                continue
        if name in KEY_TENSORS and problem.world > 1 and len({p.numel() for p in problem.positions}) == 1:
            for shift in range(1, problem.world):
                moved = torch.empty_like(ref)
                for rank, rows in enumerate(problem.positions):
                    moved[:, :, rows] = ref[:, :, problem.positions[(rank + shift) % problem.world]]
                if close(have, moved, tols[name]):
                    found[name] = (f"{name} of rank r is the right {name} of rank r+{shift}: the accumulators end "
                                   f"{shift} ring step(s) away from home")  # fmt: skip
                    break
    pending = [n for n in grads if n not in found]
    if not pending:
        return found
    pieces = _pieces(problem, truth)
    stale = _stale_kv(problem, pieces)
    if stale is not None:
        for name in pending:
            if differs(stale[name], truth[name], tols[name]) and close(got[name], stale[name], tols[name]):
                found[name] = "the backward reuses the rank's own K/V (saved at the first step) at every ring step"
    for name in [n for n in pending if n not in found]:
        if problem.world == 1 or not bool(torch.isfinite(got[name]).all()):
            continue
        parts = _contributions(problem, pieces, name)
        for shift in range(problem.world if name in KEY_TENSORS else 1):
            weights = _decompose(problem, got[name], parts, tols[name], shift)
            text = _decomposition_text(name, weights, problem.world) if weights else None
            if shift and weights:
                label = {"dk": "dK", "dv": "dV"}[name]
                text = (f"{label} of rank r is the accumulator of rank r+{shift}'s keys, {shift} hop(s) short of "
                        f"home" + (f"; {text}" if text else ""))  # fmt: skip
            if text:
                found[name] = text
                break
    return found


# -- non-finite values ----------------------------------------------------------------------------------------


def empty_block_rows(problem: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """(query rows, key rows), (S,) bool each: a query row that sees nothing of some rank's keys while it sees
    keys elsewhere; a key row that no query of some rank sees while some query sees it."""
    visible = problem.visible
    q_blocks = torch.stack([visible[:, rows].any(-1) for rows in problem.positions], dim=-1)  # (S, N)
    k_blocks = torch.stack([visible[rows, :].any(0) for rows in problem.positions], dim=-1)  # (S, N)
    return (~q_blocks).any(-1) & visible.any(-1), (~k_blocks).any(-1) & visible.any(0)


def bad_rows(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """(S,) bool: rows of a (B, H, S[, D]) tensor holding a non-finite value."""
    bad = ~torch.isfinite(tensor)
    if name != "lse":
        bad = bad.any(-1)
    return bad.any(0).any(0)


def nonfinite_diagnosis(problem: Problem, got: dict, names: list[str]) -> dict[str, str]:
    """{tensor: diagnosis} for tensors whose non-finite rows all lie where a fully masked block meets a row (or
    key) that is not fully masked."""
    query_rows, key_rows = empty_block_rows(problem)
    found = {}
    forward_bad = any(got.get(n) is not None and not bool(torch.isfinite(got[n]).all()) for n in ("out", "lse"))
    for name in names:
        rows = bad_rows(got[name], name)
        allowed = key_rows if name in KEY_TENSORS else query_rows
        if bool(rows.any()) and bool((rows & ~allowed).sum() == 0):
            found[name] = "a fully masked block gives NaN (rows that see no key of some rank, though they see keys "\
                          "elsewhere)"  # fmt: skip
        elif name in ("dq", "dk", "dv") and forward_bad:
            found[name] = "non-finite because the forward is"
    return found


__all__ = ["backward_matches", "bad_rows", "close", "empty_block_rows", "forward_hypotheses", "forward_matches",
           "nonfinite_diagnosis"]  # fmt: skip
