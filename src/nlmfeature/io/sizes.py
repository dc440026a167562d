"""The one rule for sizes in bytes (``4G``, ``500M``, ``1.5KiB``).

A size is a decimal number (digits, optionally a ``.`` and more digits), then optionally a
unit: ``K``, ``M``, ``G`` or ``T`` (powers of 1024, any case, optionally followed by ``B`` or
``iB``) or ``B`` alone; spaces around the number and the unit are allowed.  The result is
truncated to whole bytes and is at most :data:`MAX_SIZE`.  The Moses and cdec features parse
their ``persistent-cache-max`` option by the same rule (``ParseBytes`` in
``moses_ff/NLMFeature.cpp`` and ``cdec_ff/nlm_client.h``; the tests compare the three).
"""
from __future__ import annotations

import re

from nlmfeature.errors import NLMFeatureError

__all__ = ["parse_size", "MAX_SIZE"]

#: largest size :func:`parse_size` accepts (the library keeps sizes in int64)
MAX_SIZE = 1 << 62

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgt])(?:i?b)?|(b))?\s*", re.ASCII | re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of a size such as ``"500M"`` (see the module docstring for the rule);
    :class:`NLMFeatureError` naming the text when it is not one."""
    m = _SIZE.fullmatch(str(text))
    if not m:
        raise NLMFeatureError(f"bad size {text!r}: use a number with an optional K, M, G or T "
                              "suffix (e.g. 500M, 4G)")
    value = float(m.group(1)) * _UNITS[(m.group(2) or m.group(3) or "").lower()]
    if value > MAX_SIZE:
        raise NLMFeatureError(f"bad size {text!r}: larger than {MAX_SIZE >> 60} EiB")
    return int(value)
