"""Decoder configurations for the tuning driver: new weights and cache options in a *copy*.

- :func:`rewrite_moses_ini`: a moses.ini with its ``[weight]`` section's values replaced
  (``Label= v1 v2 ...``; labels the section lacks are appended to it, other lines kept
  verbatim) and, optionally, ``key=value`` set on the ``[feature]`` lines of given feature
  classes (e.g. ``persistent-cache=DIR`` on the NLM feature);
- :func:`rewrite_cdec_ini`: the same option on cdec ``feature_function=NAME ...`` lines;
- :func:`write_cdec_weights`: a cdec weights file (``name value`` per line).

Weights are read elsewhere (:mod:`nlmfeature.mt.weights`); everything here is written atomically.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence

from nlmfeature.errors import InputError
from nlmfeature.io.atomicfile import open_output
from nlmfeature.mt.kbest import format_number
from nlmfeature.io.textio import iter_lines, read_lines

_SECTION = re.compile(r"^\s*\[([^\]]+)\]\s*$")


def _label_of(line: str) -> Optional[str]:
    """Label of a ``[weight]`` line (``Label= v ...``) or None for blank/comment lines."""
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    first = text.split()[0]
    if first.endswith("="):
        return first[:-1]
    return first.partition("=")[0]


def _set_option(line: str, key: str, value: str) -> str:
    """``line`` with ``key=value`` replaced or appended (Moses/cdec feature-line syntax)."""
    toks = line.rstrip("\n").split()
    for i, tok in enumerate(toks):
        if tok.startswith(key + "="):
            toks[i] = f"{key}={value}"
            break
    else:
        toks.append(f"{key}={value}")
    return " ".join(toks)


def moses_ini_lines(path: str, weights: Dict[str, List[float]],
                    feature_options: Optional[Dict[str, Dict[str, str]]] = None) -> List[str]:
    """Lines of ``path`` (moses.ini) with new weights and feature options (see the module doc).

    ``feature_options`` maps a feature class name (first token of a ``[feature]`` line, e.g.
    ``NLMFeature``) to ``{key: value}`` options to set on its lines.
    """
    feature_options = feature_options or {}
    lines = read_lines(path)
    out: List[str] = []
    section = None
    done = set()
    saw_weight = False

    def flush_missing() -> None:
        for label, vals in weights.items():
            if label not in done:
                out.append(f"{label}= {' '.join(format_number(v) for v in vals)}")
                done.add(label)

    for line in lines:
        m = _SECTION.match(line)
        if m:
            if section == "weight":
                flush_missing()
            section = m.group(1).strip()
            saw_weight = saw_weight or section == "weight"
            out.append(line)
            continue
        if section == "weight":
            label = _label_of(line)
            if label is not None and label in weights:
                out.append(f"{label}= {' '.join(format_number(v) for v in weights[label])}")
                done.add(label)
                continue
        elif section == "feature":
            toks = line.split("#", 1)[0].split()
            if toks and toks[0] in feature_options:
                for key, value in feature_options[toks[0]].items():
                    line = _set_option(line, key, value)
        out.append(line)
    if section == "weight":
        flush_missing()
    if not saw_weight:
        out.append("[weight]")
        flush_missing()
    return out


def rewrite_moses_ini(src: str, dst: str, weights: Dict[str, List[float]],
                      feature_options: Optional[Dict[str, Dict[str, str]]] = None) -> None:
    """Write a copy of moses.ini ``src`` to ``dst`` with ``weights`` (and feature options)."""
    lines = moses_ini_lines(src, weights, feature_options)
    with open_output(dst) as f:
        f.write("\n".join(lines) + "\n")


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
