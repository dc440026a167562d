"""Strict JSON output: what ``--json`` flags and result files write (no NaN, no infinity)."""
from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["json_safe", "dumps_json"]


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON ``null``): JSON has
    no NaN, and ``json.dumps`` would write one that JSON readers refuse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "dtype") and hasattr(value, "tolist"):      # numpy scalars and arrays
        return json_safe(value.tolist())
    return value


def dumps_json(value: Any, **kwargs: Any) -> str:
    """JSON text of a command's result: strict JSON (no NaN; see :func:`json_safe`)."""
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)
