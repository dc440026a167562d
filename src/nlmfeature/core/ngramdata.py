"""The n-grams of a text held in memory, and the minibatches an epoch serves from them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class NgramData:
    """The n-grams of a text: ``contexts`` (N, n-1) int32 padded ids, ``words`` (N,) int32,
    ``sentence_starts`` (S+1,) offsets of each sentence's first n-gram."""

    contexts: np.ndarray
    words: np.ndarray
    sentence_starts: np.ndarray

    def __len__(self) -> int:
        return len(self.words)

    def batches_per_epoch(self, batch: int) -> int:
        """Minibatches of ``batch`` n-grams in an epoch (the last may be shorter)."""
        return max(1, -(-len(self.words) // batch))

    def batches(self, epoch: int, seed: int, batch: int, start: int = 0):
        """(contexts, words) of every minibatch of an epoch from number ``start`` on, in the
        order of ``numpy.random.default_rng([seed, epoch]).permutation``."""
        perm = np.random.default_rng([seed, epoch]).permutation(len(self.words))
        for k in range(start, self.batches_per_epoch(batch)):
            idx = perm[k * batch:(k + 1) * batch]
            yield self.contexts[idx], self.words[idx]

    def chunks(self, size: int = 1 << 22):
        """(contexts, words) in text order, ``size`` n-grams at a time."""
        for a in range(0, len(self.words), size):
            yield self.contexts[a:a + size], self.words[a:a + size]
