"""Batched scoring: many n-grams at once through matrix products (numpy / BLAS).

The one-lookup-at-a-time native scorer is what decoders call; this path is for whole
k-best lists and perplexity, where N contexts are known up front and the dense layers
become N x H matrix products.  Its scores equal the native scorer's to float rounding.
The maths is :mod:`nlmfeature.core.forward` (the one numpy forward pass); this module chunks the
work and computes each distinct context once.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict

import numpy as np

from nlmfeature.core import forward

if TYPE_CHECKING:  # pragma: no cover
    from nlmfeature.core.model import Model

CHUNK = 16384


def unique_rows(x: np.ndarray):
    """(distinct rows, inverse index) of a 2-D int array."""
    x = np.ascontiguousarray(x)
    if x.shape[1] == 0:
        return x[:1], np.zeros(len(x), dtype=np.int64)
    keys = x.view(np.dtype((np.void, x.dtype.itemsize * x.shape[1])))[:, 0]
    _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    return x[first], inv.reshape(-1)


class BatchScorer:
    """Matrix-product scorer over a :class:`~nlmfeature.core.model.Model`'s arrays.  It keeps
    the model's parts, not the model: the model holds its scorer, and a cycle between them
    would keep every in-memory model of a training run's held-out evaluations (hundreds of
    megabytes each at V = 100k) alive until the garbage collector's next full pass."""

    def __init__(self, model: "Model") -> None:
        self.native = model.native
        self.h = model.header
        self.a: Dict[str, np.ndarray] = model.float32_arrays()
        self.use_tables = model.native.uses_tables

    def hidden(self, ctx: np.ndarray) -> np.ndarray:
        """Final hidden vectors (N, D) for padded contexts (N, n-1)."""
        return forward.hidden(self.h, self.a, ctx, tables=self.use_tables)

    def score(self, ctx: np.ndarray, words: np.ndarray) -> np.ndarray:
        """Natural-log scores of ``words`` (N,) after padded contexts ``ctx`` (N, n-1)."""
        V = self.h["vocab_size"]
        words = np.where((words < 0) | (words >= V), self.h["special"]["<unk>"], words).astype(np.int32)
        out = np.empty(len(words), dtype=np.float64)
        for s in range(0, len(words), CHUNK):
            out[s:s + CHUNK] = self._score_chunk(ctx[s:s + CHUNK], words[s:s + CHUNK])
        return out

    def _score_chunk(self, ctx: np.ndarray, words: np.ndarray) -> np.ndarray:
        out_type = self.h["output"]["type"]
        if self.h.get("direct") and out_type not in ("unnormalised", "softmax"):
            # class (and tree) normalisers over direct features: the native path does them
            sess = self.native.session(1 << 16)
            return sess.score_padded(np.ascontiguousarray(ctx), words)
        # k-best lists repeat contexts heavily: compute each distinct context once
        uctx, inv = unique_rows(ctx)
        direct = self._direct_vocab(uctx) if self.h.get("direct") and out_type == "softmax" else None
        return forward.word_log_scores(self.h, self.a, self.hidden(uctx), inv, ctx, words, direct)

    def _direct_vocab(self, uctx: np.ndarray) -> Callable[[int, int], np.ndarray]:
        """``f(i, j)``: every word's direct-feature value after the contexts ``uctx[i:j]``
        ((j - i, V) float32), for a softmax normaliser: the native scorer finds them (hashes,
        prefetched loads), the matrix products do the rest."""
        sess = self.native.session(0, 0)
        V = self.h["vocab_size"]

        def values(i: int, j: int) -> np.ndarray:
            d = np.empty((j - i, V), dtype=np.float32)
            sess.direct_vocab(np.ascontiguousarray(uctx[i:j], dtype=np.int32), d)
            return d
        return values
