"""Append neural-LM features to Moses / cdec k-best lists: the work of ``nlmfeature rescore``
(alias ``nlmfeature-rescore``; its flags are :mod:`nlmfeature.commands.rescore`'s).

For every hypothesis, each ``--model`` adds one feature: the sentence's natural-log
probability (the sum of :meth:`Model.score_sentence`, ``</s>`` included; for a joint model,
given the source sentence of ``--source`` and the hypothesis' word alignment, the field of
``i-j`` points Moses writes with ``-print-alignment-info-in-n-best``), named ``NLM0``,
``NLM1``, ... (``--name`` overrides); ``--oov-feature`` also adds ``NLMOOV0``, ... (the count
of tokens not in that model's vocabulary).  The features are appended to the feature field
in the file's own style (``NLM0= v`` in Moses lists, ``NLM0: v`` in old-style ones,
``NLM0=v`` in cdec's); the rest of each line is copied unchanged.  Names may not contain
``_``: Moses' mert tools take such features for sparse ones.

The input is streamed (constant memory): whole sentences are cut into chunks, scored in
batches through matrix products, by ``--jobs`` worker processes if asked, and written in
input order.  A ``.gz`` output is written as one gzip member per chunk, compressed by the
workers (concatenated members are one valid gzip file for gzip, zlib and Python).  ``--weights`` reranks each sentence by the dot product of the weights with
the features (new ones included) and writes the 1-best text to ``--one-best``; a sentence
id missing from the list gets an empty 1-best line and a warning (as Moses does).
"""
from __future__ import annotations

import argparse
import gzip
import math
import os
import re
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Iterator, List, Optional, Sequence, Set, Tuple

from nlmfeature.io.atomicfile import GZIP_LEVEL, check_output, open_output
from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.mt.kbest import (FORMATS, SEP, Hypothesis, check_line, detect_format, format_number,
                    parse_line, sentence_id)
from nlmfeature.io.textio import check_input, iter_lines, split_tokens
from nlmfeature.mt.weights import Weights, read_weights

#: characters a feature name may not contain (``_`` makes Moses' mert treat it as sparse)
_BAD_NAME = re.compile(r"[_=:|\s]")
#: at most this many skipped-line messages are printed with --skip-bad
MAX_REPORTED = 5
#: without --sentences, --one-best pads at most this many missing sentence ids in all with
#: empty lines (a list whose ids jump further is refused: a corrupt id such as 10^12 would
#: otherwise write a terabyte of empty lines)
MAX_MISSING = 100_000
#: largest --sentences accepted
MAX_SENTENCES = 100_000_000
#: missing sentence ids listed in the summary
SHOWN_MISSING = 20


# -- configuration ---------------------------------------------------------------------------
@dataclass
class RescoreConfig:
    """Everything a worker needs to rescore a chunk (picklable)."""

    models: List[str]
    names: List[str]                    #: log-probability feature name per model
    oov_names: List[str]                #: OOV-count feature name per model (empty: none)
    path: str                           #: input path, for messages
    fmt: str                            #: moses, moses-old or cdec
    skip_bad: bool = False
    weights: Optional[Weights] = None
    update_total: bool = False
    batch_size: int = 8192
    verify: bool = True
    compress: bool = False              #: return each chunk as a gzip member
    source: Optional[str] = None        #: joint models: source sentences, line = sentence id


def check_name(name: str) -> str:
    """Return ``name`` if it is a valid dense feature name, else raise :class:`NLMFeatureError`."""
    if not name or _BAD_NAME.search(name):
        raise NLMFeatureError(
            f"feature name {name!r} is not allowed: it must be non-empty and contain no '_' "
            "(Moses' mert tools treat names with '_' as sparse features), white space, "
            "'=', ':' or '|'; e.g. NLM0 or NLMbig")
    return name


def feature_names(n_models: int, names: Optional[Sequence[str]], oov: bool,
                  oov_names: Optional[Sequence[str]] = None) -> Tuple[List[str], List[str]]:
    """(log-prob names, OOV names) for ``n_models`` models, validated and distinct."""
    if names:
        if len(names) != n_models:
            raise NLMFeatureError(f"--name was given {len(names)} time(s) for {n_models} "
                                  "--model(s): give one name per model")
        lp = list(names)
    else:
        lp = [f"NLM{i}" for i in range(n_models)]
    if oov_names:
        if not oov:
            raise NLMFeatureError("--oov-name needs --oov-feature")
        if len(oov_names) != n_models:
            raise NLMFeatureError(f"--oov-name was given {len(oov_names)} time(s) for "
                                  f"{n_models} --model(s)")
        ov = list(oov_names)
    elif oov:
        ov = [f"{n}OOV" for n in lp] if names else [f"NLMOOV{i}" for i in range(n_models)]
    else:
        ov = []
    all_names = lp + ov
    for n in all_names:
        check_name(n)
    dup = {n for n in all_names if all_names.count(n) > 1}
    if dup:
        raise NLMFeatureError(f"feature name(s) {sorted(dup)} given twice")
    return lp, ov


# -- the work on one chunk --------------------------------------------------------------------
@dataclass
class ChunkResult:
    """What rescoring one chunk gives back to the writer."""

    data: bytes                                  #: output lines (UTF-8, gzip member if compress)
    hypotheses: int                              #: hypotheses written
    skipped: int = 0                             #: malformed lines skipped (--skip-bad)
    messages: List[str] = field(default_factory=list)   #: first skipped-line messages
    best: List[Tuple[int, str]] = field(default_factory=list)  #: (sid, 1-best text) in order
    unweighted: Set[str] = field(default_factory=set)    #: labels without a weight
    error: Optional[Tuple[str, int, str]] = None  #: (path, line, message) of a fatal error
    tokens: int = 0                              #: hypothesis tokens scored (without </s>)
    oovs: List[int] = field(default_factory=list)  #: per model: tokens not in its vocabulary


def _error_parts(exc: InputError) -> Tuple[str, int, str]:
    prefix = f"{exc.path}:{exc.line}: " if exc.line else f"{exc.path}: "
    msg = str(exc)
    return exc.path, exc.line, msg[len(prefix):] if msg.startswith(prefix) else msg


class Rescorer:
    """Rescores chunks of k-best lines with loaded models (one per process)."""

    def __init__(self, cfg: RescoreConfig) -> None:
        from nlmfeature.core.model import load

        self.cfg = cfg
        self.models = [load(p, verify=cfg.verify) for p in cfg.models]
        self.joint = any(m.header.get("source") for m in self.models)
        self.sources: List[List[str]] = []
        if self.joint:
            if not cfg.source:
                raise NLMFeatureError("a joint model (trained with --source) needs the source "
                                      "sentences of the k-best list: give --source FILE")
            self.sources = [split_tokens(line) for _, line in iter_lines(cfg.source)]
        self.new_names = set(cfg.names) | set(cfg.oov_names)
        self.mark = {"moses": "=", "moses-old": ":", "cdec": "="}[cfg.fmt]
        self.sep = "" if cfg.fmt == "cdec" else " "

    def _append(self, line: str, values: Sequence[Tuple[str, float]], total: Optional[float]
                ) -> str:
        fields = line.split(SEP)
        added = " ".join(f"{n}{self.mark}{self.sep}{format_number(v)}" for n, v in values)
        feats = fields[2].rstrip()
        fields[2] = (feats + " " + added + " ") if feats.strip() else (" " + added + " ")
        if total is not None:
            if len(fields) > 3:
                fields[3] = " " + format_number(total)
            else:
                fields.append(" " + format_number(total))
        return SEP.join(fields)

    def run(self, lines: Sequence[Tuple[int, str]]) -> ChunkResult:
        """Rescore whole sentences: ``lines`` are (line number, text) pairs."""
        cfg = self.cfg
        res = ChunkResult(b"", 0)
        kept: List[Tuple[int, str, Optional[Hypothesis]]] = []
        tokens: List[List[str]] = []
        full = cfg.weights is not None           # reranking needs the feature values
        aligns: List[List[Tuple[int, int]]] = []
        srcs: List[List[str]] = []
        for lineno, line in lines:
            try:
                if full or self.joint or any(n in line for n in self.new_names):
                    hyp: Optional[Hypothesis] = parse_line(line, cfg.fmt, cfg.path, lineno)
                    text = hyp.text
                    clash = self.new_names.intersection(lbl for lbl, _ in hyp.features)
                    if clash:
                        raise InputError(cfg.path, lineno, f"the list already has feature(s) "
                                         f"{sorted(clash)}; choose other names with --name")
                else:   # only check the line: faster than building the features
                    hyp = None
                    text = check_line(line, cfg.fmt, cfg.path, lineno)[1]
                if self.joint:
                    from nlmfeature.core.joint import alignment_field, parse_alignment
                    assert hyp is not None
                    if not 0 <= hyp.sid < len(self.sources):
                        raise InputError(cfg.path, lineno, f"sentence id {hyp.sid} has no line in "
                                         f"--source {cfg.source} ({len(self.sources)} lines)")
                    src = self.sources[hyp.sid]
                    al = parse_alignment(alignment_field(hyp.extra, cfg.path, lineno), len(src),
                                         len(split_tokens(text)), cfg.path, lineno)
            except InputError as exc:
                if not cfg.skip_bad:
                    res.error = _error_parts(exc)
                    return res
                res.skipped += 1
                if len(res.messages) < MAX_REPORTED:
                    res.messages.append(str(exc))
                continue
            kept.append((lineno, line, hyp))
            tokens.append(split_tokens(text))
            if self.joint:
                srcs.append(src)
                aligns.append(al)
        columns: List[Tuple[str, List[float]]] = []
        res.tokens = sum(len(t) for t in tokens)
        for model, name in zip(self.models, cfg.names):
            counts = [0]
            if model.header.get("source"):
                from nlmfeature.core.joint import joint_sentence_logprobs
                given, scored, al, vocab = srcs, tokens, aligns, model.vocab
                if model.target_to_source:   # log p(source | hypothesis): the roles swap
                    given, scored, vocab = tokens, srcs, model.source_vocab
                    al = [[(j, i) for i, j in a] for a in aligns]
                columns.append((name, joint_sentence_logprobs(model, given, scored, al, cfg.batch_size)))
                counts[0] = sum(1 for toks in tokens for t in toks if vocab.is_oov(t))
            else:
                columns.append((name, sentence_logprobs(model, tokens, cfg.batch_size, counts)))
            res.oovs.append(counts[0])
        for model, name in zip(self.models, cfg.oov_names):
            vocab = model.vocab
            columns.append((name, [float(sum(1 for t in toks if vocab.is_oov(t)))
                                   for toks in tokens]))
        out: List[str] = []
        best_sid, best_score, best_text = -1, -math.inf, ""
        for i, (lineno, line, hyp) in enumerate(kept):
            values = [(name, col[i]) for name, col in columns]
            total = None
            if hyp is not None and cfg.weights is not None:
                hyp.features.extend((n, [v]) for n, v in values)
                score = self._dot(hyp, res.unweighted, lineno)
                if cfg.update_total:
                    total = score
                if hyp.sid != best_sid:
                    if best_sid >= 0:
                        res.best.append((best_sid, best_text))
                    best_sid, best_score, best_text = hyp.sid, score, hyp.text
                elif score > best_score:
                    best_score, best_text = score, hyp.text
            out.append(self._append(line, values, total))
        if best_sid >= 0:
            res.best.append((best_sid, best_text))
        data = "".join(l + "\n" for l in out).encode("utf-8")
        res.data = gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0) if cfg.compress else data
        res.hypotheses = len(kept)
        return res

    def _dot(self, hyp: Hypothesis, unweighted: Set[str], lineno: int) -> float:
        w = self.cfg.weights
        assert w is not None
        s = 0.0
        for label, vals in hyp.features:
            ws = w.get(label)
            if ws is None:
                unweighted.add(label)
                continue
            if len(ws) != len(vals):
                raise InputError(self.cfg.path, lineno, f"feature {label!r} has {len(vals)} value(s) "
                                 f"in the k-best list but {len(ws)} weight(s)")
            s += sum(a * b for a, b in zip(ws, vals))
        return s


def sentence_logprobs(model: Any, sentences: Sequence[Sequence[str]],
                      batch_size: int = 8192, oovs: Optional[List[int]] = None) -> List[float]:
    """Natural-log probabilities of many tokenised sentences; equal to
    ``[model.sentence_logprob(s) for s in sentences]`` to float rounding.  ``oovs[0]`` (if
    given) is increased by the number of tokens scored as ``<unk>``.

    Same n-grams as :meth:`Model.score_sentences` (``<s>``-padded contexts, ``</s>`` scored),
    but the contexts of all sentences are built at once with numpy instead of one
    ``pad_context`` call per token, which roughly halves the time on k-best lists; the
    scores come from :meth:`Model.score_batch` (the matrix path).
    """
    import numpy as np

    if not sentences:
        return []
    if getattr(model, "reverse", False):   # a right-to-left model reads the words backwards
        sentences = [s[::-1] for s in sentences]
    vocab = model.vocab
    c = model.order - 1
    lengths = np.fromiter((len(s) + 1 for s in sentences), dtype=np.int64, count=len(sentences))
    get, unk, bos, eos = vocab._index.get, vocab.unk, vocab.bos, vocab.eos
    pad = [bos] * c
    flat: List[int] = []
    for s in sentences:   # per sentence: c x <s>, the word ids, </s>
        flat.extend(pad)
        if "<s>" in s or "</s>" in s or "<null>" in s:   # markers, not words: <unk>
            flat.extend(vocab.text_ids(s).tolist())
        else:
            flat.extend([get(w, unk) for w in s])
        flat.append(eos)
    padded = np.array(flat, dtype=np.int32)
    if oovs is not None:
        oovs[0] += int(np.count_nonzero(padded == unk))
    # n-gram windows (c context ids + the word) start at every word position of a sentence
    starts_of_sent = np.concatenate([[0], np.cumsum(lengths + c)[:-1]])
    n = int(lengths.sum())
    sent_of_ngram = np.repeat(np.arange(len(sentences)), lengths)
    first_ngram = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pos = np.arange(n) - first_ngram[sent_of_ngram] + starts_of_sent[sent_of_ngram]
    windows = np.lib.stride_tricks.sliding_window_view(padded, c + 1)[pos]
    scores = np.empty(n, dtype=np.float64)
    for a in range(0, n, batch_size):
        b = min(n, a + batch_size)
        scores[a:b] = model.score_batch(np.ascontiguousarray(windows[a:b, :c]),
                                        np.ascontiguousarray(windows[a:b, c]))
    sums = np.add.reduceat(scores, first_ngram) if n else np.zeros(len(sentences))
    return [float(x) for x in sums]


_WORKER: Optional[Rescorer] = None


def _init_worker(cfg: RescoreConfig) -> None:
    global _WORKER
    _WORKER = Rescorer(cfg)


def _work(lines: Sequence[Tuple[int, str]]) -> ChunkResult:
    assert _WORKER is not None
    try:
        return _WORKER.run(lines)
    except InputError as exc:
        r = ChunkResult(b"", 0)
        r.error = _error_parts(exc)
        return r


# -- reading chunks of whole sentences ---------------------------------------------------------
class Chunker:
    """Cuts a k-best file into chunks of whole sentences and checks the sentence ids.

    Reports (on ``warn``) ids missing between consecutive sentences; a sid that reappears
    after another sentence is an :class:`InputError`; so is a decreasing id when
    ``strict_order`` (needed for a 1-best file, whose lines follow the ids).  ``sids`` lists
    the sentence ids in file order (for the 1-best writer).

    For a 1-best output (``strict_order``), ``sentences`` (the set size, if known) bounds the
    ids; without it the ids may skip at most :data:`MAX_MISSING` sentences in all.
    """

    def __init__(self, path: str, chunk_size: int, skip_bad: bool, strict_order: bool,
                 warn, sentences: Optional[int] = None) -> None:
        self.path = path
        self.max_sentences = sentences
        self.missing = 0
        self.chunk_size = chunk_size
        self.skip_bad = skip_bad
        self.strict_order = strict_order
        self.warn = warn
        self.skipped = 0
        self.messages: List[str] = []
        self.first_line: Optional[str] = None
        self.seen: Set[int] = set()
        self.lines = 0
        self.sentences = 0

    def _bad(self, exc: InputError) -> None:
        if not self.skip_bad:
            raise exc
        self.skipped += 1
        if len(self.messages) < MAX_REPORTED:
            self.messages.append(str(exc))

    def chunks(self) -> Iterator[List[Tuple[int, str]]]:
        chunk: List[Tuple[int, str]] = []
        prev = -1
        for lineno, line in iter_lines(self.path, stream=True):
            self.lines = lineno
            if not line.strip():
                self._bad(InputError(self.path, lineno, "empty line in a k-best list"))
                continue
            try:
                sid = sentence_id(line, self.path, lineno)
            except InputError as exc:
                self._bad(exc)
                continue
            if sid != prev:
                if sid in self.seen:
                    raise InputError(self.path, lineno, f"sentence id {sid} reappears after "
                                     f"sentence {prev}: the list is out of order or "
                                     "concatenated; sort it by id (stable) first")
                if sid < prev:
                    msg = (f"sentence id {sid} comes after {prev}: the list is not sorted by id")
                    if self.strict_order:
                        raise InputError(self.path, lineno, msg + "; the 1-best output needs "
                                         "sorted ids (sort the list with a stable sort)")
                    self.warn(f"{self.path}:{lineno}: {msg}")
                elif sid > prev + 1:
                    self._check_gap(sid, prev, lineno)
                    gap = (f"{prev + 1}" if sid == prev + 2 else f"{prev + 1}..{sid - 1}")
                    self.warn(f"{self.path}:{lineno}: sentence id(s) {gap} missing "
                              f"(before id {sid})")
                if self.strict_order and self.max_sentences is not None \
                        and sid >= self.max_sentences:
                    raise InputError(self.path, lineno, f"sentence id {sid} but --sentences is "
                                     f"{self.max_sentences} (ids 0..{self.max_sentences - 1})")
                self.seen.add(sid)
                self.sentences += 1
                if len(chunk) >= self.chunk_size:
                    yield chunk
                    chunk = []
                prev = sid
            if self.first_line is None:
                self.first_line = line
            chunk.append((lineno, line))
        if chunk:
            yield chunk


    def _check_gap(self, sid: int, prev: int, lineno: int) -> None:
        """With a 1-best output, refuse an id that would pad absurdly many empty lines."""
        if not self.strict_order or self.max_sentences is not None:
            return
        self.missing += sid - prev - 1
        if self.missing > MAX_MISSING:
            raise InputError(self.path, lineno, f"sentence id {sid} follows {prev}: the 1-best "
                             f"output would need {self.missing} empty lines for missing ids "
                             f"(more than {MAX_MISSING}); is the id corrupt?  If the set really "
                             "has that many sentences, give --sentences")


# -- driver -----------------------------------------------------------------------------------
@dataclass
class RescoreStats:
    """Summary of a run (also printed to standard error)."""

    hypotheses: int = 0
    sentences: int = 0
    skipped: int = 0
    missing: List[int] = field(default_factory=list)   #: the first missing ids (a few)
    missing_count: int = 0                             #: how many ids were missing
    unweighted: Set[str] = field(default_factory=set)
    format: str = ""
    tokens: int = 0                                  #: hypothesis tokens (without </s>)
    oovs: List[int] = field(default_factory=list)    #: per model: tokens not in its vocabulary

    def oov_rates(self) -> List[float]:
        """Per model: the fraction of hypothesis tokens outside its vocabulary."""
        return [o / self.tokens if self.tokens else 0.0 for o in self.oovs]


#: warn when more than this fraction of the hypothesis tokens is outside a model's vocabulary
OOV_WARN = 0.05
#: ... once this many tokens have been seen (the first chunk), and again at the end
OOV_WARN_MIN_TOKENS = 2000


def oov_warning(model_path: str, oovs: int, tokens: int) -> Optional[str]:
    """The warning for a model that does not know ``oovs`` of ``tokens`` tokens, if too many."""
    if not tokens or oovs / tokens <= OOV_WARN:
        return None
    return (f"{100.0 * oovs / tokens:.1f}% of the hypothesis tokens ({oovs} of {tokens}) are not "
            f"in the vocabulary of {model_path} and are scored as <unk>: its feature says little "
            "about these hypotheses. Was the model trained on text of the same language, "
            "tokenisation and casing as the k-best list?")


def _chunk_results(chunks: Iterator[List[Tuple[int, str]]], cfg: RescoreConfig, jobs: int
                   ) -> Iterator[Tuple[List[Tuple[int, str]], ChunkResult]]:
    """Results in input order: in-process for one job, else a process pool with a bounded
    window of chunks in flight (constant memory)."""
    if jobs <= 1:
        worker = Rescorer(cfg)
        for ch in chunks:
            yield ch, worker.run(ch)
        return
    import concurrent.futures as cf
    import multiprocessing as mp

    wcfg = RescoreConfig(**{**cfg.__dict__, "verify": False})   # verified once in the parent
    # workers use one BLAS thread each: the parallelism is across processes
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    for k, v in saved.items():
        if v is None:
            os.environ[k] = "1"
    try:
        pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"),
                                      initializer=_init_worker, initargs=(wcfg,))
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
    window: Deque[Tuple[List[Tuple[int, str]], Any]] = deque()
    try:
        for ch in chunks:
            window.append((ch, pool.submit(_work, ch)))
            if len(window) >= 2 * jobs:
                first, fut = window.popleft()
                yield first, fut.result()
        while window:
            first, fut = window.popleft()
            yield first, fut.result()
    except BaseException:
        # a worker died, bad input or Ctrl-C: the workers are killed, not waited for (an
        # orderly shutdown of a pool whose worker was killed can wait forever on a queue
        # lock the dead process held), and the error goes on to the command's handler
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            if proc.is_alive():
                proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def rescore(input_path: str, output_path: Optional[str], cfg_models: Sequence[str],
            names: Optional[Sequence[str]] = None, oov_feature: bool = False,
            oov_names: Optional[Sequence[str]] = None, fmt: str = "auto", jobs: int = 1,
            chunk_size: int = 2000, batch_size: int = 8192, weights_path: Optional[str] = None,
            one_best: Optional[str] = None, update_total: bool = False,
            sentences: Optional[int] = None, skip_bad: bool = False, verify: bool = True,
            progress: bool = True, log=None, prog: str = "nlmfeature rescore",
            source: Optional[str] = None) -> RescoreStats:
    """Rescore ``input_path`` into ``output_path`` (either may be ``-``; ``.gz`` compresses;
    ``None`` output writes no k-best list).  See the module docstring; returns statistics.
    Raises :class:`InputError` (file:line) on malformed input, :class:`NLMFeatureError` on
    bad options.  Messages on ``log`` (default: standard error) start with ``prog``."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    lp_names, ov_names = feature_names(len(cfg_models), names, oov_feature, oov_names)
    if sentences is not None and not 0 <= sentences <= MAX_SENTENCES:
        raise NLMFeatureError(f"--sentences must be in 0..{MAX_SENTENCES}, not {sentences}")
    # inputs and outputs are checked before any work (loading models, reading the list)
    check_input(input_path, stream=True)
    for path, what in ((output_path, "output"), (one_best, "--one-best output")):
        if path:
            check_output(path, what, stream=True)     # /dev/null or a pipe is fine
    weights = read_weights(weights_path) if weights_path else None
    if one_best and weights is None:
        raise NLMFeatureError("--one-best needs --weights (the 1-best is chosen by the weighted "
                              "feature sum)")
    if update_total and weights is None:
        raise NLMFeatureError("--update-total needs --weights")
    if weights is not None:
        absent = [n for n in lp_names + ov_names if n not in weights]
        if absent:
            log(f"{prog}: warning: {weights_path} has no weight for the new "
                f"feature(s) {absent}: they do not change the ranking")
    if fmt != "auto" and fmt not in FORMATS:
        raise NLMFeatureError(f"unknown --format {fmt!r}")
    for p in cfg_models:   # fail early, and verify checksums once
        from nlmfeature.core.model import load
        if load(p, verify=verify).header.get("source") and not source:
            raise NLMFeatureError(f"{p} is a joint model: give the source sentences of the "
                                  "k-best list with --source FILE (line i = sentence id i)")
    if source:
        check_input(source)   # fail early on a missing or unreadable file

    stats = RescoreStats()
    chunker = Chunker(input_path, chunk_size, skip_bad, strict_order=one_best is not None,
                      warn=lambda m: log(f"{prog}: warning: {m}"),
                      sentences=sentences)
    chunk_iter = chunker.chunks()
    # the format is decided from the first line before any chunk is processed
    first = next(chunk_iter, None)
    if first is None:
        what = (f"no valid k-best lines ({chunker.skipped} skipped as malformed)"
                if chunker.skipped else "the k-best list is empty")
        raise InputError(input_path, 0, what)
    stats.format = detect_format(first[0][1]) if fmt == "auto" else fmt
    cfg = RescoreConfig(list(cfg_models), lp_names, ov_names, input_path, stats.format,
                        skip_bad, weights, update_total, batch_size, verify=False,
                        compress=bool(output_path and output_path.endswith(".gz")), source=source)

    def all_chunks() -> Iterator[List[Tuple[int, str]]]:
        yield first
        yield from chunk_iter

    bar = None
    if progress:
        from nlmfeature.io.progress import progress as progress_report
        bar = progress_report(unit=" hyp", unit_scale=True, desc="rescoring")
    out = open_output(output_path, binary=True) if output_path else None
    best_out = open_output(one_best) if one_best else None
    next_sid = 0
    checked_oov = False
    warned_oov: Set[int] = set()

    def warn_oov(st: RescoreStats) -> None:
        for k, (path, o) in enumerate(zip(cfg_models, st.oovs)):
            msg = oov_warning(path, o, st.tokens)
            if msg and k not in warned_oov:
                warned_oov.add(k)
                log(f"{prog}: warning: {msg}")

    def pad(upto: int) -> None:     # empty 1-best lines for ids next_sid .. upto-1
        nonlocal next_sid
        n = upto - next_sid
        if n <= 0:
            return
        stats.missing.extend(range(next_sid, min(upto, next_sid + SHOWN_MISSING
                                                 - len(stats.missing))))
        stats.missing_count += n
        while n > 0:
            step = min(n, 1 << 16)
            best_out.write("\n" * step)
            n -= step
        next_sid = upto

    skipped_messages: List[str] = []        # from the workers; the chunker keeps its own
    try:
        for chunk, res in _chunk_results(all_chunks(), cfg, jobs):
            if res.error:
                raise InputError(*res.error)
            if out is not None:
                out.write(res.data)
            if best_out is not None:
                for sid, text in res.best:
                    pad(sid)
                    best_out.write(text + "\n")
                    next_sid = sid + 1
            stats.hypotheses += res.hypotheses
            stats.tokens += res.tokens
            stats.oovs = [a + b for a, b in zip(stats.oovs, res.oovs)] if stats.oovs else list(res.oovs)
            if not checked_oov and stats.tokens >= OOV_WARN_MIN_TOKENS:
                checked_oov = True       # early, so a user can stop a long run
                warn_oov(stats)
            stats.skipped += res.skipped
            stats.unweighted |= res.unweighted
            skipped_messages.extend(res.messages)
            if bar is not None:
                bar.update(len(chunk))
        if best_out is not None and sentences is not None:
            pad(sentences)
        if stats.hypotheses == 0:
            raise InputError(input_path, 0, f"no valid k-best lines ({stats.skipped + chunker.skipped}"
                             " skipped as malformed)")
    except BaseException:
        for f in (out, best_out):
            if f is not None and hasattr(f, "discard"):
                f.discard()          # no partial output files
        raise
    finally:
        if bar is not None:
            bar.close()
        for f in (out, best_out):
            if f is not None:
                f.close()
    stats.sentences = chunker.sentences
    stats.skipped += chunker.skipped
    if stats.skipped:
        for m in (chunker.messages + skipped_messages)[:MAX_REPORTED]:
            log(f"{prog}: skipped {m}")
        log(f"{prog}: skipped {stats.skipped} malformed line(s) of {input_path}")
    if stats.missing_count:
        shown = ", ".join(map(str, stats.missing)) + (" ..." if stats.missing_count >
                                                      len(stats.missing) else "")
        log(f"{prog}: warning: {stats.missing_count} sentence id(s) missing from "
            f"{input_path} ({shown}): empty 1-best line(s) written for them")
    warn_oov(stats)
    stats.unweighted -= set(lp_names + ov_names)     # already reported above
    if stats.unweighted:
        log(f"{prog}: warning: no weight for feature(s) {sorted(stats.unweighted)} "
            f"in {weights_path}; counted as weight 0")
    return stats


def run(args: argparse.Namespace) -> int:
    """Run ``nlmfeature rescore`` on parsed arguments."""
    if args.jobs < 1 or args.chunk_size < 1 or args.batch_size < 1:
        raise NLMFeatureError("--jobs, --chunk-size and --batch-size must be >= 1")
    if not args.model and not args.weights:
        raise NLMFeatureError("nothing to do: give -m MODEL to add features, or --weights "
                              "(with --one-best) to rerank the list")
    output = args.output if args.output is not None else (None if args.one_best else "-")
    st = rescore(args.input, output, args.model, args.name, args.oov_feature, args.oov_name,
                 args.format, args.jobs, args.chunk_size, args.batch_size, args.weights,
                 args.one_best, args.update_total, args.sentences, args.skip_bad,
                 not args.no_verify, progress=not args.quiet, prog=args.prog_name, source=args.source)
    if not args.quiet:
        print(f"{args.prog_name}: {st.hypotheses} hypotheses of {st.sentences} sentences "
              f"({st.format} format)", file=sys.stderr)
    return 0
