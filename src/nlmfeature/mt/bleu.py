"""BLEU sufficient statistics, computed exactly as sacrebleu's ``BLEU`` computes them.

Per hypothesis the statistics are the integer vector (:data:`NUM_STATS` = 10 columns)::

    [hyp_len, ref_len, correct_1, correct_2, correct_3, correct_4, total_1, total_2, total_3, total_4]

the layout of sacrebleu's ``BLEU._compute_segment_statistics``: ``correct_n`` counts the
hypothesis n-grams clipped by the maximum count over the references, ``total_n`` all hypothesis
n-grams, and ``ref_len`` is the *closest* reference length (ties go to the shorter reference).
Statistics are additive, so corpus BLEU is :func:`corpus_bleu` of their column sums and equals
``sacrebleu.corpus_bleu(hyps, refs, tokenize=...)`` on the same outputs.

Tokenisation is an explicit choice (:class:`References` ``tokenize=``): ``'none'`` (the default;
the text is split on white space as it is, right for the pre-tokenised text in Moses and cdec
k-best lists) or any sacrebleu tokeniser name such as ``'13a'`` or ``'intl'``; ``lowercase=True``
lowercases hypotheses and references first (case-sensitive by default, like Moses' scorer).

Tuning needs two more sentence-level scores, both from the same statistics:

- :func:`background_bleu`: kbmira's sentence BLEU against a decayed background pseudo-document
  (Chiang et al. 2008; Cherry & Foster 2012), scaled by the background reference length;
- :func:`smoothed_sentence_bleu`: PRO's add-one smoothed sentence BLEU (Lin & Och 2004).
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Sequence

import numpy as np

from nlmfeature.errors import InputError
from nlmfeature.io.textio import read_lines

#: the BLEU tokeniser of tuning and evaluation unless told otherwise: ``none``, since the
#: decoders' k-best lists and 1-best outputs are tokenised text (sacrebleu's ``13a`` would
#: split Moses' escaped ``&apos;`` into three tokens); ``nlmfeature eval --tokenize 13a`` is
#: for detokenised text
DEFAULT_TOKENIZE = "none"

#: Maximum n-gram order.
ORDER = 4
#: Length of a statistics vector.
NUM_STATS = 2 + 2 * ORDER
#: Column indices.
HYP_LEN, REF_LEN = 0, 1
CORRECT = slice(2, 2 + ORDER)
TOTAL = slice(2 + ORDER, 2 + 2 * ORDER)

#: Tokenisers accepted by :class:`References` (sacrebleu's names).
TOKENIZERS = ("none", "13a", "intl", "char", "zh", "ja-mecab", "ko-mecab", "spm", "flores101",
              "flores200")


def _ngrams(tokens: Sequence[str]) -> Counter:
    """All 1..4-grams of ``tokens`` as tuples, with counts (sacrebleu's extraction)."""
    grams = []
    n_tok = len(tokens)
    for n in range(1, ORDER + 1):
        for i in range(n_tok - n + 1):
            grams.append(tuple(tokens[i:i + n]))
    return Counter(grams)


def _closest(hyp_len: int, ref_lens: Sequence[int]) -> int:
    """Closest reference length to ``hyp_len``; ties go to the shorter one (as sacrebleu)."""
    best_diff, best_len = -1, -1
    for rl in ref_lens:
        diff = abs(hyp_len - rl)
        if best_diff == -1 or diff < best_diff:
            best_diff, best_len = diff, rl
        elif diff == best_diff and rl < best_len:
            best_len = rl
    return best_len


class References:
    """Reference n-gram counts and lengths per sentence, for computing hypothesis statistics.

    ``streams`` is a sequence of reference streams (one per reference set), each with one
    string per sentence, as ``sacrebleu.corpus_bleu``'s second argument; a ``None`` entry marks
    a missing reference for that sentence.
    """

    def __init__(self, streams: Sequence[Sequence[Optional[str]]], tokenize: str = DEFAULT_TOKENIZE,
                 lowercase: bool = False) -> None:
        if tokenize not in TOKENIZERS:
            raise ValueError(f"unknown tokeniser {tokenize!r}; choose one of {', '.join(TOKENIZERS)}")
        if not streams:
            raise ValueError("no reference streams given")
        lengths = {len(s) for s in streams}
        if len(lengths) != 1:
            raise ValueError(f"reference streams differ in length: {sorted(lengths)}")
        self.tokenize = tokenize
        self.lowercase = lowercase
        self._tok = None
        if tokenize != "none":
            from sacrebleu.metrics.bleu import BLEU

            self._tok = BLEU(tokenize=tokenize).tokenizer
        self._counts: List[Dict[tuple, int]] = []
        self._lens: List[List[int]] = []
        for refs in zip(*streams):
            merged: Dict[tuple, int] = {}
            lens: List[int] = []
            for ref in refs:
                if ref is None:
                    continue
                tokens = self.preprocess(ref).split()
                lens.append(len(tokens))
                for gram, count in _ngrams(tokens).items():
                    if count > merged.get(gram, 0):
                        merged[gram] = count
            self._counts.append(merged)
            self._lens.append(lens)

    @classmethod
    def from_files(cls, paths: Sequence[str], tokenize: str = DEFAULT_TOKENIZE,
                   lowercase: bool = False) -> "References":
        """Read one reference file per reference set (UTF-8, one sentence per line, .gz ok).

        Raises :class:`InputError` naming the file when the files differ in line count.
        """
        streams = [read_lines(p) for p in paths]
        for p, s in zip(paths[1:], streams[1:]):
            if len(s) != len(streams[0]):
                raise InputError(p, len(s), f"has {len(s)} lines but {paths[0]} has "
                                 f"{len(streams[0])}; every reference file needs one line per "
                                 "sentence")
        return cls(streams, tokenize=tokenize, lowercase=lowercase)

    def __len__(self) -> int:
        return len(self._counts)

    def preprocess(self, text: str) -> str:
        """Lowercase (if asked) and tokenise ``text`` as sacrebleu does."""
        if self.lowercase:
            text = text.lower()
        text = text.rstrip()
        return self._tok(text) if self._tok is not None else text

    def stats(self, sid: int, hyp: str) -> np.ndarray:
        """Statistics vector (int64, :data:`NUM_STATS`) of hypothesis ``hyp`` for sentence ``sid``."""
        return self.stats_many(sid, [hyp])[0]

    def stats_many(self, sid: int, hyps: Sequence[str]) -> np.ndarray:
        """Statistics of several hypotheses of sentence ``sid``: int64 array (len(hyps), 10)."""
        if not 0 <= sid < len(self._counts):
            raise IndexError(f"sentence id {sid} outside the {len(self._counts)} references")
        ref_counts = self._counts[sid]
        ref_keys = ref_counts
        ref_lens = self._lens[sid]
        rows: List[List[int]] = []
        cache: Dict[str, List[int]] = {}
        for hyp in hyps:
            row = cache.get(hyp)
            if row is None:
                tokens = self.preprocess(hyp).split()
                n_tok = len(tokens)
                correct = [0] * ORDER
                totals = [0] * ORDER
                # count only the n-grams the references contain, then clip by their counts
                seen: Dict[tuple, int] = {}
                for n in range(1, min(ORDER, n_tok) + 1):
                    totals[n - 1] = n_tok - n + 1
                    for i in range(n_tok - n + 1):
                        gram = tuple(tokens[i:i + n])
                        if gram in ref_keys:
                            seen[gram] = seen.get(gram, 0) + 1
                for gram, c in seen.items():
                    rc = ref_counts[gram]
                    correct[len(gram) - 1] += c if c < rc else rc
                row = [n_tok, _closest(n_tok, ref_lens) if ref_lens else 0] + correct + totals
                cache[hyp] = row
            rows.append(row)
        return np.array(rows, dtype=np.int64).reshape(len(rows), NUM_STATS)

    def corpus_stats(self, hyps: Sequence[str]) -> np.ndarray:
        """Statistics of one hypothesis per sentence (``len(hyps) == len(self)``): (n, 10)."""
        if len(hyps) != len(self):
            raise ValueError(f"{len(hyps)} hypotheses for {len(self)} references")
        out = np.zeros((len(hyps), NUM_STATS), dtype=np.int64)
        for sid, hyp in enumerate(hyps):
            out[sid] = self.stats_many(sid, [hyp])[0]
        return out


def corpus_bleu(stats: np.ndarray, smooth: str = "exp", max_order: int = ORDER) -> np.ndarray:
    """BLEU (0..100) from summed sufficient statistics: the package's one BLEU formula
    (statistics first, score second, as sacrebleu's ``BLEU``), used by tuning, evaluation
    and bootstrap resampling alike; vectorised over any leading dimensions.

    ``stats`` has shape (..., 2 + 2 * max_order): ``[hyp_len, ref_len, correct_1..n,
    total_1..n]`` (sacrebleu's layout, :data:`NUM_STATS` columns for the default order 4);
    the result has shape (...) (a numpy float for one vector).  ``smooth`` is sacrebleu's
    ``smooth_method``: ``'exp'`` (its default, so this equals ``sacrebleu.corpus_bleu`` and
    ``BLEU.compute_bleu``) or ``'none'``.  As in sacrebleu (no effective order), a score is 0
    when nothing matches, when the hypothesis is empty or when an order has no n-grams.
    """
    s = np.asarray(stats, dtype=np.float64)
    if s.shape[-1] != 2 + 2 * max_order:
        raise ValueError(f"statistics of order {max_order} need {2 + 2 * max_order} columns, "
                         f"got shape {s.shape}")
    hyp = s[..., HYP_LEN]
    ref = s[..., REF_LEN]
    c = s[..., 2:2 + max_order]
    t = s[..., 2 + max_order:2 + 2 * max_order]
    dead = (t <= 0).any(axis=-1) | (c <= 0).all(axis=-1)
    t_safe = np.where(t > 0, t, 1.0)
    if smooth == "exp":
        zero = c <= 0
        k = np.cumsum(zero, axis=-1)
        prec = np.where(zero, 1.0 / (np.exp2(k) * t_safe), c / t_safe)
    elif smooth == "none":
        prec = c / t_safe
        dead = dead | (c <= 0).any(axis=-1)
    else:
        raise ValueError(f"unknown smoothing {smooth!r} (use 'exp' or 'none')")
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(np.where(prec > 0, prec * 100.0, 1.0)).sum(axis=-1) / max_order
        hyp_safe = np.where(hyp > 0, hyp, 1.0)
        bp = np.where(hyp < ref, np.where(hyp > 0, np.exp(1.0 - ref / hyp_safe), 0.0), 1.0)
    score = bp * np.exp(logp)
    return np.where(dead, 0.0, score)


def bleu_summary(stats: np.ndarray) -> str:
    """One-line sacrebleu-style description of summed statistics (score, precisions, BP, lengths)."""
    s = np.asarray(stats, dtype=np.int64)
    from sacrebleu.metrics.bleu import BLEU

    res = BLEU.compute_bleu(correct=[int(x) for x in s[CORRECT]], total=[int(x) for x in s[TOTAL]],
                            sys_len=int(s[HYP_LEN]), ref_len=int(s[REF_LEN]), smooth_method="exp")
    return f"BLEU = {res.score:.2f} {res._verbose}"


def background_bleu(stats: np.ndarray, background: np.ndarray) -> np.ndarray:
    """kbmira's sentence BLEU of each row of ``stats`` (k, 10) against ``background`` (10,).

    The statistics are added to the background pseudo-document; the result is the unsmoothed
    BLEU (0..1) of the sum times the summed reference length, as Moses' ``BleuScorer``
    ``calculateSentenceLevelBackgroundScore`` (brevity from ``total_1``).
    """
    s = np.asarray(stats, dtype=np.float64) + np.asarray(background, dtype=np.float64)
    with np.errstate(divide="ignore"):
        logbleu = (np.log(s[..., CORRECT]) - np.log(s[..., TOTAL])).sum(axis=-1) / ORDER
    t1 = s[..., TOTAL.start]
    brevity = 1.0 - s[..., REF_LEN] / t1
    logbleu = logbleu + np.minimum(brevity, 0.0)
    return np.exp(logbleu) * s[..., REF_LEN]


def smoothed_sentence_bleu(stats: np.ndarray, smoothing: float = 1.0,
                           smooth_bp: bool = False) -> np.ndarray:
    """PRO's smoothed sentence BLEU (0..1) of each row of ``stats`` (Moses ``smoothedSentenceBleu``).

    Adds ``smoothing`` to every correct and total count (all orders, as Moses does); with
    ``smooth_bp`` also to the reference length in the brevity penalty (Nakov et al. 2012).
    """
    s = np.asarray(stats, dtype=np.float64)
    logbleu = (np.log(s[..., CORRECT] + smoothing) - np.log(s[..., TOTAL] + smoothing)).sum(axis=-1) / ORDER
    reflen = s[..., REF_LEN] + (smoothing if smooth_bp else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        brevity = 1.0 - reflen / s[..., TOTAL.start]
    brevity = np.where(np.isfinite(brevity), brevity, -np.inf)
    return np.exp(logbleu + np.minimum(brevity, 0.0))
