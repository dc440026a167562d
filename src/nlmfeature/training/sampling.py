"""Noise distributions for NCE, sampled with the alias method (Walker 1977; Vose 1991).

* :class:`UnigramNoise` -- the unigram distribution of the training words (``nce``);
* :class:`ClassNoise` -- the class unigram distribution and, per class, the unigram
  distribution of the words inside it (class-factored NCE, Baltescu & Blunsom 2015).

Draws come from a counter-based generator keyed by (seed, minibatch number, row, sample), in
Cython and in parallel: the same seed gives the same samples whatever the thread count,
and a run resumed from a checkpoint draws what the uninterrupted run would have drawn.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

from nlmfeature import _train
from nlmfeature.training.estimators import Noise


def unigram(counts: np.ndarray) -> np.ndarray:
    """Normalised unigram distribution (float64) of per-id counts."""
    c = np.asarray(counts, dtype=np.float64)
    if c.sum() <= 0:
        raise ValueError("the unigram distribution has no mass")
    return c / c.sum()


class AliasSampler:
    """Samples from several distributions stored back to back (one block each)."""

    def __init__(self, weights: np.ndarray, starts: np.ndarray, values: np.ndarray) -> None:
        self.starts = np.ascontiguousarray(starts, dtype=np.int64)
        self.values = np.ascontiguousarray(values, dtype=np.int32)
        self.accept, self.alias = _train.alias_blocks(np.ascontiguousarray(weights, dtype=np.float64),
                                                      self.starts)

    def sample(self, blocks: np.ndarray, k: int, seed: int, step: int, threads: int = 1) -> np.ndarray:
        """(N, k) int32 values: row n drawn from block ``blocks[n]``."""
        return _train.sample_blocks(self.accept, self.alias, self.values, self.starts,
                                    np.ascontiguousarray(blocks, dtype=np.int32), int(k),
                                    np.uint64(seed & 0xFFFFFFFFFFFFFFFF), np.uint64(step), threads)


class UnigramNoise:
    """k noise words per example from the unigram distribution q."""

    def __init__(self, counts: np.ndarray, k: int) -> None:
        self.q = unigram(counts)
        self.k = int(k)
        V = len(self.q)
        self.sampler = AliasSampler(self.q, np.array([0, V]), np.arange(V))
        with np.errstate(divide="ignore"):
            self.logq = np.log(self.q)

    def draw(self, targets: np.ndarray, seed: int, step: int, threads: int = 1) -> Noise:
        """Noise for a minibatch of targets."""
        blocks = np.zeros(len(targets), dtype=np.int32)
        return Noise(words=self.sampler.sample(blocks, self.k, seed, 2 * step, threads))

    def kernel_args(self, seed: int, steps: Sequence[int]) -> Tuple[np.ndarray, np.ndarray, np.ndarray, int,
                                                                     np.uint64, np.ndarray]:
        """What a native kernel needs to draw, itself, the noise :meth:`draw` gives minibatches
        number ``steps``: the alias table (accept, alias, values), k, the seed and the
        sampler's step of each minibatch (:func:`nlmfeature._train.nce_lbl_rounds`)."""
        sp = self.sampler
        return (sp.accept, sp.alias, sp.values, self.k, np.uint64(seed & 0xFFFFFFFFFFFFFFFF),
                np.array([2 * s for s in steps], dtype=np.uint64))

    def draw_shared(self, seed: int, step: int) -> Noise:
        """k noise words for a whole minibatch (``words`` of shape (k,)), shared by its n-grams."""
        return Noise(words=self.sampler.sample(np.zeros(1, dtype=np.int32), self.k, seed, 2 * step)[0])


class ClassNoise:
    """Class-factored noise: k classes from the class unigram distribution, and k words
    from the target class's own unigram distribution q(w | c)."""

    def __init__(self, counts: np.ndarray, class_of_word: np.ndarray, class_start: np.ndarray,
                 class_members: np.ndarray, k: int) -> None:
        q = unigram(counts)
        C = len(class_start) - 1
        self.k = int(k)
        self.class_of_word = np.asarray(class_of_word, dtype=np.int32)
        self.qc = np.bincount(self.class_of_word, weights=q, minlength=C)
        members = np.asarray(class_members, dtype=np.int32)
        # words of a class without mass (e.g. only <s>/<null>) are drawn uniformly
        self.class_sampler = AliasSampler(self.qc, np.array([0, C]), np.arange(C))
        self.word_sampler = AliasSampler(q[members], class_start, members)
        qw = q / np.maximum(self.qc[self.class_of_word], 1e-300)
        with np.errstate(divide="ignore"):
            self.logq_class = np.log(self.qc)
            self.logq_word = np.log(qw)

    def draw(self, targets: np.ndarray, seed: int, step: int, threads: int = 1) -> Noise:
        """Noise for a minibatch of targets."""
        n = len(targets)
        classes = self.class_sampler.sample(np.zeros(n, dtype=np.int32), self.k, seed, 2 * step, threads)
        words = self.word_sampler.sample(self.class_of_word[targets], self.k, seed, 2 * step + 1, threads)
        return Noise(words=words, classes=classes)


def empirical(sampler: AliasSampler, block: int, n: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """(values, frequencies) of ``n`` draws from one block (for tests of the sampler)."""
    draws = sampler.sample(np.full(n, block, dtype=np.int32), 1, seed, 0)[:, 0]
    vals, cnt = np.unique(draws, return_counts=True)
    return vals, cnt / n
