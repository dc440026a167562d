"""A Moses system, in one place: find the decoder, read a system's ``moses.ini`` with its paths
resolved, filter its tables to given inputs, binarise its LM, add feature lines and weights,
and run the decoder with timing and per-sentence times.

Every caller that touches Moses uses this module: ``nlmfeature bench mt``, the tuning driver
(``nlmfeature-tune moses``), ``benchmarks/bench_decoder.py``, ``benchmarks/bench_pcache.py``
and (Moses' tuning programs) ``benchmarks/bench_tuning.py``.

- :func:`find_moses`: ``--moses`` if given, else ``ROOT/bin/moses``, else the newest
  ``moses-cmd`` build under ``ROOT`` (``--moses-root`` / ``$MOSES_ROOT``); :func:`find_program`
  the same for Moses' other programs (``mert``, ``kbmira``, ``extractor``);
- :func:`find_build_binary`: KenLM's ``build_binary`` (given folders, ``$MOSES_ROOT/bin``,
  then :func:`nlmfeature.training.kenlm_baseline.find_tool`'s places);
- :func:`system_ini` / :func:`read_ini`: a system's config with ``MODEL_DIR/`` and
  ``${MODEL_PATH}/...`` paths (and relative ones) made absolute;
- :func:`prepare_system`: a copy of the config whose phrase and reordering tables are filtered
  to the inputs (:func:`filter_table`, in Python: the lines Moses'
  ``filter-model-given-input.pl`` keeps, byte for byte, without Perl or Moses' scripts) and
  whose ARPA LM is binarised, kept in a work folder and reused;
- :func:`add_features` / :func:`rewrite_moses_ini`: copies with feature lines added, weights
  set and ``key=value`` options set on the lines of given feature classes;
  :func:`set_search_algorithm`: a copy with another ``[search-algorithm]``;
- :func:`command`, :func:`run` (timed: wall, CPU, per-sentence "Translation took" seconds) and
  :func:`decode` (outputs written atomically, reused when present); :func:`decode_to_files`
  and :func:`run` serve cdec too (:mod:`nlmfeature.mt.cdec`, which also reuses
  :func:`binarise_lm` and :func:`read_ini`).

Malformed input raises :class:`~nlmfeature.errors.InputError` naming the file (and line); a
failing decoder :class:`~nlmfeature.errors.DecoderError` naming its log.
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from nlmfeature.errors import DecoderError, InputError, NLMFeatureError
from nlmfeature.io.atomicfile import (atomic_write_text, atomic_write_text_if_changed, open_output, remove_stale,
                                     temp_prefix)
from nlmfeature.io.textio import read_lines

Weights = Dict[str, List[float]]

#: the longest source phrase kept by :func:`filter_table` (``filter-model-given-input.pl``'s
#: ``$MAX_LENGTH``)
MAX_PHRASE_LENGTH = 10
#: feature classes whose text tables :func:`prepare_system` filters (as Moses' script does
#: for phrase-based systems; binary tables are left as they are)
FILTERED_FEATURES = ("PhraseDictionaryMemory", "LexicalReordering")
#: feature classes whose ARPA file :func:`prepare_system` binarises
LM_FEATURES = ("KENLM", "KENLMBIN", "LANGUAGEMODEL")
#: the configs a system folder is searched for, in order, when none is named
SYSTEM_INIS = ("moses.tuned.ini", "moses.ini", "moses.untuned.ini")

_SECTION = re.compile(r"^\s*\[([^\]]+)\]\s*$")
_PATH = re.compile(r"\bpath=(\S+)")
_TOOK = re.compile(r"Translation took ([0-9.]+) seconds total")


# -- finding the programs ------------------------------------------------------------------------
def moses_root(root: Optional[str] = None) -> Optional[str]:
    """``root`` if given, else ``$MOSES_ROOT`` (None when neither is set)."""
    return root or os.environ.get("MOSES_ROOT") or None


#: how to build a Moses with each of the package's features (moses_ff/README.md)
_FEATURE_BUILD = {
    "NLMFeature": "build it with moses_ff/moses.patch and bjam --with-nlmfeature",
    "NLMJointFeature": "rebuild it with moses_ff/moses-joint.patch applied after moses.patch",
}
#: the same for a Moses2 executable (both features come with moses2.patch)
_FEATURE_BUILD_MOSES2 = {
    "NLMFeature": "build it with moses_ff/moses2/NLMFeature.{h,cpp} copied into moses2/LM, "
                  "moses_ff/moses2.patch and bjam --with-nlmfeature moses2//moses2",
    "NLMJointFeature": "rebuild it with this package's moses_ff/moses2 files and moses2.patch",
}


def missing_features(exe: str, names: Sequence[str]) -> List[str]:
    """The feature names of ``names`` that the Moses executable ``exe`` does not register
    (its feature factory keeps every registered name as a string, stripped binaries too).
    Empty when it cannot tell: not an ELF executable with Moses' feature factory (e.g. a
    wrapper script)."""
    try:
        with open(exe, "rb") as f:
            data = f.read()
    except OSError:
        return []
    if not data.startswith(b"\x7fELF") or b"is not registered" not in data:
        return []
    return [n for n in names if n.encode("ascii") not in data]


def find_program(name: str, root: Optional[str] = None) -> Optional[str]:
    """A program of a Moses tree (``moses``, ``mert``, ``kbmira``, ``extractor``, ...):
    ``ROOT/bin/NAME`` if executable, else the newest ``ROOT/*/bin/**/NAME`` build (e.g.
    ``moses-cmd/bin/gcc-12/release/.../moses``, ``mert/bin/.../mert``); ``ROOT``: ``root`` or
    ``$MOSES_ROOT``.  None when there is none."""
    root = moses_root(root)
    if not root:
        return None
    installed = os.path.join(root, "bin", name)
    if os.path.isfile(installed) and os.access(installed, os.X_OK):
        return os.path.abspath(installed)
    cands = [p for p in glob.glob(os.path.join(root, "*", "bin", "**", name), recursive=True)
             if os.path.isfile(p) and os.access(p, os.X_OK)]
    return os.path.abspath(max(cands, key=os.path.getmtime)) if cands else None


def find_moses(moses: Optional[str] = None, root: Optional[str] = None,
               features: Sequence[str] = ("NLMFeature",)) -> str:
    """The Moses executable: ``moses`` if given (it must be executable), else ``ROOT/bin/moses``,
    else the newest ``moses`` build under ``ROOT`` (:func:`find_program`; ``ROOT``: ``root`` or
    ``$MOSES_ROOT``).  It must register the ``features`` (:func:`missing_features`: e.g.
    ``NLMJointFeature`` for a joint model), so that a run fails before its work, not at the
    decoder's first start.  Raises :class:`InputError` / :class:`NLMFeatureError` saying what to
    do."""
    if moses:
        path = os.path.abspath(moses)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise InputError(path, 0, "not an executable Moses (--moses / MOSES_ROOT)")
        return _with_features(path, features)
    root = moses_root(root)
    if not root:
        raise NLMFeatureError("give the Moses executable with --moses or set MOSES_ROOT (a "
                              "mosesdecoder tree with NLMFeature built in, moses_ff/README.md)")
    exe = find_program("moses", root)
    if not exe:
        raise InputError(root, 0, "no bin/moses and no moses-cmd build in this Moses tree "
                         "(MOSES_ROOT): build Moses with the shim first (moses_ff/README.md)")
    return _with_features(exe, features)


def _with_features(exe: str, features: Sequence[str]) -> str:
    missing = missing_features(exe, features)
    hints = _FEATURE_BUILD_MOSES2 if os.path.basename(exe).startswith("moses2") else _FEATURE_BUILD
    if missing:
        raise InputError(exe, 0, "this Moses has no " + " and no ".join(missing) + " compiled in: "
                         + "; ".join(hints.get(m, "") for m in missing)
                         + " (moses_ff/README.md)")
    return exe


def find_build_binary(*dirs: Optional[str]) -> str:
    """KenLM's ``build_binary``: in ``dirs`` (e.g. ``--kenlm-bin``), ``$MOSES_ROOT/bin``, then
    where :func:`~nlmfeature.training.kenlm_baseline.find_tool` looks."""
    from nlmfeature.training.kenlm_baseline import find_tool

    root = moses_root()
    return find_tool("build_binary", list(dirs) + ([os.path.join(root, "bin")] if root else []))


# -- reading a system's config -------------------------------------------------------------------
def system_ini(system: str, ini: Optional[str] = None) -> str:
    """The config of the system folder ``system``: ``ini`` if given, else the first of
    :data:`SYSTEM_INIS` found there."""
    if ini:
        if not os.path.isfile(ini):
            raise InputError(ini, 0, "no such moses.ini")
        return os.path.abspath(ini)
    for name in SYSTEM_INIS:
        path = os.path.join(system, name)
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise InputError(system, 0, f"no Moses config ({', '.join(SYSTEM_INIS)}) in this system folder")


def resolve_path(value: str, system: str) -> str:
    """A config's ``path=`` value made absolute: ``MODEL_DIR/x`` and ``${MODEL_PATH}/dir/x``
    (the forms Moses' training and EMS write) and relative paths are taken in ``system``."""
    value = value.replace("MODEL_DIR/", "")
    value = re.sub(r"^\$\{MODEL_PATH\}/[^/\s]+/?", "", value)
    return os.path.normpath(os.path.join(system, value))


def read_ini(path: str, system: Optional[str] = None) -> List[str]:
    """The lines of the moses.ini ``path`` with every ``path=`` of a feature line made absolute
    (:func:`resolve_path`; ``system``: the folder the paths are relative to, default the
    config's own)."""
    system = os.path.abspath(system or os.path.dirname(os.path.abspath(path)))
    out = []
    for line in read_lines(path):
        m = _PATH.search(line)
        if m and not line.lstrip().startswith("#"):
            line = line.replace(m.group(0), "path=" + resolve_path(m.group(1), system), 1)
        out.append(line)
    return out


def feature_lines(lines: Sequence[str]) -> List[str]:
    """The ``[feature]`` section's lines (without comments and blank lines)."""
    out, section = [], None
    for line in lines:
        m = _SECTION.match(line)
        if m:
            section = m.group(1).strip()
        elif section == "feature" and line.split("#", 1)[0].strip():
            out.append(line.split("#", 1)[0].strip())
    return out


# -- filtering and binarising --------------------------------------------------------------------
def source_phrases(paths: Sequence[str], max_length: int = MAX_PHRASE_LENGTH) -> Set[str]:
    """Every phrase of 1..``max_length`` words of the input texts ``paths``."""
    grams: Set[str] = set()
    for p in paths:
        for line in read_lines(p):
            toks = line.split()
            for i in range(len(toks)):
                for j in range(i + 1, min(len(toks), i + max_length) + 1):
                    grams.add(" ".join(toks[i:j]))
    return grams


def filter_table(src: str, dst: str, phrases: Set[str]) -> Tuple[int, int]:
    """Write to ``dst`` the lines of the phrase or reordering table ``src`` (``.gz`` or plain)
    whose source phrase is in ``phrases`` (as ``filter-model-given-input.pl``); returns
    (lines kept, lines read), or (-1, -1) when ``dst`` exists already (it is reused).

    The same lines as Moses' script for plain (one-factor, XML-free) input, the only input the
    decoder is given here: byte-identical tables on the 2,014 Multi30k dev + test sentences
    (``tests/test_moses.py`` compares on 40).  Unlike the script it does not strip XML markup
    from the input nor split ``word|factor`` tokens, and writes the tables uncompressed."""
    kept = total = 0
    if os.path.exists(dst):
        return -1, -1
    tmp = dst + ".tmp"
    try:
        with gzip.open(src, "rb") if src.endswith(".gz") else open(src, "rb") as f, \
                open(tmp, "wb") as out:
            for raw in f:
                total += 1
                key = raw.split(b" ||| ", 1)[0].decode("utf-8").strip()
                if key in phrases:
                    out.write(raw)
                    kept += 1
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise InputError(src, total + 1 if total else 0, f"cannot read this table ({exc})") from None
    if total == 0:
        os.unlink(tmp)
        raise InputError(src, 0, "an empty table: nothing to filter")
    os.replace(tmp, dst)
    return kept, total


def inputs_key(paths: Sequence[str]) -> str:
    """The key of a set of input files (sha1 of their sorted paths, 8 hex digits): tables
    filtered for other inputs get other names."""
    return hashlib.sha1("\n".join(sorted(paths)).encode("utf-8")).hexdigest()[:8]


def content_named_input(work: str, inputs: Sequence[str], ini: str) -> str:
    """The inputs ``inputs`` concatenated into ``work/filter-input.DIGEST.txt``, named by their
    content and the config ``ini``'s path: passed to :func:`prepare_system` by callers whose
    input files are rewritten between runs, a work folder reused with other inputs (or another
    system) gets other filtered tables."""
    text = [l for p in inputs for l in read_lines(p)]
    digest = hashlib.blake2b("\n".join([os.path.abspath(ini)] + text).encode("utf-8"),
                             digest_size=6).hexdigest()
    path = os.path.join(work, f"filter-input.{digest}.txt")
    if not os.path.exists(path):
        os.makedirs(work, exist_ok=True)
        atomic_write_text(path, "".join(l + "\n" for l in text))
    return path


def binarise_lm(arpa: str, dst: str, *kenlm_bin: Optional[str]) -> bool:
    """Binarise the ARPA LM ``arpa`` into ``dst`` with KenLM's ``build_binary`` unless ``dst``
    exists; returns whether it ran."""
    if os.path.exists(dst):
        return False
    tool = find_build_binary(*kenlm_bin)
    proc = subprocess.run([tool, arpa, dst + ".tmp"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise InputError(arpa, 0, f"{tool} failed on this LM:\n{proc.stderr[-2000:]}")
    os.replace(dst + ".tmp", dst)
    return True


@dataclass
class PreparedSystem:
    """What :func:`prepare_system` made: the new config and what it points at."""

    ini: str                           #: the config on the filtered tables and binary LM
    key: str                           #: :func:`inputs_key` of the inputs
    lm: Optional[str] = None           #: the (binarised) LM of the first LM feature line
    tables: Dict[str, str] = field(default_factory=dict)   #: original -> filtered table
    filter_seconds: float = 0.0        #: seconds spent filtering (0: everything reused)


def prepare_system(ini: str, work: str, inputs: Sequence[str], system: Optional[str] = None,
                   do_filter: bool = True, kenlm_bin: Sequence[Optional[str]] = (),
                   log: Optional[Callable[[str], None]] = None) -> PreparedSystem:
    """A copy of the moses.ini ``ini`` that loads fast, in ``work`` (``base.KEY.moses.ini``):
    paths made absolute (:func:`read_ini`, relative to ``system``), the tables of
    :data:`FILTERED_FEATURES` filtered to the phrases of ``inputs``
    (``filtered.KEY.NAME``, unless ``do_filter`` is false) and each ARPA LM binarised (the
    first LM line's into ``lm.bin``, the next ones' into ``lm.1.bin``, ``lm.2.bin``, ...).
    Files already in ``work`` are reused: name the inputs by their content."""
    t_start = time.time()
    os.makedirs(work, exist_ok=True)
    key = inputs_key(inputs)
    phrases: Optional[Set[str]] = None
    res = PreparedSystem(ini="", key=key)
    filter_seconds = 0.0
    out_lines = []
    section = None
    n_lm = 0                                   # LM feature lines so far
    for line in read_ini(ini, system):
        m = _SECTION.match(line)
        if m:
            section = m.group(1).strip()
        pm = _PATH.search(line)
        toks = line.split()
        if pm and section == "feature" and toks and not line.lstrip().startswith("#"):
            src = pm.group(1)
            if toks[0].upper() in LM_FEATURES:
                from nlmfeature.training.kenlm_baseline import is_arpa

                if is_arpa(src):
                    dst = os.path.join(work, "lm.bin" if n_lm == 0 else f"lm.{n_lm}.bin")
                    t0 = time.time()
                    if binarise_lm(src, dst, *kenlm_bin) and log:
                        log(f"binarised {src} ({time.time() - t0:.0f} s)")
                    line = line.replace(pm.group(0), "path=" + dst, 1)
                    src = dst
                res.lm = res.lm or src
                n_lm += 1
            elif do_filter and toks[0] in FILTERED_FEATURES:
                name = re.sub(r"\.gz$", "", os.path.basename(src))
                dst = os.path.join(work, f"filtered.{key}.{name}")
                if not os.path.exists(dst):
                    if phrases is None:
                        phrases = source_phrases(sorted(inputs))
                    t0 = time.time()
                    kept, total = filter_table(src, dst, phrases)
                    filter_seconds += time.time() - t0
                    if log:
                        log(f"filtered {os.path.basename(src)}: {kept:,} of {total:,} lines "
                            f"kept ({time.time() - t0:.0f} s)")
                res.tables[src] = dst
                line = line.replace(pm.group(0), "path=" + dst, 1)
        out_lines.append(line)
    res.ini = os.path.join(work, f"base.{key}.moses.ini")
    atomic_write_text(res.ini, "".join(l + "\n" for l in out_lines))
    res.filter_seconds = filter_seconds             # 0 unless a table was filtered
    if log and phrases is not None:
        log(f"system prepared in {time.time() - t_start:.0f} s: {res.ini}")
    return res


# -- writing configs -----------------------------------------------------------------------------
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


def moses_ini_lines(path: str, weights: Weights,
                    feature_options: Optional[Dict[str, Dict[str, str]]] = None,
                    features: Sequence[str] = (), first: bool = False) -> List[str]:
    """Lines of the moses.ini ``path`` with new weights, feature options and feature lines.

    ``weights``: the ``[weight]`` section's values of these labels are replaced (labels the
    section lacks are appended to it, a missing section is added; other lines are kept
    verbatim).  ``feature_options`` maps a feature class name (first token of a ``[feature]``
    line, e.g. ``NLMFeature``) to ``{key: value}`` options set on its lines.  ``features``:
    lines added to the ``[feature]`` section, at its start with ``first``, else after its last
    feature line.
    """
    from nlmfeature.mt.kbest import format_number

    feature_options = feature_options or {}
    lines = read_lines(path)
    out: List[str] = []
    section = None
    done = set()
    saw_weight = False
    feature_end = -1                   # where the added feature lines go (index in out)

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
            if section == "feature":
                feature_end = len(out)
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
            if toks and not first:
                feature_end = len(out) + 1
        out.append(line)
    if section == "weight":
        flush_missing()
    if not saw_weight:
        out.append("[weight]")
        flush_missing()
    if features:
        if feature_end < 0:
            raise InputError(path, 0, "no [feature] section to add feature lines to")
        out[feature_end:feature_end] = list(features)
    return out


def rewrite_moses_ini(src: str, dst: str, weights: Weights,
                      feature_options: Optional[Dict[str, Dict[str, str]]] = None,
                      features: Sequence[str] = (), first: bool = False) -> str:
    """Write a copy of moses.ini ``src`` to ``dst`` (atomically) with ``weights``, feature
    options and added feature lines (:func:`moses_ini_lines`); returns ``dst``."""
    lines = moses_ini_lines(src, weights, feature_options, features, first)
    # an unchanged config keeps its time: decodes made with it stay valid (decode_to_files)
    atomic_write_text_if_changed(dst, "\n".join(lines) + "\n")
    return dst


def feature_label(line: str, index: int) -> str:
    """The weight label of a ``[feature]`` line: its ``name=`` option, else Moses' default
    (the feature class and ``index``, its count among earlier lines of the same class)."""
    toks = line.split("#", 1)[0].split()
    for tok in toks[1:]:
        if tok.startswith("name="):
            return tok[5:]
    return f"{toks[0]}{index}"


def drop_features(src: str, dst: str, classes: Sequence[str]) -> List[str]:
    """Write moses.ini ``src`` to ``dst`` (atomically) without its feature lines of the
    classes ``classes`` (``KENLM``, ...) and their ``[weight]`` lines; returns the dropped
    labels.  A class ``src`` lacks is an error naming the file."""
    lines = read_lines(src)
    sections, section = [], None      # the section of every line (None: a section header)
    for line in lines:
        m = _SECTION.match(line)
        section = m.group(1).strip() if m else section
        sections.append(None if m else section)
    seen, dropped, gone = {}, [], set()
    for i, (sec, line) in enumerate(zip(sections, lines)):
        toks = line.split("#", 1)[0].split() if sec == "feature" else []
        if toks:
            k = seen.get(toks[0], 0)
            seen[toks[0]] = k + 1
            if toks[0] in classes:
                dropped.append(feature_label(line, k))
                gone.add(i)
    # the weights after the labels: a [weight] section may come before [feature]
    gone.update(i for i, (sec, line) in enumerate(zip(sections, lines))
                if sec == "weight" and _label_of(line) in dropped)
    keep = [line for i, line in enumerate(lines) if i not in gone]
    missing = [c for c in classes if c not in seen]
    if missing:
        raise InputError(src, 0, f"no {', '.join(missing)} feature line to remove")
    with open_output(dst) as f:
        f.write("\n".join(keep) + "\n")
    return dropped


def add_features(src: str, dst: str, features: Sequence[str], weights: Weights,
                 first: bool = False) -> str:
    """``src`` plus the feature lines ``features`` (at the start of the ``[feature]`` section
    with ``first``, else at its end) and ``weights`` set, written to ``dst``; returns ``dst``."""
    return rewrite_moses_ini(src, dst, weights, features=features, first=first)


def set_search_algorithm(src: str, dst: str, algorithm: str) -> str:
    """``src`` with its ``[search-algorithm]`` section (if any) replaced by one holding
    ``algorithm`` (Moses' and Moses2's numbers: 0 normal, 1 cube pruning, ...), written to
    ``dst`` (which may be ``src``); returns ``dst``."""
    with open(src, encoding="utf-8") as f:
        text = re.sub(r"(?ms)^\[search-algorithm\]\n[^\[]*", "", f.read()).rstrip("\n")
    atomic_write_text(dst, text + f"\n\n[search-algorithm]\n{algorithm}\n")
    return dst


# -- running the decoder -------------------------------------------------------------------------
def command(moses: str, ini: str, src: Optional[str] = None, threads: int = 1,
            nbest: Optional[str] = None, nbest_size: int = 100, distinct: bool = False,
            alignment: bool = False, extra: Sequence[str] = ()) -> List[str]:
    """The Moses command line: translate ``src`` (standard input when None) with ``ini`` on
    ``threads`` threads; with ``nbest`` also the ``nbest_size``-best list into that file
    (``distinct`` strings; ``alignment``: each hypothesis with its word alignment, Moses
    ``-print-alignment-info-in-n-best``); ``extra`` arguments last."""
    cmd = [moses, "-config", ini]
    if src is not None:
        cmd += ["-input-file", src]
    cmd += ["-threads", str(threads)]
    if nbest:
        cmd += ["-n-best-list", nbest, str(nbest_size)] + (["distinct"] if distinct else [])
        if alignment:
            cmd.append("-print-alignment-info-in-n-best")
    return cmd + list(extra)


def sentence_seconds(stderr: str) -> List[float]:
    """Moses' per-sentence "Translation took N seconds total" figures, in order."""
    return [float(m.group(1)) for m in _TOOK.finditer(stderr)]


@dataclass
class Run:
    """One timed decoder run (:func:`run`)."""

    wall: float                        #: wall seconds of the process
    cpu: float                         #: its user + system CPU seconds
    stdout: str
    stderr: str
    sentence_seconds: List[float]      #: the decoder's per-sentence seconds (Moses' "Translation took")
    max_rss: int = 0                   #: the process's peak resident memory, bytes (sampled every 50 ms; 0: unknown)

    @property
    def translation(self) -> float:
        """The sum of the per-sentence seconds."""
        return sum(self.sentence_seconds)

    @property
    def output(self) -> List[str]:
        """The lines of the standard output (the decoder's 1-best translations)."""
        return self.stdout.splitlines()


def run(cmd: List[str], stdin: Optional[str] = None, env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        per_sentence: Callable[[str], List[float]] = sentence_seconds) -> Run:
    """Run a decoder command (``stdin``: a file fed to it) capturing its output, timed: wall
    and CPU seconds (of this child alone, from its own resource usage), its peak resident
    memory (its VmHWM, read every 50 ms while it runs; Linux) and the per-sentence times ``per_sentence`` reads from its standard error (default
    Moses'; cdec's: :func:`nlmfeature.mt.cdec.run`).  Raises :class:`DecoderError` with the
    end of its standard error when it fails."""
    import threading

    t0 = time.perf_counter()
    fin = open(stdin, "rb") if stdin else None
    try:
        p = subprocess.Popen(cmd, stdin=fin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    finally:
        if fin:
            fin.close()
    chunks: Dict[str, bytes] = {}

    def drain(name: str, stream) -> None:
        chunks[name] = stream.read()
        stream.close()

    peak = [0]
    done = threading.Event()

    def watch() -> None:
        # the peak resident memory of the decoder's own address space (VmHWM): the resource
        # usage of a child also counts, from before its exec, the memory of the process that
        # started it (Linux keeps the larger), which would credit a decoder with ours
        status = f"/proc/{p.pid}/status"
        while not done.wait(0.05):
            try:
                with open(status, "rb") as f:
                    for line in f:
                        if line.startswith(b"VmHWM:"):
                            peak[0] = max(peak[0], int(line.split()[1]) * 1024)
            except (OSError, ValueError):
                return

    readers = [threading.Thread(target=drain, args=(n, s), daemon=True)
               for n, s in (("out", p.stdout), ("err", p.stderr))] + [threading.Thread(target=watch, daemon=True)]
    try:
        for t in readers:
            t.start()
        for t in readers[:2]:
            t.join()
        _, status, usage = os.wait4(p.pid, 0)   # (reaps the child: its own CPU time)
    except BaseException:                       # Ctrl-C: the decoder does not outlive us
        p.kill()
        p.wait()
        raise
    finally:
        done.set()
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    out, err = chunks["out"].decode("utf-8", "replace"), chunks["err"].decode("utf-8", "replace")
    if p.returncode != 0:
        raise DecoderError(f"failed ({' '.join(cmd)}):\n{err[-3000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime, out, err, per_sentence(err), peak[0])


def decode(moses: str, ini: str, src: str, out: str, threads: int = 1, kbest: int = 0,
           kbest_out: Optional[str] = None, distinct: bool = False,
           alignment: bool = False) -> float:
    """Translate ``src`` into ``out`` (1-best; the decoder's log in ``out.log``), and with
    ``kbest`` the ``kbest``-best list into ``kbest_out`` (``alignment``: with word
    alignments); the outputs appear whole or not at all, and existing ones are reused unless
    ``ini`` or ``src`` changed after they were written (e.g. a tuning run on to more
    iterations).  Returns the wall seconds (those of the run that wrote ``out``, kept in
    ``out.seconds``; 0 when unknown)."""
    return decode_to_files(
        lambda ktmp: command(moses, ini, src, threads, ktmp, kbest, distinct, alignment),
        out, kbest_out if kbest else None, inputs=(ini, src))


def decode_to_files(cmd_for: Callable[[Optional[str]], List[str]], out: str,
                    kbest_out: Optional[str] = None, stdin: Optional[str] = None,
                    inputs: Sequence[str] = ()) -> float:
    """Run the decoder command ``cmd_for(KBEST_TMP)`` (``KBEST_TMP``: where it writes its
    k-best list, None without ``kbest_out``) with the file ``stdin`` (if any) as its standard
    input, its standard output into ``out`` and its standard error into ``out.log``; the outputs appear whole or not at all (temporary names
    of this process, renamed when the decoder succeeded) and existing ones are reused, unless
    one of the files ``inputs`` is newer.
    Returns the wall seconds (kept in ``out.seconds``; 0 when unknown).  Moses'
    :func:`decode` and :func:`nlmfeature.mt.cdec.decode` run through it."""
    done = [p for p in (out, kbest_out) if p]
    if all(os.path.exists(p) for p in done) and any(
            os.path.exists(i) and os.path.getmtime(i) > os.path.getmtime(p) for i in inputs for p in done):
        for p in done:
            os.unlink(p)
    if os.path.exists(out) and (not kbest_out or os.path.exists(kbest_out)):
        meta = out + ".seconds"
        return float(open(meta).read()) if os.path.exists(meta) else 0.0
    # temporary names of this process only: an interrupted run's decoder cannot write into them
    remove_stale(out)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(out), dir=os.path.dirname(out))
    os.close(fd)
    ktmp = None
    if kbest_out:
        remove_stale(kbest_out)
        fd, ktmp = tempfile.mkstemp(prefix=temp_prefix(kbest_out),
                                    dir=os.path.dirname(kbest_out))
        os.close(fd)
    cmd = cmd_for(ktmp)
    t0 = time.time()
    try:
        with open(tmp, "wb") as f, open(out + ".log", "wb") as err, \
                open(stdin or os.devnull, "rb") as fin:
            proc = subprocess.Popen(cmd, stdin=fin, stdout=f, stderr=err)
            try:
                status = proc.wait()
            except BaseException:       # Ctrl-C / SIGTERM: the decoder goes too
                proc.kill()
                proc.wait()
                raise
        if status != 0:
            raise DecoderError(f"{cmd[0]} failed (status {status}); see {out}.log")
        seconds = time.time() - t0
        if ktmp:
            os.replace(ktmp, kbest_out)
        os.replace(tmp, out)
    finally:
        for t in (tmp, ktmp):
            if t and os.path.exists(t):
                os.unlink(t)
    atomic_write_text(out + ".seconds", repr(seconds) + "\n")   # exact: a rerun reports the same
    return seconds
