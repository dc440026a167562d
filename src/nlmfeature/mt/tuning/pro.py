"""Pairwise ranking optimisation (PRO; Hopkins & May 2011) over a k-best pool, as Moses' ``pro``.

Per sentence, ``candidates`` (5000) random pairs of its hypotheses are drawn; pairs whose
smoothed sentence BLEU (add-one, :func:`nlmfeature.mt.bleu.smoothed_sentence_bleu`) differs by
less than ``min_diff`` (0.05) are dropped and the ``samples`` (50) pairs with the largest
differences kept.  Each kept pair gives the feature difference ``f_better - f_worse`` as a
positive example and its negation as a negative one; a binary logistic regression without
bias (Moses runs MegaM ``-fvals -maxi 30 -nobias binary``) is fitted by Newton's method with
an L2 prior of precision ``l2`` (MegaM's default lambda is 1).  Its weights, L1-normalised,
are the result.  Unlike MERT and MIRA, PRO never looks at the initial weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from nlmfeature.mt.bleu import smoothed_sentence_bleu
from nlmfeature.mt.tuning.data import PoolArrays
from nlmfeature.mt.tuning.mert import LineSearcher, l1_normalise


@dataclass
class ProOptions:
    """Settings of :func:`optimise` (defaults as Moses' ``pro``)."""

    candidates: int = 5000     #: random pairs drawn per sentence (Gamma)
    samples: int = 50          #: pairs kept per sentence (Xi)
    min_diff: float = 0.05     #: minimum sentence-BLEU difference of a kept pair
    l2: float = 1.0            #: precision of the Gaussian prior on the weights
    iterations: int = 30       #: maximum Newton iterations
    seed: int = 0              #: seeds the pair sampling
    smooth_bp: bool = False    #: smooth the brevity penalty too (Nakov et al. 2012)


@dataclass
class ProResult:
    """Weights (L1-normalised), their BLEU and how many pairs were trained on."""

    weights: np.ndarray
    bleu: float
    initial_bleu: float
    pairs: int


def sample_pairs(arrays: PoolArrays, options: ProOptions, rng: np.random.Generator):
    """(better rows, worse rows) of the kept pairs, sentence by sentence."""
    sbleu = smoothed_sentence_bleu(arrays.stats, 1.0, options.smooth_bp)
    offsets = arrays.offsets
    sizes = np.diff(offsets)
    better_parts, worse_parts = [], []
    chunk = max(1, 200_000 // max(options.candidates, 1))
    for lo in range(0, len(sizes), chunk):
        sent = np.repeat(np.arange(lo, min(lo + chunk, len(sizes))), options.candidates)
        r1 = offsets[sent] + (rng.random(len(sent)) * sizes[sent]).astype(np.int64)
        r2 = offsets[sent] + (rng.random(len(sent)) * sizes[sent]).astype(np.int64)
        diff = sbleu[r1] - sbleu[r2]
        keep = np.abs(diff) >= options.min_diff
        sent, r1, r2, diff = sent[keep], r1[keep], r2[keep], diff[keep]
        better = np.where(diff > 0, r1, r2)
        worse = np.where(diff > 0, r2, r1)
        # the `samples` largest differences of each sentence (ties: earlier draws first)
        order = np.lexsort((np.arange(len(diff)), -np.abs(diff), sent))
        sent_sorted = sent[order]
        starts = np.searchsorted(sent_sorted, sent_sorted, side="left")
        rank = np.arange(len(order)) - starts
        chosen = order[rank < options.samples]
        chosen.sort()
        better_parts.append(better[chosen])
        worse_parts.append(worse[chosen])
    if not better_parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(better_parts), np.concatenate(worse_parts)


def fit_logistic(X: np.ndarray, l2: float, iterations: int) -> np.ndarray:
    """Weights minimising ``sum log(1 + exp(-X w)) * 2 + l2/2 |w|^2`` (Newton's method).

    The factor 2 stands for the mirrored negative examples, which give the same loss.
    """
    D = X.shape[1]
    w = np.zeros(D)
    for _ in range(iterations):
        z = X @ w
        p = 0.5 * (1.0 + np.tanh(0.5 * z))          # sigmoid, overflow-free
        grad = -2.0 * X.T @ (1.0 - p) + l2 * w
        hess = 2.0 * (X * (p * (1.0 - p))[:, None]).T @ X + l2 * np.eye(D)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-10 * max(1.0, np.max(np.abs(w))):
            break
    return w


def optimise(arrays: PoolArrays, initial: Optional[np.ndarray], options: ProOptions,
             progress: bool = False, log: Optional[Callable[[str], None]] = None) -> ProResult:
    """Run PRO; ``initial`` only serves to report the starting BLEU."""
    searcher = LineSearcher(arrays)
    rng = np.random.default_rng(options.seed)
    better, worse = sample_pairs(arrays, options, rng)
    X = searcher.F[better] - searcher.F[worse]
    X[np.abs(X) <= 1e-5] = 0.0
    if log is not None:
        log(f"{len(better)} training pairs from {arrays.num_sentences} sentences")
    if len(better) == 0:
        w = np.array(initial if initial is not None else np.zeros(searcher.dim), dtype=np.float64)
    else:
        w = fit_logistic(X, options.l2, options.iterations)
    w = l1_normalise(w)
    initial_bleu = searcher.bleu(initial) if initial is not None else float("nan")
    return ProResult(weights=w, bleu=searcher.bleu(w), initial_bleu=initial_bleu,
                     pairs=int(len(better)))
