"""Reading and writing k-best (n-best) lists of Moses and cdec, streaming.

Line formats (fields separated by ``|||``)::

    moses      sid ||| hypothesis ||| Name= v1 v2 ... Name2= v ||| total [||| extra ...]
    moses-old  sid ||| hypothesis ||| d: v1 v2 ... lm: v ... ||| total [||| extra ...]
    cdec       sid ||| hypothesis ||| name=value name2=value ... ||| total [||| extra ...]

Moses labels carry one or more values (``Name=`` in current Moses, ``name:`` in the old
style); a cdec feature is one ``name=value`` token.  :func:`read_kbest` returns a
:class:`KBestReader`, an iterator of :class:`Hypothesis` that also reports what it saw:
``reader.format`` (``moses``, ``moses-old`` or ``cdec``, decided from the first line when
``fmt="auto"``), ``reader.lineno`` (the line of the last hypothesis returned) and
``reader.skipped`` (malformed lines skipped under ``skip_bad=True``).

:func:`format_hypothesis` writes the normalised form of a line, so that ``read -> format``
reproduces a file up to this **white-space and number normalisation**:

* fields are joined by ``" ||| "``; the id, hypothesis and each field are stripped, and
  runs of white space inside the hypothesis and the feature field become one space;
* numbers are written in the shortest form that reads back to the same float (Python's
  ``repr``), integral values without a fraction (``-9``, not ``-9.0``), so Moses' and cdec's
  own (``%g``-style) numbers come out unchanged;
* extra fields (e.g. word alignments) are copied verbatim apart from stripping.

Only ``moses-old`` writes ``label:``; ``moses`` writes ``Label=`` for both Moses styles if asked.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from nlmfeature.errors import InputError
from nlmfeature.io.textio import iter_lines, split_tokens

#: k-best formats :func:`read_kbest` and :func:`format_hypothesis` understand
FORMATS = ("moses", "moses-old", "cdec")
SEP = "|||"


@dataclass
class Hypothesis:
    """One k-best entry."""

    sid: int                                   #: sentence id
    text: str                                  #: hypothesis string (stripped)
    features: List[Tuple[str, List[float]]]    #: in file order; labels without '=' or ':'
    total: float                               #: the total score field (nan if absent)
    extra: List[str] = field(default_factory=list)  #: further fields, verbatim (stripped)

    def dense(self) -> List[float]:
        """All feature values flattened in file order (the dense vector used in tuning)."""
        return [v for _, vals in self.features for v in vals]

    def dense_names(self) -> List[str]:
        """Names of :meth:`dense`'s entries: ``Label_0 .. Label_{k-1}`` for a ``k``-valued
        label, plain ``Label`` for a single-valued one."""
        names: List[str] = []
        for label, vals in self.features:
            if len(vals) == 1:
                names.append(label)
            else:
                names.extend(f"{label}_{i}" for i in range(len(vals)))
        return names


# -- numbers --------------------------------------------------------------------------------
def format_number(value: float) -> str:
    """Shortest text that reads back as ``value``; integral values without ``.0``."""
    if value == 0.0:
        return "0"
    if math.isfinite(value) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(float(value))


def _number(token: str, path: str, lineno: int, what: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise InputError(path, lineno, f"{what}: {token!r} is not a number") from None
    if not math.isfinite(value):
        raise InputError(path, lineno, f"{what} is {token!r}: feature values and totals must be "
                         "finite numbers (a decoder wrote nan/inf; fix or drop that line, or "
                         "use --skip-bad)")
    return value


# -- parsing --------------------------------------------------------------------------------
def detect_format(line: str) -> str:
    """``moses``, ``moses-old`` or ``cdec`` from one k-best line (``moses`` when the feature
    field is empty or the line has too few fields to tell)."""
    fields = line.split(SEP)
    if len(fields) < 3:
        return "moses"
    for tok in fields[2].split():
        if tok.endswith("="):
            return "moses"
        if tok.endswith(":"):
            return "moses-old"
        if "=" in tok:
            return "cdec"
        return "moses"
    return "moses"


def _parse_moses_features(text: str, path: str, lineno: int) -> List[Tuple[str, List[float]]]:
    # fast path for well-formed fields; anything odd is re-parsed by the checking parser
    feats: List[Tuple[str, List[float]]] = []
    values: Any = None           # None before the first label: a value there fails below
    acc = 0.0                    # sum of the values: not finite iff one is nan/inf (or huge)
    try:
        for tok in text.split():
            last = tok[-1]
            if (last == "=" or last == ":") and len(tok) > 1:
                if values is not None and not values:
                    break
                values = []
                feats.append((tok[:-1], values))
            else:
                v = float(tok)
                acc += v
                values.append(v)
        else:
            if (values is None or values) and acc - acc == 0.0:
                return feats
    except (ValueError, AttributeError):
        pass
    return _check_moses_features(text, path, lineno)


def _check_moses_features(text: str, path: str, lineno: int) -> List[Tuple[str, List[float]]]:
    feats: List[Tuple[str, List[float]]] = []
    values: Optional[List[float]] = None
    label = ""
    for tok in text.split():
        last = tok[-1]
        if last == "=" or (last == ":" and len(tok) > 1):
            if values is not None and not values:
                raise InputError(path, lineno, f"feature label {label!r} has no values")
            label = tok[:-1]
            if not label:
                raise InputError(path, lineno, f"empty feature label {tok!r}")
            values = []
            feats.append((label, values))
        elif values is None:
            raise InputError(path, lineno, f"feature value {tok!r} comes before any label "
                             "(expected 'Name= v ...' or 'name: v ...')")
        elif "=" in tok:
            raise InputError(path, lineno, f"feature token {tok!r} looks like cdec's name=value "
                             "inside a Moses list; use --format cdec if the file is cdec's")
        else:
            values.append(_number(tok, path, lineno, f"value of feature {label!r}"))
    if values is not None and not values:
        raise InputError(path, lineno, f"feature label {label!r} has no values")
    return feats


def _parse_cdec_features(text: str, path: str, lineno: int) -> List[Tuple[str, List[float]]]:
    feats: List[Tuple[str, List[float]]] = []
    for tok in text.split():
        name, eq, value = tok.rpartition("=")
        if not eq or not name:
            raise InputError(path, lineno, f"feature token {tok!r} is not name=value "
                             "(use --format moses if the file is a Moses n-best list)")
        feats.append((name, [_number(value, path, lineno, f"value of feature {name!r}")]))
    return feats


def parse_line(line: str, fmt: str, path: str = "<input>", lineno: int = 0) -> Hypothesis:
    """Parse one k-best line (``fmt`` one of :data:`FORMATS`; both Moses styles are read
    by either Moses format).  Raises :class:`InputError` naming ``path:lineno``."""
    fields = line.rstrip("\r\n").split(SEP)
    if len(fields) < 3:
        raise InputError(path, lineno, f"a k-best line needs at least 3 '|||'-separated fields "
                         f"(id ||| hypothesis ||| features [||| total]), found {len(fields)}")
    sid_text = fields[0].strip()
    try:
        sid = int(sid_text)
    except ValueError:
        raise InputError(path, lineno, f"sentence id {sid_text!r} is not an integer") from None
    if sid < 0:
        raise InputError(path, lineno, f"sentence id {sid} is negative")
    if fmt == "cdec":
        feats = _parse_cdec_features(fields[2], path, lineno)
    elif fmt in ("moses", "moses-old"):
        feats = _parse_moses_features(fields[2], path, lineno)
    else:
        raise ValueError(f"unknown k-best format {fmt!r}; expected one of {FORMATS}")
    if len(fields) > 3:
        total_text = fields[3].strip()
        total = _number(total_text, path, lineno, "total score") if total_text else math.nan
    else:
        total = math.nan
    text = " ".join(split_tokens(fields[1]))
    return Hypothesis(sid, text, feats, total, [f.strip() for f in fields[4:]])


_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_WELL_FORMED = {
    "moses": re.compile(rf"\s*(?:\S+[=:](?:\s+{_NUM})+(?:\s+\S+[=:](?:\s+{_NUM})+)*)?\s*"),
    "cdec": re.compile(rf"\s*(?:\S+={_NUM}(?:\s+\S+={_NUM})*)?\s*"),
}
_WELL_FORMED["moses-old"] = _WELL_FORMED["moses"]


def check_line(line: str, fmt: str, path: str = "<input>", lineno: int = 0) -> Tuple[int, str]:
    """``(sid, hypothesis field)`` of a k-best line after checking all of it as
    :func:`parse_line` does (same errors), without building the feature list: a regular
    expression accepts well-formed lines and anything else goes through :func:`parse_line`.
    The hypothesis field is returned as it is (not stripped): use ``.split()``."""
    fields = line.split(SEP)
    if len(fields) >= 3 and _WELL_FORMED[fmt].fullmatch(fields[2]):
        try:
            sid = int(fields[0])
            if len(fields) > 3 and fields[3].strip():
                total = float(fields[3])          # the total must be a finite number
                if total - total != 0.0:
                    raise ValueError
            if sid >= 0:
                return sid, fields[1]
        except ValueError:
            pass
    hyp = parse_line(line, fmt, path, lineno)
    return hyp.sid, hyp.text


def sentence_id(line: str, path: str = "<input>", lineno: int = 0) -> int:
    """The sentence id of a k-best line without parsing the rest (fast)."""
    head, sep, _ = line.partition(SEP)
    if not sep:
        raise InputError(path, lineno, "a k-best line needs at least 3 '|||'-separated fields "
                         "(id ||| hypothesis ||| features [||| total]), found 1")
    try:
        sid = int(head)
    except ValueError:
        raise InputError(path, lineno, f"sentence id {head.strip()!r} is not an integer") from None
    if sid < 0:
        raise InputError(path, lineno, f"sentence id {sid} is negative")
    return sid


# -- formatting -----------------------------------------------------------------------------
def format_features(features: Iterable[Tuple[str, List[float]]], fmt: str) -> str:
    """The feature field of a line in ``fmt``; a multi-valued feature in ``cdec`` becomes
    ``Label_0=v0 Label_1=v1 ...``."""
    parts: List[str] = []
    if fmt == "cdec":
        for label, vals in features:
            if len(vals) == 1:
                parts.append(f"{label}={format_number(vals[0])}")
            else:
                parts.extend(f"{label}_{i}={format_number(v)}" for i, v in enumerate(vals))
    elif fmt in ("moses", "moses-old"):
        mark = ":" if fmt == "moses-old" else "="
        for label, vals in features:
            parts.append(label + mark)
            parts.extend(format_number(v) for v in vals)
    else:
        raise ValueError(f"unknown k-best format {fmt!r}; expected one of {FORMATS}")
    return " ".join(parts)


def format_hypothesis(hyp: Hypothesis, fmt: str) -> str:
    """One k-best line (no newline) that :func:`read_kbest` reads back as ``hyp``.  A nan
    total is written as an empty field when extra fields follow, else left out."""
    fields = [str(hyp.sid), hyp.text, format_features(hyp.features, fmt)]
    if not math.isnan(hyp.total) or hyp.extra:
        fields.append("" if math.isnan(hyp.total) else format_number(hyp.total))
    fields.extend(hyp.extra)
    return " ||| ".join(fields)


# -- reading --------------------------------------------------------------------------------
class KBestReader:
    """Iterator of :class:`Hypothesis` over a k-best file (see :func:`read_kbest`).

    Attributes: ``path``; ``format`` (the format used, known after the first line; ``None``
    before); ``lineno`` (line of the last hypothesis returned); ``skipped`` (number of
    malformed lines skipped, only with ``skip_bad``); ``lines`` (lines read).
    """

    def __init__(self, path: str, fmt: str = "auto", skip_bad: bool = False) -> None:
        if fmt != "auto" and fmt not in FORMATS:
            raise ValueError(f"unknown k-best format {fmt!r}; expected auto or one of {FORMATS}")
        self.path = path
        self.format: Optional[str] = None if fmt == "auto" else fmt
        self.skip_bad = skip_bad
        self.skipped = 0
        self.lineno = 0
        self.lines = 0
        self._it = self._generate()

    def __iter__(self) -> "KBestReader":
        return self

    def __next__(self) -> Hypothesis:
        return next(self._it)

    def _generate(self) -> Iterator[Hypothesis]:
        for lineno, line in iter_lines(self.path, stream=True):
            self.lines = lineno
            if not line.strip():
                self._bad(InputError(self.path, lineno, "empty line in a k-best list"))
                continue
            if self.format is None:
                self.format = detect_format(line)
            try:
                hyp = parse_line(line, self.format, self.path, lineno)
            except InputError as exc:
                self._bad(exc)
                continue
            self.lineno = lineno
            yield hyp

    def _bad(self, exc: InputError) -> None:
        if not self.skip_bad:
            raise exc
        self.skipped += 1


def read_kbest(path: str, fmt: str = "auto", skip_bad: bool = False) -> KBestReader:
    """Stream the hypotheses of a k-best file (constant memory).

    ``path``: plain, compressed (``.gz``, ``.bz2``, ``.xz``), ``-`` (standard input) or a
    named pipe (read with :func:`nlmfeature.io.textio.iter_lines`).  ``fmt``: ``moses`` (``Name=`` labels
    with one or more values, or old-style ``d: lm: tm: w:``), ``moses-old``, ``cdec``
    (``name=value`` tokens) or ``auto`` (decided from the first line).  A malformed line
    raises :class:`InputError` with the file and line number, unless ``skip_bad``: then it
    is skipped and counted in the returned reader's ``skipped`` attribute.
    """
    return KBestReader(path, fmt, skip_bad)


def group_by_sentence(hyps: Iterable[Hypothesis], path: str = ""
                      ) -> Iterator[Tuple[int, List[Hypothesis]]]:
    """(sid, hypotheses) for each consecutive run of one sentence id.

    A sid that reappears after another sentence (a list out of order or split) raises
    :class:`InputError`; when ``hyps`` is a :class:`KBestReader` the error names the line.
    Gaps in the ids (missing sentences) are not errors here: compare consecutive sids.
    """
    seen = set()
    current: List[Hypothesis] = []
    sid = -1
    where = path or getattr(hyps, "path", "") or "<k-best>"
    for hyp in hyps:
        if current and hyp.sid == sid:
            current.append(hyp)
            continue
        if current:
            yield sid, current
        if hyp.sid in seen:
            raise InputError(where, getattr(hyps, "lineno", 0),
                             f"sentence id {hyp.sid} reappears after sentence {sid}: the list is "
                             "out of order or concatenated; sort it by id (stable) first")
        seen.add(hyp.sid)
        sid = hyp.sid
        current = [hyp]
    if current:
        yield sid, current


def first_hypotheses(path: str, num_sentences: Optional[int] = None) -> List[str]:
    """The first (decoder-best) hypothesis of every sentence of a k-best list, indexed by
    sentence id: element ``i`` is sentence ``i``'s, whatever the order of the list.  With
    ``num_sentences`` (the reference's lines) an id outside ``0 .. num_sentences-1`` or a
    sentence without a hypothesis raises :class:`InputError`; without it the ids must be
    ``0 .. max`` with none missing."""
    reader = read_kbest(path)
    best: Dict[int, str] = {}
    for sid, hyps in group_by_sentence(reader, path):
        if sid < 0 or (num_sentences is not None and sid >= num_sentences):
            where = (f"the reference has {num_sentences} lines (ids 0..{num_sentences - 1})"
                     if num_sentences is not None else "ids start at 0")
            raise InputError(path, getattr(reader, "lineno", 0),
                             f"sentence id {sid} is outside the reference: {where}")
        best[sid] = hyps[0].text
    n = num_sentences if num_sentences is not None else (max(best) + 1 if best else 0)
    if not best:
        raise InputError(path, 0, "the k-best list is empty (no hypotheses)")
    missing = [i for i in range(n) if i not in best]
    if missing:
        raise InputError(path, 0, f"the k-best list covers {n - len(missing)} of the {n} "
                         f"sentences (first missing id {missing[0]}); a k-best list has "
                         "hypotheses for every sentence 0..N-1 of the reference")
    return [best[i] for i in range(n)]


def head_sentences(src: str, dst: str, sentences: int, kbest: bool) -> str:
    """Write the first ``sentences`` sentences of a k-best list (``kbest``: by sentence id) or
    of a text file (by line) to ``dst`` (atomically; ``.gz`` compresses); returns ``dst``."""
    from nlmfeature.io.atomicfile import open_output

    with open_output(dst) as out:
        for lineno, line in iter_lines(src):
            if kbest:
                if sentence_id(line, src, lineno) >= sentences:
                    break
            elif lineno > sentences:
                break
            out.write(line + "\n")
    return dst
