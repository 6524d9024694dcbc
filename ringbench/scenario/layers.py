"""Models with several attention layers: the ``layers`` axis, from a spec to one mask per layer.

An iteration runs L attention layers in sequence, forward through all and backward through all (in reverse, as
autograd does), each layer a ring of its own with its own mask. The spec is either a count or a pattern:

  4                                 4 layers, each with the case's mask (the ``mask`` axis)
  window:4096 x5, causal x1         5 sliding-window layers, then 1 causal one (a 5 local : 1 global model)
  window:512, causal                alternating (x1 when no count is given)
  window:4096 x3, mask x1           ``mask`` stands for the case's mask axis value, so a pattern can sweep it

Masks are canonical (ringbench.vocab.MaskSpec); a pattern is written back in its canonical form
(``window:4096 x5, causal x1``), which case ids and records use. The default is ``1``: one layer, as before.
"""

from __future__ import annotations

import re

from ringbench.errors import UsageError, bad_value
from ringbench.vocab import MaskSpec

LAYERS_HELP = (
    "a count L >= 1 (each layer with the case's mask) or a pattern of masks with repeat counts, e.g. "
    "'window:4096 x5, causal x1' ('mask' stands for the case's mask)"
)
MAX_LAYERS = 256
_ITEM = re.compile(r"^(?P<mask>.*?)(?:\s*[x×]\s*(?P<count>\d+))?$")


def parse_layers(spec: object, field: str = "layers") -> tuple[str, ...]:
    """The layers as a tuple of mask names per layer; ``mask`` (the case's mask) where the pattern says so."""
    if isinstance(spec, bool):
        raise bad_value(field, spec, LAYERS_HELP)
    if isinstance(spec, int):
        spec = str(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise bad_value(field, spec, LAYERS_HELP)
    text = spec.strip()
    if text.isdigit():
        count = int(text)
        if not 1 <= count <= MAX_LAYERS:
            raise bad_value(field, spec, f"a count from 1 to {MAX_LAYERS}, or {LAYERS_HELP}")
        return ("mask",) * count
    layers: list[str] = []
    for item in text.split(","):
        match = _ITEM.match(item.strip())
        name = match.group("mask").strip() if match else ""
        count = int(match.group("count")) if match and match.group("count") else 1
        if not name or count < 1:
            raise bad_value(field, spec, LAYERS_HELP)
        if name != "mask":
            try:
                name = MaskSpec.parse(name, "mask").text
            except UsageError:
                raise bad_value(field, spec, f"{LAYERS_HELP}; {name!r} is not a mask") from None
        layers.extend([name] * count)
        if len(layers) > MAX_LAYERS:
            raise bad_value(field, spec, f"at most {MAX_LAYERS} layers")
    return tuple(layers)


def canonical_layers(spec: object) -> str:
    """The canonical text of a layers spec: ``1``, ``4``, or ``window:4096 x5, causal x1``."""
    layers = parse_layers(spec)
    if all(name == "mask" for name in layers):
        return str(len(layers))
    runs: list[list] = []
    for name in layers:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return ", ".join(f"{name} x{count}" for name, count in runs)


def layer_masks(spec: object, mask: str) -> tuple[str, ...]:
    """The mask of every layer of a case whose ``mask`` axis value is ``mask``."""
    return tuple(mask if name == "mask" else name for name in parse_layers(spec))


def uses_case_mask(spec: object) -> bool:
    """False for a pattern that names every layer's mask (the case's mask axis then does not matter)."""
    return "mask" in parse_layers(spec)


def needs_docs(mask: str) -> bool:
    """The mask reads the docs axis (a malformed one is left for its own check to name)."""
    try:
        return MaskSpec.parse(mask, "mask").documents
    except UsageError:
        return False


__all__ = [
    "LAYERS_HELP",
    "MAX_LAYERS",
    "canonical_layers",
    "layer_masks",
    "needs_docs",
    "parse_layers",
    "uses_case_mask",
]
