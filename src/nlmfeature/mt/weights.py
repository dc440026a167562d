"""Feature weights: the one reader (and writer) of weight files in nlmfeature.

Accepted inputs (detected from the content):

* a Moses config (``moses.ini``): the ``[weight]`` section, one ``Label= w1 w2 ...`` line per
  feature; old-style configs (``[weight-d]``, ``[weight-l]``, ``[weight-t]``, ``[weight-w]``,
  one value per line) give the labels ``d``, ``lm``, ``tm``, ``w`` of old-style n-best lists;
* a plain weights file, one feature per line, as ``Name= v1 v2 ...``, ``Name: v ...``,
  ``Name=v`` or ``name value ...`` (cdec's format).

Blank lines and ``#`` comments are ignored.  A label given twice is an error.  Weights are
kept as ``{label: [values]}`` in file order; :func:`write_weights` writes the plain
``Name= v1 v2 ...`` form, which :func:`read_weights` reads back.
"""
from __future__ import annotations

import math
import re
from typing import Dict, List, Sequence, Tuple

from nlmfeature.errors import InputError

Weights = Dict[str, List[float]]

#: old-style moses.ini sections and the n-best label each one weights
OLD_MOSES_SECTIONS = {"weight-d": "d", "weight-l": "lm", "weight-t": "tm", "weight-w": "w",
                      "weight-generation": "g", "weight-lr": "lr", "weight-u": "u"}

_SECTION = re.compile(r"^\[([^\]]+)\]\s*$")


def _numbers(tokens: Sequence[str], path: str, lineno: int, label: str) -> List[float]:
    out = []
    for tok in tokens:
        try:
            v = float(tok)
        except ValueError:
            raise InputError(path, lineno, f"weight {tok!r} of {label!r} is not a number") from None
        if not math.isfinite(v):
            raise InputError(path, lineno, f"weight {tok!r} of {label!r} is not finite")
        out.append(v)
    if not out:
        raise InputError(path, lineno, f"feature {label!r} has no weight values")
    return out


def parse_weight_line(line: str, path: str = "<weights>", lineno: int = 0
                      ) -> Tuple[str, List[float]]:
    """``(label, values)`` of one ``Name= v ...`` / ``Name: v`` / ``Name=v`` / ``name v`` line."""
    toks = line.split()
    first = toks[0]
    if first.endswith("=") or (first.endswith(":") and len(first) > 1):
        label, values = first[:-1], toks[1:]
    elif "=" in first:
        label, _, value = first.partition("=")
        values = [value] + toks[1:]
    else:
        label, values = first, toks[1:]
    if not label:
        raise InputError(path, lineno, f"weight line {line.strip()!r} has no feature name")
    return label, _numbers(values, path, lineno, label)


def read_weights(path: str) -> Weights:
    """Read a moses.ini or plain weights file (see the module doc); ``.gz`` allowed.
    Raises :class:`InputError` naming the file and line of anything malformed."""
    from nlmfeature.io.textio import iter_lines

    weights: Weights = {}
    where: Dict[str, int] = {}
    section = None
    saw_sections = False
    for lineno, raw in iter_lines(path):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _SECTION.match(line)
        if m:
            saw_sections = True
            section = m.group(1).strip()
            continue
        if saw_sections:
            if section in OLD_MOSES_SECTIONS:
                label = OLD_MOSES_SECTIONS[section]
                values = _numbers(line.split(), path, lineno, label)
                weights.setdefault(label, []).extend(values)
                where.setdefault(label, lineno)
                continue
            if section != "weight":
                continue
        label, values = parse_weight_line(line, path, lineno)
        if label in weights:
            raise InputError(path, lineno, f"feature {label!r} is given twice "
                             f"(first on line {where[label]})")
        weights[label] = values
        where[label] = lineno
    if not weights:
        what = "no [weight] section" if saw_sections else "no weights"
        raise InputError(path, 0, f"{what} found; expected 'Name= v1 v2 ...' lines "
                         "(or a moses.ini with a [weight] section)")
    return weights


def format_weights(weights: Weights) -> str:
    """The plain ``Name= v1 v2 ...`` text of ``weights`` (one line per label)."""
    from nlmfeature.mt.kbest import format_number

    return "".join(f"{label}= {' '.join(format_number(v) for v in vals)}\n"
                   for label, vals in weights.items())


def write_weights(path: str, weights: Weights) -> None:
    """Write ``weights`` atomically as ``Name= v1 v2 ...`` lines (``.gz`` compresses)."""
    from nlmfeature.io.atomicfile import open_output

    with open_output(path) as f:
        f.write(format_weights(weights))


#: the weight a new feature starts from is this fraction of the language model's
NEW_FEATURE_FRACTION = 0.5
#: the language model's weight assumed when the weights name no ``LM*`` feature
DEFAULT_LM_WEIGHT = 0.1


def new_feature_weight(weights: Weights) -> float:
    """The starting weight of a feature the weights do not name yet (a neural LM added to a
    tuned system): half the first weight of the language model (``LM0``, else the first
    ``LM*`` label), as ``bench mt`` starts its NLM features."""
    lm = weights.get("LM0") or next((v for k, v in weights.items() if k.startswith("LM")), None)
    return NEW_FEATURE_FRACTION * (lm[0] if lm else DEFAULT_LM_WEIGHT)


def with_new_features(labels: Sequence[Tuple[str, int]], weights: Weights
                      ) -> Tuple[Weights, List[str]]:
    """``weights`` plus a starting weight (:func:`new_feature_weight`) for every k-best
    feature ``[(label, number of values), ...]`` they do not name; returns (the weights, the
    labels added)."""
    start = new_feature_weight(weights)
    added = [label for label, _ in labels if label not in weights]
    out = dict(weights)
    out.update({label: [start] * k for label, k in labels if label in added})
    return out, added


def weights_for(labels: Sequence[Tuple[str, int]], weights: Weights, path: str = "<weights>"
                ) -> Tuple[List[float], List[str]]:
    """Flat weight vector for features ``[(label, number of values), ...]``.

    A label without a weight gets zeros and is listed in the second return value; a label
    whose weight count differs from its value count raises :class:`InputError`.
    """
    flat: List[float] = []
    missing: List[str] = []
    for label, k in labels:
        w = weights.get(label)
        if w is None:
            missing.append(label)
            flat.extend([0.0] * k)
        elif len(w) != k:
            raise InputError(path, 0, f"feature {label!r} has {len(w)} weight(s) but the k-best "
                             f"list gives it {k} value(s)")
        else:
            flat.extend(w)
    return flat, missing
