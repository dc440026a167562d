"""cdec configurations for the tuning driver: cache options and weights in a *copy*.

(Moses configs are rewritten by :func:`nlmfeature.mt.moses.rewrite_moses_ini`.)

- :func:`rewrite_cdec_ini`: ``--key value`` options (e.g. the persistent cache) set on cdec
  ``feature_function=NAME ...`` lines;
- :func:`write_cdec_weights`: a cdec weights file (``name value`` per line).

Weights are read elsewhere (:mod:`nlmfeature.mt.weights`); everything here is written atomically.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from nlmfeature.errors import InputError
from nlmfeature.io.atomicfile import open_output
from nlmfeature.mt.kbest import format_number
from nlmfeature.io.textio import iter_lines


def _set_flag(line: str, key: str, value: str) -> str:
    """``line`` with ``--key value`` replaced or appended (cdec External feature syntax)."""
    toks = line.rstrip("\n").split()
    flag = "--" + key.lstrip("-")
    for i, tok in enumerate(toks[:-1]):
        if tok == flag:
            toks[i + 1] = value
            break
    else:
        toks += [flag, value]
    return " ".join(toks)


def rewrite_cdec_ini(src: str, dst: str,
                     feature_options: Optional[Dict[str, Dict[str, str]]] = None) -> None:
    """Copy cdec.ini ``src`` to ``dst`` setting options on ``feature_function=NAME ...`` lines.

    ``feature_options`` maps a feature name (``External`` or a library path's basename, e.g.
    ``libcdec_ff_nlm.so``) to options set as ``--key value`` in the line's arguments (the
    syntax of nlmfeature's cdec feature).
    """
    feature_options = feature_options or {}
    out: List[str] = []
    for _, line in iter_lines(src):
        key, eq, rest = line.partition("=")
        if eq and key.strip() in ("feature_function", "ff"):
            toks = rest.split()
            names = set()
            if toks:
                names.add(toks[0])
                if len(toks) > 1:
                    names.add(toks[1].rsplit("/", 1)[-1])
            for name in names & set(feature_options):
                for k, v in feature_options[name].items():
                    line = _set_flag(line, k, v)
        out.append(line)
    with open_output(dst) as f:
        f.write("\n".join(out) + "\n")


def write_cdec_weights(path: str, weights: Dict[str, List[float]]) -> None:
    """Write a cdec weights file: ``name value`` per line (``Label_i`` for multi-valued)."""
    with open_output(path) as f:
        for label, vals in weights.items():
            if len(vals) == 1:
                f.write(f"{label} {format_number(vals[0])}\n")
            else:
                for i, v in enumerate(vals):
                    f.write(f"{label}_{i} {format_number(v)}\n")


def check_labels(labels: Sequence[str], weights: Dict[str, List[float]], path: str) -> None:
    """Raise :class:`InputError` if ``weights`` (read from ``path``) lacks one of ``labels``."""
    missing = [l for l in labels if l not in weights]
    if missing:
        raise InputError(path, 0, f"no weights for {', '.join(missing)}")
