"""Bandwidths with units: what a user types for a link (``100Gbps``, ``100 Gb/s``, ``12.5GB/s``, ``400Gbit``).

A bare number is GB/s (1e9 bytes per second), as every ``bandwidth_gbps`` field has always meant. A unit says
bits or bytes by the case of its ``b``: ``Gb``, ``Gbit``, ``Gbps``, ``GbE`` are gigabits (a network's rate, 8 bits
per byte), ``GB``, ``GBps`` are gigabytes; the prefix (k, M, G, T) is read in any case, ``GiB`` is 2**30 bytes.
So ``100Gbps`` (a 100 GbE port) is 12.5 GB/s, and ``400Gbit`` (an NDR port) 50 GB/s.
"""

from __future__ import annotations

import math
import re

from ringbench.errors import bad_value

BANDWIDTH_FORMS = (
    "a bandwidth > 0: a number of GB/s (12.5) or a number with a unit: 100Gbps, 100 Gb/s, 400Gbit, 100GbE, "
    "12.5GB/s, 12.5 GBps, 800Mbps, 1.6Tbps, 10GiB/s"
)

_PREFIX = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
# value, then a prefix (binary prefixes for bytes only), then b/B, then an optional per-second spelling
_FORM = re.compile(
    rf"^\s*(?P<value>{_NUMBER})\s*(?:(?P<prefix>[kKmMgGtT]i?)(?P<unit>bit|Bit|BIT|b|B)"
    r"(?P<per>/s|ps|it/s|E|e)?)?\s*$"
)


def parse_bandwidth(value: object, field: str = "bandwidth_gbps") -> float:
    """GB/s from a number (GB/s) or a string with a unit; anything else, or <= 0, raises UsageError naming ``field``."""
    if isinstance(value, bool):
        raise bad_value(field, value, BANDWIDTH_FORMS)
    if isinstance(value, (int, float)):
        gbps = float(value)
    elif isinstance(value, str):
        gbps = _from_text(value, field)
    else:
        raise bad_value(field, value, BANDWIDTH_FORMS)
    if not math.isfinite(gbps) or gbps <= 0:
        raise bad_value(field, value, BANDWIDTH_FORMS)
    return gbps


def _from_text(text: str, field: str) -> float:
    match = _FORM.match(text)
    if match is None:
        raise bad_value(field, text, BANDWIDTH_FORMS)
    number = float(match.group("value"))
    prefix, unit = match.group("prefix"), match.group("unit")
    if prefix is None:
        return number  # a bare number in a string: GB/s
    bits = unit != "B"  # b, bit, Bit: bits; B alone: bytes
    key = prefix.lower()
    if key.endswith("i") and bits:
        raise bad_value(field, text, BANDWIDTH_FORMS + " (binary prefixes such as Gi go with bytes: GiB/s)")
    per = match.group("per") or ""
    if per.lower() == "e" and not bits:
        raise bad_value(field, text, BANDWIDTH_FORMS)
    scale = _BINARY[key] if key.endswith("i") else _PREFIX[key]
    bytes_per_s = number * scale / (8 if bits else 1)
    return bytes_per_s / 1e9


def format_bandwidth(gbps: float) -> str:
    """``12.5 GB/s (100 Gb/s)``: the value in both units a reader might have typed."""
    return f"{gbps:g} GB/s ({gbps * 8:g} Gb/s)"


__all__ = ["BANDWIDTH_FORMS", "format_bandwidth", "parse_bandwidth"]
