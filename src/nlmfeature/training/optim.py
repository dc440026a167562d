"""Gradient buffers with sparse row tracking, and AdaGrad (Duchi et al. 2011).

Every parameter has a full-size gradient buffer that stays zero between steps.  Dense
contributions (``dense(name)``) mark the whole parameter; sparse ones (``rows``, ``outer``,
``values``, ``direct``) add into single rows and record which rows they touched, so an
update of the embeddings or of the output rows costs the rows a minibatch touched, not the
vocabulary.  AdaGrad then updates only those rows (in parallel, in Cython) and zeroes them.

L2 regularisation (``--lambda-lbl``) adds ``l2 * theta`` to the gradient of every weight
(not of biases or direct-feature weights).  For sparse parameters it is applied to the rows
a minibatch touched, when they are touched: the usual lazy approximation of OxLM and
word2vec-style trainers.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional

import numpy as np

from nlmfeature import _train
from nlmfeature.training import arrays

Params = Dict[str, np.ndarray]


def regularised(name: str) -> bool:
    """Whether L2 applies to a parameter (weights yes; biases, direct weights, tables no)."""
    return not (name.endswith(".bias") or name.startswith("direct.") or name == "unigram")


class Gradients:
    """Gradient accumulators for a set of parameters (float32 or float64)."""

    def __init__(self, params: Params, names: Iterable[str], threads: int = 1) -> None:
        self.threads = max(1, int(threads))
        self.g: Dict[str, np.ndarray] = {}
        self.mark: Dict[str, np.ndarray] = {}
        self.touched: Dict[str, np.ndarray] = {}
        self.n_touched: Dict[str, int] = {}
        self.full: Dict[str, bool] = {}
        for name in names:
            p = params[name]
            self.g[name] = arrays.zeros_like(p)
            rows = p.shape[0]
            self.mark[name] = arrays.zeros(rows, dtype=np.uint8)
            self.touched[name] = np.zeros(rows, dtype=np.int32)
            self.n_touched[name] = 0
            self.full[name] = False

    # -- accumulation -------------------------------------------------------------------
    def dense(self, name: str) -> np.ndarray:
        """The whole gradient buffer of ``name``, marked as fully touched: add into it."""
        self.full[name] = True
        return self.g[name]

    def rows(self, name: str, idx: np.ndarray, rows: np.ndarray) -> None:
        """g[idx[i]] += rows[i]."""
        self.n_touched[name] = _train.scatter_rows(
            self.g[name], self.mark[name], self.touched[name], self.n_touched[name],
            np.ascontiguousarray(idx, dtype=np.int32), np.ascontiguousarray(rows, dtype=self.g[name].dtype),
            self.threads)

    def outer(self, name: str, cand: np.ndarray, G: np.ndarray, H: np.ndarray) -> None:
        """g[cand[n, j]] += G[n, j] * H[n]."""
        self.n_touched[name] = _train.scatter_outer(
            self.g[name], self.mark[name], self.touched[name], self.n_touched[name],
            np.ascontiguousarray(cand, dtype=np.int32), np.ascontiguousarray(G, dtype=np.float64),
            np.ascontiguousarray(H, dtype=self.g[name].dtype), self.threads)

    def values(self, name: str, idx: np.ndarray, vals: np.ndarray) -> None:
        """g[idx[i]] += vals[i] for a vector."""
        self.n_touched[name] = _train.scatter_values(
            self.g[name], self.mark[name], self.touched[name], self.n_touched[name],
            np.ascontiguousarray(idx, dtype=np.int32).reshape(-1),
            np.ascontiguousarray(vals, dtype=np.float64).reshape(-1))

    def direct(self, ctx: np.ndarray, cand: np.ndarray, G: np.ndarray, kind: int, order: int,
               hash_space: int, allowed: Optional[np.ndarray]) -> None:
        """Direct-feature weights of (ctx[n], cand[n, j]) += G[n, j] (allowed buckets only)."""
        name = "direct.weights"
        self.n_touched[name] = _train.direct_scatter(
            self.g[name], self.mark[name], self.touched[name], self.n_touched[name],
            np.ascontiguousarray(ctx, dtype=np.int32), cand, np.ascontiguousarray(G, dtype=np.float64),
            kind, order, hash_space, allowed if allowed is not None else np.zeros(0, dtype=np.uint8))

    # -- inspection ---------------------------------------------------------------------
    def to_dense(self) -> Dict[str, np.ndarray]:
        """Copies of all gradient buffers (tests)."""
        return {k: v.copy() for k, v in self.g.items()}

    def clear(self) -> None:
        """Zero every buffer and mark."""
        for name in self.g:
            self.g[name][...] = 0
            self.mark[name][...] = 0
            self.n_touched[name] = 0
            self.full[name] = False


class AdaGrad:
    """AdaGrad: theta -= lr * g / (sqrt(sum of g^2) + eps), per coordinate.

    ``state`` (the squared-gradient sums) has one array per parameter; it is saved in
    checkpoints so a resumed run continues exactly.  The matrices named in ``row_sums`` keep one
    sum per row instead, of the mean squared gradient of the row's coordinates (row-wise
    AdaGrad, as FBGEMM's and TorchRec's embedding tables: half the memory and the row traffic
    of the updates); their state is (rows, 1), which the fused native step reads as row-wise.
    :meth:`step` (the general path) does not take them.
    """

    def __init__(self, params: Params, names: Iterable[str], lr: float, eps: float = 1e-8,
                 threads: int = 1, row_sums: Iterable[str] = ()) -> None:
        self.p = params
        self.names = list(names)
        self.lr = float(lr)
        self.eps = float(eps)
        self.threads = max(1, int(threads))
        self.row_sums = {n for n in row_sums if n in self.names}
        self.state: Dict[str, np.ndarray] = {
            n: arrays.zeros((params[n].shape[0], 1)) if n in self.row_sums else arrays.zeros_like(params[n])
            for n in self.names}

    def step(self, grads: Gradients, l2: float = 0.0) -> None:
        """Apply and clear the gradients in ``grads``."""
        if self.row_sums:
            raise ValueError("row-wise AdaGrad sums are updated by the fused native step only")
        for name in self.names:
            p, a, g = self.p[name], self.state[name], grads.g[name]
            reg = l2 if regularised(name) else 0.0
            if grads.full[name]:
                _train.adagrad_dense(p.reshape(-1), a.reshape(-1), g.reshape(-1), self.lr, reg,
                                     self.eps, self.threads)
                grads.mark[name][...] = 0
            elif grads.n_touched[name]:
                n = grads.n_touched[name]
                if p.ndim == 1:
                    _train.adagrad_values(p, a, g, grads.mark[name], grads.touched[name], n,
                                          self.lr, reg, self.eps)
                else:
                    _train.adagrad_rows(p.reshape(p.shape[0], -1), a.reshape(p.shape[0], -1),
                                        g.reshape(p.shape[0], -1), grads.mark[name],
                                        grads.touched[name], n, self.lr, reg, self.eps, self.threads)
            grads.full[name] = False
            grads.n_touched[name] = 0
