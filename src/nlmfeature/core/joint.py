"""Joint models (NNJM, Devlin et al. 2014): target n-gram scores conditioned on a window of
the source sentence around the target word's *affiliated* source position.

A joint model is an ordinary model file with a ``source`` header entry (source vocabulary
and window w = 2m+1; ``docs/model-format.md``).  Its full contexts are
``[w source-window ids | n-1 target ids]``; the native scorer, the precomputed tables and
the caches treat them as longer contexts.

Affiliation (Devlin et al. 2014, section 2.1): a target word aligned to one source word is
affiliated with it; aligned to several, with the middle one (the right one of the two middle
ones when their number is even); unaligned, it inherits the affiliation of the nearest
aligned target word, the right one first on ties.  The target ``</s>`` is affiliated with
the source ``</s>`` (position ``len(source)``).  Windows reach past the sentence with
``<s>`` on the left and ``</s>`` on the right, as Moses' ``BilingualLM`` does.

Alignments are Moses / fast_align ``i-j`` pairs: source position i, target position j,
from 0 (Moses ``-print-alignment-info`` n-best fields and ``-alignment-output-file`` lines
have the same form).

>>> import nlmfeature
>>> jm = nlmfeature.load("joint.nlm")                                # doctest: +SKIP
>>> jm.score_sentence("ein hund läuft", "a dog runs", "0-0 1-1 2-2")  # doctest: +SKIP
"""
from __future__ import annotations

import math
from typing import Iterable, List, Sequence, Tuple, Union

import numpy as np

from ..io import textio
from ..io.textio import split_tokens
from ..errors import InputError
from .model import MODEL_KINDS, Model, Perplexity, _tokens
from .ngramdata import NgramData
from .vocab import Vocabulary

import re

_POINT = re.compile(r"^\d+-\d+$")
Tokens = Union[str, Sequence[str]]
Alignment = Union[str, Sequence[Tuple[int, int]]]


def parse_alignment(text: str, n_src: int, n_tgt: int, where: str = "alignment",
                    lineno: int = 0) -> List[Tuple[int, int]]:
    """``i-j`` pairs of one line, checked against the sentence lengths.

    Raises :class:`InputError` naming ``where`` (file) and ``lineno`` for a malformed pair
    or a position outside the sentences."""
    pairs = []
    for tok in text.split():
        a, sep, b = tok.partition("-")
        if not sep or not a.isdigit() or not b.isdigit():
            raise InputError(where, lineno, f"alignment point {tok!r} is not of the form i-j "
                             "(source position - target position, from 0)")
        i, j = int(a), int(b)
        if i >= n_src or j >= n_tgt:
            raise InputError(where, lineno, f"alignment point {tok!r} lies outside the sentence pair "
                             f"({n_src} source and {n_tgt} target words): are the files in the "
                             "same order, and is the alignment source-target (i-j)?")
        pairs.append((i, j))
    return pairs


def affiliations(n_src: int, n_tgt: int, pairs: Iterable[Tuple[int, int]]) -> np.ndarray:
    """Affiliated source position of each target word and of ``</s>``: int32 (n_tgt + 1,).

    Devlin et al. 2014's heuristic (see the module docstring).  A sentence pair with no
    alignment point at all gets the proportional position ``j * n_src // n_tgt``.
    """
    linked: List[List[int]] = [[] for _ in range(n_tgt)]
    for i, j in pairs:
        linked[j].append(i)
    own = np.full(n_tgt, -1, dtype=np.int64)
    for j, srcs in enumerate(linked):
        if srcs:
            srcs.sort()
            own[j] = srcs[len(srcs) // 2]
    out = np.empty(n_tgt + 1, dtype=np.int32)
    out[n_tgt] = n_src
    aligned = np.flatnonzero(own >= 0)
    if len(aligned) == 0:
        for j in range(n_tgt):
            out[j] = min(n_src - 1, j * n_src // max(1, n_tgt)) if n_src else 0
        return out
    for j in range(n_tgt):
        if own[j] >= 0:
            out[j] = own[j]
            continue
        k = int(np.searchsorted(aligned, j))  # nearest aligned neighbour, the right one on ties
        right = aligned[k] if k < len(aligned) else None
        left = aligned[k - 1] if k > 0 else None
        if right is not None and (left is None or right - j <= j - left):
            out[j] = own[right]
        else:
            out[j] = own[left]
    return out


def source_windows(src_ids: np.ndarray, affil: np.ndarray, window: int, bos: int, eos: int) -> np.ndarray:
    """(len(affil), window) source ids around each affiliation (``<s>`` / ``</s>`` beyond
    the sentence; position ``len(src_ids)`` is ``</s>``).  The native ``nlm_source_window``
    computes the same for decoders."""
    half = window // 2
    padded = np.concatenate([np.full(half, bos, np.int32), np.asarray(src_ids, np.int32),
                             np.full(half + 1, eos, np.int32)])
    idx = np.asarray(affil, dtype=np.int64)[:, None] + np.arange(window)[None, :]
    return padded[idx]


def target_contexts(tgt_ids: np.ndarray, order: int, bos: int) -> np.ndarray:
    """(len(tgt_ids), order-1) ``<s>``-padded target contexts of each word (the LM's)."""
    c = order - 1
    hist = np.concatenate([np.full(c, bos, np.int32), np.asarray(tgt_ids, np.int32)])
    if c == 0:
        return np.empty((len(tgt_ids), 0), dtype=np.int32)
    return np.lib.stride_tricks.sliding_window_view(hist, c)[: len(tgt_ids)]


class JointData(NgramData):
    """The joint n-grams of a parallel text: ``contexts`` (N, w + n-1) int32 as the model
    sees them ([source window | target context]), ``words`` (N,), ``sentence_starts`` (S+1,)."""


def joint_ngrams(sources: Sequence[Sequence[str]], targets: Sequence[Sequence[str]],
                 affils: Sequence[np.ndarray], tvocab: Vocabulary, svocab: Vocabulary,
                 order: int, window: int) -> JointData:
    """Every target word and ``</s>`` of each sentence pair with its full context."""
    ctxs, words, starts = [], [], [0]
    for src, tgt, aff in zip(sources, targets, affils):
        t = np.append(tvocab.text_ids(tgt), np.int32(tvocab.eos)).astype(np.int32)
        s = svocab.text_ids(src)
        win = source_windows(s, aff, window, svocab.bos, svocab.eos)
        ctxs.append(np.hstack([win, target_contexts(t, order, tvocab.bos)]))
        words.append(t)
        starts.append(starts[-1] + len(t))
    if not words:
        return JointData(np.empty((0, window + order - 1), np.int32), np.empty(0, np.int32),
                         np.zeros(1, np.int64))
    return JointData(np.ascontiguousarray(np.concatenate(ctxs), dtype=np.int32),
                     np.concatenate(words).astype(np.int32), np.asarray(starts, dtype=np.int64))


def read_parallel(source: str, target: str, alignment: str, keep_empty: bool = False,
                  target_to_source: bool = False,
                  ) -> Tuple[List[List[str]], List[List[str]], List[np.ndarray]]:
    """(source sentences, target sentences, affiliations) of a tokenised parallel text and
    its ``i-j`` alignment, line by line (plain or .gz).  Pairs with an empty side are
    skipped unless ``keep_empty`` (test sets: every line is a sentence).  With
    ``target_to_source`` the roles swap (a target-to-source model's data): the first list
    holds the target sentences, the second the source sentences, and each source word gets
    its affiliated target position (the alignment read as ``j-i``).  Raises :class:`InputError` naming the file and line when the files have
    different numbers of lines or an alignment point is malformed or out of range."""
    srcs, tgts, affs = [], [], []
    it_s, it_t, it_a = textio.iter_lines(source), textio.iter_lines(target), textio.iter_lines(alignment)
    lineno = 0
    while True:
        a, b, c = next(it_s, None), next(it_t, None), next(it_a, None)
        if a is None and b is None and c is None:
            break
        lineno += 1
        if a is None or b is None or c is None:
            short = [p for p, x in ((source, a), (target, b), (alignment, c)) if x is None]
            raise InputError(short[0], lineno, "ends here, but the other files of the parallel "
                             f"text go on: {source}, {target} and {alignment} must have one line "
                             "per sentence pair")
        s, t = split_tokens(a[1]), split_tokens(b[1])
        for path, toks in ((source, s), (target, t)):
            for tok in toks:
                if tok in ("<s>", "</s>", "<null>"):
                    raise InputError(path, lineno, f"contains the reserved token {tok!r}; sentence "
                                     "boundaries are added by nlmfeature, remove them from the text")
        pairs = parse_alignment(c[1], len(s), len(t), alignment, lineno)
        if target_to_source:
            s, t, pairs = t, s, [(j, i) for i, j in pairs]
        if (not s or not t) and not keep_empty:
            continue
        srcs.append(s)
        tgts.append(t)
        affs.append(affiliations(len(s), len(t), pairs))
    if not tgts:
        raise InputError(source if target_to_source else target, 0,
                         "the parallel text has no sentence pair with words on both sides")
    return srcs, tgts, affs


class JointModel(Model):
    """A loaded joint model: scores target words given the target history and the source
    sentence.  Sentences come as strings or token lists, alignments as ``"i-j ..."``
    strings or (i, j) pairs."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        a = self.arrays
        self.source_vocab = Vocabulary.from_arrays(a["source.vocab.offsets"], a["source.vocab.bytes"], lazy=True)
        self.window = int(self.header["source"]["window"])

    def describe(self):
        d = super().describe()
        d["source"] = {"window": self.window, "vocab_size": len(self.source_vocab),
                       "target_to_source": self.target_to_source}
        return d

    def source_ids(self, words: Iterable[str]) -> np.ndarray:
        """Source-vocabulary ids (int32); unknown words map to the source ``<unk>``."""
        return self.source_vocab.ids(words)

    def sentence_ngrams(self, source: Tokens, target: Tokens = None, alignment: Alignment = "",
                        ) -> Tuple[np.ndarray, np.ndarray]:  # type: ignore[override]
        """(contexts (N, w + n-1), words (N,)) of a sentence pair: each target word and
        ``</s>`` with its source window and ``<s>``-padded target history."""
        src, tgt = _tokens(source), _tokens(target if target is not None else "")
        if isinstance(alignment, str):
            pairs = parse_alignment(alignment, len(src), len(tgt))
        else:
            pairs = [(int(i), int(j)) for i, j in alignment]
            if any(not (0 <= i < len(src) and 0 <= j < len(tgt)) for i, j in pairs):
                raise ValueError("alignment points outside the sentence pair")
        aff = affiliations(len(src), len(tgt), pairs)
        d = joint_ngrams([src], [tgt], [aff], self.vocab, self.source_vocab, self.order, self.window)
        return d.contexts, d.words

    def score_sentence(self, source: Tokens, target: Tokens, alignment: Alignment,
                       ) -> np.ndarray:  # type: ignore[override]
        """Per-token natural-log scores of the target words and ``</s>``."""
        ctx, words = self.sentence_ngrams(source, target, alignment)
        s = self._default_session()
        s.begin_sentence()
        return s.score_padded(ctx, words)

    def score_affiliated(self, source: Tokens, target: Tokens, affiliation: Sequence[int]) -> np.ndarray:
        """Per-token scores with explicit affiliations (one per target word, then ``</s>``'s),
        e.g. a decoder's, which come from its phrases' alignments."""
        src, tgt = _tokens(source), _tokens(target)
        aff = np.asarray(affiliation, dtype=np.int32)
        if aff.shape != (len(tgt) + 1,):
            raise ValueError(f"need {len(tgt) + 1} affiliations (the target words and </s>)")
        d = joint_ngrams([src], [tgt], [aff], self.vocab, self.source_vocab, self.order, self.window)
        s = self._default_session()
        s.begin_sentence()
        return s.score_padded(d.contexts, d.words)

    def _target_only(self, *args, **kwargs):
        raise TypeError(f"{self.path} is a joint model: it scores a target sentence given its "
                        "source and alignment (sentence_logprob(source, target, alignment), "
                        "score_sentence(source, target, alignment))")

    #: KenLM's sentence-level names take one sentence: not a joint model's input
    score = full_scores = logprob = _target_only  # type: ignore[assignment]

    def sentence_logprob(self, source: Tokens, target: Tokens = None,
                         alignment: Alignment = "") -> float:  # type: ignore[override]
        return float(self.score_sentence(source, target, alignment).sum())

    def score_sentences(self, triples: Iterable[Tuple[Tokens, Tokens, Alignment]],
                        batch_size: int = 8192) -> List[float]:  # type: ignore[override]
        """Natural-log probabilities of many (source, target, alignment) triples, batched."""
        out: List[float] = []
        pend_c, pend_w, lengths = [], [], []

        def flush() -> None:
            if not lengths:
                return
            sc = self.score_batch(np.concatenate(pend_c), np.concatenate(pend_w))
            b = np.cumsum([0] + lengths)
            out.extend(float(sc[x:y].sum()) for x, y in zip(b[:-1], b[1:]))
            pend_c.clear(); pend_w.clear(); lengths.clear()

        n = 0
        for src, tgt, al in triples:
            c, w = self.sentence_ngrams(src, tgt, al)
            pend_c.append(c); pend_w.append(w); lengths.append(len(w))
            n += len(w)
            if n >= batch_size:
                flush()
                n = 0
        flush()
        return out

    def perplexity(self, triples: Iterable[Tuple[Tokens, Tokens, Alignment]],
                   exclude_oov: bool = False, batch_size: int = 8192) -> Perplexity:  # type: ignore[override]
        """Perplexity over (source, target, alignment) triples, counting each target word
        and one ``</s>`` per sentence (unknown target words scored as ``<unk>`` unless
        ``exclude_oov``), comparable with :meth:`Model.perplexity` of a target-only model."""
        total, n_tok, n_sent, n_oov = 0.0, 0, 0, 0
        for src, tgt, al in triples:
            toks = _tokens(tgt)
            c, w = self.sentence_ngrams(src, toks, al)
            oov = np.zeros(len(w), dtype=bool)
            oov[:-1] = [self.vocab.is_oov(t) for t in toks]
            n_oov += int(oov.sum())
            if exclude_oov:
                c, w = c[~oov], w[~oov]
            total += float(self.score_batch(c, w).sum()) if len(w) else 0.0
            n_tok += len(w)
            n_sent += 1
        ppl = math.exp(-total / n_tok) if n_tok else float("nan")
        return Perplexity(ppl, total, n_tok, n_sent, n_oov, exclude_oov)


def alignment_field(extra: Sequence[str], path: str, lineno: int) -> str:
    """The word-alignment field among a k-best line's extra fields: Moses'
    ``-print-alignment-info-in-n-best`` field of ``i-j`` points (the last field made only of
    such points; segmentation fields ``0-1=0-1`` are not).  Raises :class:`InputError` when
    there is none."""
    for f in reversed(extra):
        toks = f.split()
        if all(_POINT.match(t) for t in toks):
            return f
    raise InputError(path, lineno, "a joint model needs each hypothesis' word alignment: decode "
                     "with Moses -print-alignment-info-in-n-best (a field of i-j points after "
                     "the total score); this line has none")


def joint_sentence_logprobs(model: "JointModel", sources: Sequence[Sequence[str]],
                            targets: Sequence[Sequence[str]],
                            alignments: Sequence[Sequence[Tuple[int, int]]],
                            batch_size: int = 8192) -> List[float]:
    """Natural-log probabilities of many (source, target, alignment) triples, through the
    matrix path (:meth:`Model.score_batch`); equal to :meth:`JointModel.sentence_logprob`."""
    if not targets:
        return []
    affs = [affiliations(len(s), len(t), a) for s, t, a in zip(sources, targets, alignments)]
    d = joint_ngrams(sources, targets, affs, model.vocab, model.source_vocab, model.order, model.window)
    scores = np.empty(len(d.words), dtype=np.float64)
    for a in range(0, len(d.words), batch_size):
        scores[a:a + batch_size] = model.score_batch(d.contexts[a:a + batch_size], d.words[a:a + batch_size])
    return [float(x) for x in np.add.reduceat(scores, d.sentence_starts[:-1])]


def joint_token_scores(model: "JointModel", sources: Sequence[Sequence[str]],
                       targets: Sequence[Sequence[str]], affils: Sequence[np.ndarray]):
    """Per-token scores of a joint model on a parallel test set, as
    :func:`nlmfeature.kenlm_baseline.nlm_token_scores` gives them for a target-only model
    (every target word and one ``</s>`` per sentence; same OOV flags)."""
    from ..training.kenlm_baseline import TokenScores, oov_mask

    d = joint_ngrams(sources, targets, affils, model.vocab, model.source_vocab, model.order, model.window)
    out = np.empty(len(d.words), dtype=np.float64)
    for a in range(0, len(d.words), 8192):
        out[a:a + 8192] = model.score_batch(d.contexts[a:a + 8192], d.words[a:a + 8192])
    return TokenScores(out, oov_mask(targets, model.vocab), len(targets))


#: load() returns a JointModel for a file whose header has a source vocabulary
MODEL_KINDS.append((lambda header: bool(header.get("source")), JointModel))

__all__ = ["joint_token_scores", "joint_sentence_logprobs", "alignment_field", "JointModel", "JointData", "affiliations", "parse_alignment", "source_windows",
           "target_contexts", "joint_ngrams", "read_parallel"]
