"""Training objectives of the output layer: loss and gradients over a minibatch.

Each estimator takes the final hidden vectors ``H`` (N, D), the padded contexts and the
target words, returns the summed loss and d(loss)/dH, and adds the output-layer gradients
to a :class:`~nlmfeature.training.optim.Gradients`.  Logits are exactly the scorer's:

    word  logit s(w) = r_w . h + b_w (+ direct features of kind 0)
    class logit s(c) = u_c . h + b_c (+ direct features of kind 1)

* ``nce`` -- noise-contrastive estimation (Mnih & Teh 2012; Vaswani et al. 2013) with k noise
  words from the unigram distribution q and normalisers fixed to 1:
  loss = -log sigma(s(w) - log(k q(w))) - sum_j log sigma(-(s(x_j) - log(k q(x_j)))).
* ``class-nce`` -- class-factored NCE (Baltescu & Blunsom 2015): the same loss for the class
  (noise from the class unigram distribution) plus the word-within-class term (noise from
  the unigram distribution of the words of the target's class).
* ``softmax`` -- maximum likelihood over the whole vocabulary; with ``alpha > 0`` plus the
  self-normalisation penalty alpha * log(Z)^2 (Devlin et al. 2014).
* ``class-ml`` -- maximum likelihood of log P(c|h) + log P(w|c,h).
* ``tree-ml`` -- maximum likelihood of a Huffman-tree path: sum of log sigma(sign (u.h + b)).

Noise samples are drawn per example (not shared across the minibatch): k output rows per
example are gathered by :func:`nlmfeature._train.gather_logits`, which costs about as much
as one k x D product per example and keeps the estimator the textbook one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from nlmfeature import _train
from nlmfeature.training.optim import Gradients

Params = Dict[str, np.ndarray]

ESTIMATORS = ("nce", "class-nce", "softmax", "class-ml", "tree-ml")


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    """log(sigmoid(x)), stable."""
    return -np.logaddexp(0.0, -x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """sigmoid(x), stable for large |x|."""
    return np.exp(log_sigmoid(x))


def softmax_rows(z: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(probabilities, log-normalisers) of each row of logits (float64)."""
    z = np.asarray(z, dtype=np.float64)
    m = z.max(axis=1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(axis=1, keepdims=True)
    return e / s, (m + np.log(s))[:, 0]


@dataclass
class Noise:
    """Noise samples of a minibatch: ``words`` (N, k) for ``nce`` and the word term of
    ``class-nce``; ``classes`` (N, k) for the class term of ``class-nce``."""

    words: Optional[np.ndarray] = None
    classes: Optional[np.ndarray] = None


@dataclass
class OutputSpec:
    """What the estimators need to know about the output layer."""

    estimator: str
    k: int = 0                                   #: noise samples
    alpha: float = 0.0                           #: self-normalisation strength
    logq: Optional[np.ndarray] = None            #: (V,) log unigram (nce) / log q(w|c) (class-nce)
    logq_class: Optional[np.ndarray] = None      #: (C,) log class unigram (class-nce)
    direct_order: int = 0
    hash_space: int = 0
    allowed: Optional[np.ndarray] = None         #: (hash_space,) uint8 buckets that may be trained
    threads: int = 1


class OutputLayer:
    """Loss and gradients of one estimator over a model's output arrays."""

    def __init__(self, params: Params, spec: OutputSpec) -> None:
        if spec.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {spec.estimator!r} (known: {', '.join(ESTIMATORS)})")
        self.p = params
        self.s = spec
        if spec.estimator in ("class-ml", "class-nce"):
            start = params["class.start"]
            members = params["class.members"]
            self.pos_in_class = np.empty(len(members), dtype=np.int64)
            for c in range(len(start) - 1):
                self.pos_in_class[members[start[c]:start[c + 1]]] = np.arange(start[c + 1] - start[c])

    # -- logits -------------------------------------------------------------------------
    def _names(self, kind: str) -> Tuple[str, str, int]:
        return {"word": ("output.weight", "output.bias", 0),
                "class": ("class.weight", "class.bias", 1),
                "tree": ("tree.weight", "tree.bias", -1)}[kind]

    def sparse_logits(self, kind: str, H: np.ndarray, ctx: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """Logits (N, K) of candidate rows ``cand`` (N, K) for each example."""
        wn, bn, dk = self._names(kind)
        out = np.empty(cand.shape, dtype=np.float64)
        _train.gather_logits(self.p[wn], self.p[bn], H, cand, out, self.s.threads)
        if self.s.direct_order and dk >= 0:
            _train.direct_add(self.p["direct.weights"], ctx, cand, dk, self.s.direct_order,
                              self.s.hash_space, out, self.s.threads)
        return out

    def sparse_backward(self, kind: str, H: np.ndarray, ctx: np.ndarray, cand: np.ndarray,
                        G: np.ndarray, dH: np.ndarray, grads: Gradients) -> None:
        """Given d(loss)/d(logits) ``G`` (N, K) of candidates ``cand``: dH and output grads."""
        wn, bn, dk = self._names(kind)
        _train.backprop_rows(self.p[wn], cand, G, dH, self.s.threads)
        grads.outer(wn, cand, G, H)
        grads.values(bn, cand, G)
        if self.s.direct_order and dk >= 0:
            grads.direct(ctx, np.ascontiguousarray(cand, dtype=np.int32), G, dk,
                         self.s.direct_order, self.s.hash_space, self.s.allowed)

    def dense_logits(self, kind: str, H: np.ndarray, ctx: np.ndarray,
                     members: Optional[np.ndarray] = None) -> np.ndarray:
        """Logits of all rows (or of ``members``) for each example: (N, R) float64."""
        wn, bn, dk = self._names(kind)
        W, b = self.p[wn], self.p[bn]
        if members is not None:
            W, b = W[members], b[members]
        z = (H @ W.T + b).astype(np.float64)
        if self.s.direct_order and dk >= 0:
            ids = np.arange(len(b), dtype=np.int32) if members is None else members.astype(np.int32)
            cand = np.broadcast_to(ids, (len(H), len(ids)))
            _train.direct_add(self.p["direct.weights"], ctx, cand, dk, self.s.direct_order,
                              self.s.hash_space, z, self.s.threads)
        return z

    def dense_backward(self, kind: str, H: np.ndarray, ctx: np.ndarray, G: np.ndarray,
                       dH: np.ndarray, grads: Gradients, members: Optional[np.ndarray] = None) -> None:
        """Backward of :meth:`dense_logits` given d(loss)/d(logits) ``G`` (N, R)."""
        wn, bn, dk = self._names(kind)
        W = self.p[wn]
        Gc = G.astype(H.dtype)
        if members is None:
            dH += Gc @ W
            grads.dense(wn)[...] += Gc.T @ H
            grads.dense(bn)[...] += G.sum(axis=0)
            ids = np.arange(W.shape[0], dtype=np.int32)
        else:
            dH += Gc @ W[members]
            grads.rows(wn, members, Gc.T @ H)
            grads.values(bn, members, G.sum(axis=0))
            ids = members.astype(np.int32)
        if self.s.direct_order and dk >= 0:
            grads.direct(ctx, np.broadcast_to(ids, (len(H), len(ids))), G, dk,
                         self.s.direct_order, self.s.hash_space, self.s.allowed)

    # -- estimators ---------------------------------------------------------------------
    def _nce(self, kind: str, H, ctx, target, noise, logq_t, logq_n, dH, grads) -> float:
        k = noise.shape[1]
        cand = np.ascontiguousarray(np.concatenate([target[:, None], noise], axis=1), dtype=np.int32)
        s = self.sparse_logits(kind, H, ctx, cand)
        logk = np.log(k)
        x = s - np.concatenate([logq_t[:, None], logq_n], axis=1) - logk
        loss = -(log_sigmoid(x[:, 0]).sum() + log_sigmoid(-x[:, 1:]).sum())
        G = sigmoid(x)
        G[:, 0] -= 1.0
        self.sparse_backward(kind, H, ctx, cand, G, dH, grads)
        return float(loss)

    def loss_and_grad(self, H: np.ndarray, ctx: np.ndarray, target: np.ndarray,
                      noise: Optional[Noise], grads: Gradients) -> Tuple[float, np.ndarray]:
        """Summed loss of the minibatch and d(loss)/dH; output gradients go into ``grads``."""
        est = self.s.estimator
        dH = np.zeros_like(H)
        p = self.p
        if est == "nce":
            logq = self.s.logq
            loss = self._nce("word", H, ctx, target, noise.words, logq[target], logq[noise.words], dH, grads)
        elif est == "class-nce":
            cls = p["class.of_word"][target]
            lqc, lqw = self.s.logq_class, self.s.logq
            loss = self._nce("class", H, ctx, cls, noise.classes, lqc[cls], lqc[noise.classes], dH, grads)
            loss += self._nce("word", H, ctx, target, noise.words, lqw[target], lqw[noise.words], dH, grads)
        elif est == "softmax":
            z = self.dense_logits("word", H, ctx)
            P, lz = softmax_rows(z)
            rows = np.arange(len(target))
            loss = float(-(z[rows, target] - lz).sum())
            G = P
            if self.s.alpha:
                loss += float(self.s.alpha * (lz ** 2).sum())
                G = P * (1.0 + 2.0 * self.s.alpha * lz)[:, None]
            G[rows, target] -= 1.0
            self.dense_backward("word", H, ctx, G, dH, grads)
        elif est == "class-ml":
            cls = p["class.of_word"][target]
            z = self.dense_logits("class", H, ctx)
            P, lz = softmax_rows(z)
            rows = np.arange(len(target))
            loss = float(-(z[rows, cls] - lz).sum())
            P[rows, cls] -= 1.0
            self.dense_backward("class", H, ctx, P, dH, grads)
            start, members = p["class.start"], p["class.members"]
            order = np.argsort(cls, kind="stable")
            bounds = np.flatnonzero(np.diff(cls[order])) + 1
            for grp in np.split(order, bounds):
                c = cls[grp[0]]
                mem = members[start[c]:start[c + 1]]
                Hc, ctxc = H[grp], ctx[grp]
                z = self.dense_logits("word", Hc, ctxc, mem)
                P, lz = softmax_rows(z)
                r = np.arange(len(grp))
                pos = self.pos_in_class[target[grp]]
                loss -= float((z[r, pos] - lz).sum())
                P[r, pos] -= 1.0
                dHc = np.zeros_like(Hc)
                self.dense_backward("word", Hc, ctxc, P, dHc, grads, members=mem)
                dH[grp] += dHc
        else:  # tree-ml
            ps, pn, sg = p["tree.path_start"], p["tree.path_node"], p["tree.path_sign"]
            a, b = ps[target], ps[target + 1]
            lens = (b - a).astype(np.int64)
            L = int(lens.max()) if len(lens) else 0
            if L == 0:
                return 0.0, dH
            steps = np.arange(L)
            valid = steps[None, :] < lens[:, None]
            pos = np.where(valid, a[:, None] + steps[None, :], 0)
            nodes = np.where(valid, pn[pos], 0).astype(np.int32)
            sign = np.where(valid, sg[pos], 0).astype(np.float64)
            u = self.sparse_logits("tree", H, ctx, np.ascontiguousarray(nodes))
            x = sign * u
            loss = float(-(log_sigmoid(x) * valid).sum())
            G = -sign * sigmoid(-x) * valid
            self.sparse_backward("tree", H, ctx, np.ascontiguousarray(nodes), G, dH, grads)
        return loss, dH
