"""Batch k-best MIRA (Cherry & Foster 2012) over a k-best pool, as Moses' ``kbmira``.

Every epoch visits the sentences in a (seeded) random order.  For each sentence, with the
current weights ``w``: hope = argmax(model score + BLEU), fear = argmax(model score - BLEU),
where BLEU is the sentence's statistics added to a background pseudo-document (all ones at the
start), scored unsmoothed and scaled by the background reference length
(:func:`nlmfeature.mt.bleu.background_bleu`).  When hope and fear differ and hope's BLEU is higher,
the hinge loss ``BLEU(hope) - BLEU(fear) - w.(f_hope - f_fear)`` gives the update
``w += min(C, loss / |f_hope - f_fear|^2) * (f_hope - f_fear)`` if positive, and the background
decays (``decay``) and absorbs the hope's statistics.  Weights are averaged as kbmira's
``AvgWeightVector`` (initial weights plus the weights after every update, over the number of
updates); after every epoch the averaged weights are scored by corpus BLEU of the 1-best
hypotheses, and the best epoch's averaged weights are the result.  The inner loop is native
(:func:`nlmfeature._mert.mira_epoch`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional

import numpy as np

from nlmfeature import _mert
from nlmfeature.mt.bleu import NUM_STATS
from nlmfeature.mt.tuning.data import PoolArrays
from nlmfeature.mt.tuning.mert import LineSearcher, l1_normalise


@dataclass
class MiraOptions:
    """Settings of :func:`optimise` (defaults as Moses' ``kbmira``)."""

    C: float = 0.01            #: step-size cap
    decay: float = 0.999       #: background pseudo-document decay
    epochs: int = 60           #: passes over the sentences
    seed: int = 0              #: seeds the sentence order of each epoch
    shuffle: bool = True       #: visit sentences in random order (kbmira default)
    model_bg: bool = False     #: background absorbs the model-best instead of the hope


@dataclass
class MiraResult:
    """Best epoch's averaged weights (L1-normalised), their BLEU and a per-epoch log."""

    weights: np.ndarray
    raw_weights: np.ndarray
    bleu: float
    initial_bleu: float
    best_epoch: int
    epochs: List[dict] = field(default_factory=list)


def optimise(arrays: PoolArrays, initial: np.ndarray, options: MiraOptions,
             progress: bool = False, log: Optional[Callable[[str], None]] = None) -> MiraResult:
    """Run batch MIRA from ``initial`` weights (see the module doc)."""
    searcher = LineSearcher(arrays)
    F, stats, offsets = searcher.F, searcher.stats, searcher.offsets
    w = np.array(initial, dtype=np.float64)
    total = w.copy()
    bg = np.ones(NUM_STATS, dtype=np.float64)
    num_updates = 0
    rng = np.random.default_rng(options.seed)
    S = len(offsets) - 1
    initial_bleu = searcher.bleu(w)
    if log is not None:
        log(f"initial BLEU {initial_bleu:.4f}")
    best_bleu, best_epoch, best_w = -1.0, 0, w.copy()
    history: List[dict] = []
    epochs = range(options.epochs)
    if progress:
        from nlmfeature.io.progress import iterate

        epochs = iterate(epochs, desc="MIRA epochs", unit="epoch", leave=False)
    for epoch in epochs:
        order = rng.permutation(S).astype(np.int64) if options.shuffle else \
            np.arange(S, dtype=np.int64)
        num_updates, updates, loss = _mert.mira_epoch(
            F, stats, offsets, order, w, total, bg, float(options.C), float(options.decay),
            bool(options.model_bg), int(num_updates))
        avg = total / num_updates if num_updates > 0 else w.copy()
        bleu = searcher.bleu(avg)
        history.append(dict(epoch=epoch + 1, updates=int(updates), avg_loss=loss / max(S, 1),
                            bleu=bleu))
        if log is not None:
            log(f"epoch {epoch + 1}: {updates}/{S} updates, avg loss {loss / max(S, 1):.4f}, "
                f"BLEU {bleu:.4f}")
        if bleu > best_bleu:
            best_bleu, best_epoch, best_w = bleu, epoch + 1, avg.copy()
    normalised = l1_normalise(best_w)
    return MiraResult(weights=normalised, raw_weights=best_w, bleu=searcher.bleu(normalised),
                      initial_bleu=initial_bleu, best_epoch=best_epoch, epochs=history)
