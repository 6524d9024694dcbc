"""Documents packed into one sequence: the ``docs`` axis, from a spec to the document lengths.

A document mask (``causal-document``, ``full-document``, ``causal-document+window:W``) lets a token see only tokens
of its own document. Which tokens belong together is the case's ``docs`` spec, always a deterministic function of
(spec, S):

  none                          one document (masks without documents ignore the axis)
  lengths:8192,1024,...         explicit lengths in tokens, in sequence order; they must sum to S
  file:PATH                     one length per line ('#' comments and blank lines ignored), or a CSV / Parquet
  file:PATH:COLUMN              file and its column (needed when it has more than one); packed in order until S
                                tokens are filled, the last document cut to fit (the file must hold >= S tokens)
  lognormal:MEAN:SIGMA:SEED     lengths drawn from a lognormal whose mean is MEAN tokens (SIGMA: the log-space
                                standard deviation), seeded; packed until S is filled, the last one cut to fit
  uniform:MIN:MAX:SEED          integer lengths uniform in [MIN, MAX], seeded, packed the same way
  ...:CAP                       (either distribution) each document at most CAP x S tokens, 0 < CAP <= 1 (e.g. 0.25:
                                MagiAttention's benchmark caps its sampled documents at a quarter of the sequence)

Draws use numpy's PCG64 generator seeded with SEED, in blocks of a size fixed by (S, MEAN), so the same spec gives
the same documents on every rank, machine and run. ``documents(spec, seq)`` returns a ``Documents`` (lengths, ends,
count, mean, max); bad specs raise one line naming the field, the value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ringbench.errors import UsageError, bad_value

DOCS_HELP = (
    "none, lengths:L1,L2,... (summing to seq), file:PATH[:COLUMN], lognormal:MEAN:SIGMA:SEED[:CAP] or "
    "uniform:MIN:MAX:SEED[:CAP] (CAP: the largest document as a share of seq, 0 < CAP <= 1)"
)
KINDS = ("none", "lengths", "file", "lognormal", "uniform")


@dataclass(frozen=True, slots=True)
class Documents:
    """The documents of one sequence: lengths in sequence order (they sum to ``seq``)."""

    spec: str
    seq: int
    lengths: tuple[int, ...]

    @property
    def ends(self) -> tuple[int, ...]:
        """Exclusive end position of each document (the last is ``seq``)."""
        return tuple(int(x) for x in np.cumsum(self.lengths))

    @property
    def count(self) -> int:
        return len(self.lengths)

    @property
    def mean(self) -> float:
        return self.seq / len(self.lengths)

    @property
    def max(self) -> int:
        return max(self.lengths)

    def summary(self) -> dict:
        """What meta.json and the case row keep: the spec, count, mean, min, max (and the lengths when few)."""
        out = {"spec": self.spec, "seq": self.seq, "count": self.count, "mean": round(self.mean, 3),
               "min": min(self.lengths), "max": self.max}  # fmt: skip
        if self.count <= 4096:
            out["lengths"] = list(self.lengths)
        return out


def _number(spec: str, text: str, what: str, kind=float) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise bad_value("docs", spec, f"{what} as a number; {DOCS_HELP}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_value("docs", spec, f"{what} finite; {DOCS_HELP}")
    return value


def _cap(spec: str, parts: list[str], seq: int) -> int:
    if len(parts) < 4:
        return seq
    share = _number(spec, parts[3], "CAP")
    if not 0 < share <= 1:
        raise bad_value("docs", spec, "CAP as a share of seq with 0 < CAP <= 1 (e.g. 0.25)")
    return max(1, math.floor(share * seq))


def _pack(spec: str, lengths: np.ndarray, seq: int, what: str) -> tuple[int, ...]:
    """The first documents that fill ``seq`` tokens, the last one cut to fit."""
    total = np.cumsum(lengths)
    if len(total) == 0 or total[-1] < seq:
        have = int(total[-1]) if len(total) else 0
        raise bad_value("docs", spec, f"{what} holding at least seq={seq} tokens (it holds {have})")
    count = int(np.searchsorted(total, seq, side="left")) + 1
    out = [int(x) for x in lengths[:count]]
    out[-1] -= int(total[count - 1]) - seq
    return tuple(out)


def _sample(spec: str, parts: list[str], seq: int, draw, mean: float) -> tuple[int, ...]:
    """Draw blocks of lengths until they fill ``seq``; every length rounded and clipped to [1, cap]."""
    seed = _number(spec, parts[2], "SEED", int)
    if seed < 0:
        raise bad_value("docs", spec, "SEED as an integer >= 0")
    cap = _cap(spec, parts, seq)
    rng = np.random.Generator(np.random.PCG64(seed))
    block = int(min(1 << 20, max(64, 2 * math.ceil(seq / max(1.0, min(mean, cap))))))
    drawn: list[np.ndarray] = []
    filled = 0
    while filled < seq:
        values = np.clip(np.rint(draw(rng, block)), 1, cap).astype(np.int64)
        drawn.append(values)
        filled += int(values.sum())
    return _pack(spec, np.concatenate(drawn), seq, "a distribution")


def _read_file(spec: str, target: str) -> np.ndarray:
    path_text, _, column = target.rpartition(":") if not Path(target).exists() and ":" in target else (target, "", "")
    if not path_text:
        raise bad_value("docs", spec, "file:PATH[:COLUMN] naming a file")
    path = Path(path_text)
    if not path.is_file():
        raise bad_value("docs", spec, f"file:PATH[:COLUMN] naming an existing file ({path_text} not found)")
    suffix = path.suffix.lower()
    try:
        if suffix in (".csv", ".parquet", ".pq"):
            import pandas as pd

            table = pd.read_parquet(path) if suffix != ".csv" else pd.read_csv(path)
            if not column:
                if table.shape[1] != 1:
                    names = ", ".join(map(str, table.columns[:8]))
                    raise bad_value("docs", spec, f"file:PATH:COLUMN naming one of its columns ({names})")
                column = str(table.columns[0])
            if column not in table.columns:
                names = ", ".join(map(str, table.columns[:8]))
                raise bad_value("docs", spec, f"a column of {path.name}: one of {names}")
            values = pd.to_numeric(table[column], errors="coerce").to_numpy(float)
        else:
            lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
            values = np.array([float(x) for x in lines if x], dtype=float)
    except (OSError, UnicodeDecodeError) as exc:
        raise bad_value("docs", spec, f"a readable file ({type(exc).__name__})") from None
    except ValueError:
        raise bad_value("docs", spec, "a file of positive integer lengths, one per line") from None
    if not len(values) or not np.all(np.isfinite(values)) or (values < 1).any() or (values != np.rint(values)).any():
        raise bad_value("docs", spec, "a file of positive integer lengths (one per line, or a column)")
    return values.astype(np.int64)


@lru_cache(maxsize=128)
def documents(spec: str, seq: int) -> Documents:
    """The documents of ``spec`` for a sequence of ``seq`` tokens (cached: specs are resolved once)."""
    if not isinstance(spec, str) or not spec.strip():
        raise bad_value("docs", spec, DOCS_HELP)
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise bad_value("seq", seq, "an integer >= 1")
    text = spec.strip()
    kind, _, rest = text.partition(":")
    if kind == "none" and not rest:
        return Documents(spec=text, seq=seq, lengths=(seq,))
    if kind == "lengths":
        try:
            lengths = tuple(int(x) for x in rest.split(",") if x.strip())
        except ValueError:
            raise bad_value("docs", spec, "lengths:L1,L2,... with integer lengths >= 1") from None
        if not lengths or min(lengths) < 1:
            raise bad_value("docs", spec, "lengths:L1,L2,... with integer lengths >= 1")
        if sum(lengths) != seq:
            raise bad_value("docs", spec, f"lengths summing to seq={seq} (they sum to {sum(lengths)})")
        return Documents(spec=text, seq=seq, lengths=lengths)
    if kind == "file":
        lengths = _pack(spec, _read_file(spec, rest), seq, "a file")
        return Documents(spec=text, seq=seq, lengths=lengths)
    parts = rest.split(":")
    if kind in ("lognormal", "uniform") and len(parts) not in (3, 4):
        shape = "MEAN:SIGMA:SEED" if kind == "lognormal" else "MIN:MAX:SEED"
        raise bad_value("docs", spec, f"{kind}:{shape}[:CAP]")
    if kind == "lognormal":
        mean, sigma = _number(spec, parts[0], "MEAN"), _number(spec, parts[1], "SIGMA")
        if not mean >= 1:
            raise bad_value("docs", spec, "lognormal:MEAN:SIGMA:SEED with a mean length MEAN >= 1 token")
        if not 0 <= sigma <= 10:
            raise bad_value("docs", spec, "lognormal:MEAN:SIGMA:SEED with 0 <= SIGMA <= 10")
        mu = math.log(mean) - sigma * sigma / 2  # E[X] = exp(mu + sigma^2 / 2) = MEAN
        lengths = _sample(spec, parts, seq, lambda rng, n: rng.lognormal(mu, sigma, size=n), mean)
        return Documents(spec=text, seq=seq, lengths=lengths)
    if kind == "uniform":
        low, high = _number(spec, parts[0], "MIN", int), _number(spec, parts[1], "MAX", int)
        if not 1 <= low <= high:
            raise bad_value("docs", spec, "uniform:MIN:MAX:SEED with integers 1 <= MIN <= MAX")
        lengths = _sample(spec, parts, seq, lambda rng, n: rng.integers(low, high + 1, size=n), (low + high) / 2)
        return Documents(spec=text, seq=seq, lengths=lengths)
    raise bad_value("docs", spec, DOCS_HELP)


def check_docs(spec: str, seq: int) -> None:
    """Raise the one-line UsageError when ``spec`` cannot describe a sequence of ``seq`` tokens."""
    try:
        documents(spec, seq)
    except UsageError:
        raise
    except (TypeError, ValueError) as exc:  # anything numpy objects to, named as the docs field
        raise bad_value("docs", spec, f"{DOCS_HELP} ({exc})") from None


__all__ = ["DOCS_HELP", "Documents", "check_docs", "documents"]
