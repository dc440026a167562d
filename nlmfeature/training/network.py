"""Forward and backward pass of the hidden layers over a minibatch of padded contexts.

This is the maths of :mod:`nlmfeature.architecture` (and of :class:`nlmfeature.batch.BatchScorer`,
which the tests compare against), written so that it can be differentiated:

    branch k:      a_k = f_k( b_k + sum_j M_{k,j} e(w_j) )
    combination:   h0 = a_0 (one branch), max_k a_k (first maximum wins ties, as the
                   scorer's ``>=``), sum_k a_k, or ((a_0 (a_1 + 1)) (a_2 + 1)) ...
    extra layers:  h_{i+1} = g_i(W_i h_i + c_i)

The parameters are the model-file arrays (``embeddings``, ``branch{k}.weights``, ...) in
float32 for training or float64 for gradient checks.  Dense products go through numpy
(BLAS, multi-threaded); the embedding-row gradients are scattered by the Cython kernels of
:mod:`nlmfeature._train` through :class:`~nlmfeature.training.optim.Gradients`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from .optim import Gradients

Params = Dict[str, np.ndarray]


def activate(name: str, x: np.ndarray) -> np.ndarray:
    """f(x) as a new array (names as in the model file)."""
    if name == "identity":
        return x
    if name in ("relu", "rectifier"):
        return np.maximum(x, 0)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if name == "tanh":
        return np.tanh(x)
    if name == "hardtanh":
        return np.clip(x, -1, 1)
    raise ValueError(f"unknown activation {name!r}")


def activation_grad(name: str, pre: np.ndarray, post: np.ndarray, d: np.ndarray) -> np.ndarray:
    """d(loss)/d(pre) from d(loss)/d(post) for post = f(pre)."""
    if name == "identity":
        return d
    if name in ("relu", "rectifier"):
        return d * (pre > 0)
    if name == "sigmoid":
        return d * post * (1 - post)
    if name == "tanh":
        return d * (1 - post * post)
    if name == "hardtanh":
        return d * ((pre > -1) & (pre < 1))
    raise ValueError(f"unknown activation {name!r}")


@dataclass
class Forward:
    """What the backward pass needs from the forward pass."""

    ctx: np.ndarray
    X: np.ndarray                                    # (N, c, E) context embeddings
    pre: List[np.ndarray] = field(default_factory=list)    # per branch, before f
    post: List[np.ndarray] = field(default_factory=list)   # per branch, after f
    sel: Optional[np.ndarray] = None                 # max combination: winning branch
    partial: List[np.ndarray] = field(default_factory=list)  # mul combination: running products
    layer_in: List[np.ndarray] = field(default_factory=list)
    layer_pre: List[np.ndarray] = field(default_factory=list)
    layer_post: List[np.ndarray] = field(default_factory=list)
    H: Optional[np.ndarray] = None                   # (N, D) final hidden vectors


class Network:
    """The hidden layers of a model described by a model-file header."""

    def __init__(self, header: Dict[str, Any], params: Params, threads: int = 1) -> None:
        self.h = header
        self.p = params
        self.threads = threads
        self.c = int(header["order"]) - 1

    def forward(self, ctx: np.ndarray) -> Forward:
        """Hidden vectors for padded contexts ``ctx`` (N, n-1) int32."""
        p, h = self.p, self.h
        N = len(ctx)
        emb = p["embeddings"]
        X = emb[ctx]  # (N, c, E)
        fw = Forward(ctx=ctx, X=X)
        acc = None
        for k, br in enumerate(h["branches"]):
            W = p[f"branch{k}.weights"]
            if br["diagonal"]:
                pre = np.einsum("nce,ce->ne", X, W) if self.c else np.zeros((N, W.shape[1]), X.dtype)
            else:
                Hk = W.shape[1]
                Wcat = W.transpose(1, 0, 2).reshape(Hk, -1)  # (H, c*E)
                pre = X.reshape(N, -1) @ Wcat.T
            if br.get("bias"):
                pre = pre + p[f"branch{k}.bias"]
            post = activate(br["activation"], pre)
            fw.pre.append(pre)
            fw.post.append(post)
            if acc is None:
                acc = post
                if h.get("combine") == "max":
                    fw.sel = np.zeros(post.shape, dtype=np.int8)
            elif h["combine"] == "max":
                take = post > acc
                fw.sel[take] = k
                acc = np.where(take, post, acc)
            elif h["combine"] == "mul":
                fw.partial.append(acc)
                acc = acc * (post + 1)
            else:
                acc = acc + post
        for k, ly in enumerate(h["layers"]):
            fw.layer_in.append(acc)
            pre = acc @ p[f"layer{k}.weight"].T + p[f"layer{k}.bias"]
            acc = activate(ly["activation"], pre)
            fw.layer_pre.append(pre)
            fw.layer_post.append(acc)
        fw.H = np.ascontiguousarray(acc)
        return fw

    def backward(self, fw: Forward, dH: np.ndarray, grads: Gradients) -> None:
        """Accumulate the gradients of every hidden-layer parameter given d(loss)/dH."""
        p, h = self.p, self.h
        d = dH
        for k in reversed(range(len(h["layers"]))):
            ly = h["layers"][k]
            dz = activation_grad(ly["activation"], fw.layer_pre[k], fw.layer_post[k], d)
            grads.dense(f"layer{k}.weight")[...] += dz.T @ fw.layer_in[k]
            grads.dense(f"layer{k}.bias")[...] += dz.sum(axis=0)
            d = dz @ p[f"layer{k}.weight"]
        K = len(h["branches"])
        dpost: List[np.ndarray] = []
        if K == 1:
            dpost = [d]
        elif h["combine"] == "max":
            dpost = [d * (fw.sel == k) for k in range(K)]
        elif h["combine"] == "mul":
            dpost = [None] * K  # type: ignore[list-item]
            dacc = d
            for k in reversed(range(1, K)):
                dpost[k] = dacc * fw.partial[k - 1]
                dacc = dacc * (fw.post[k] + 1)
            dpost[0] = dacc
        else:
            dpost = [d] * K
        N = len(fw.ctx)
        dX = np.zeros_like(fw.X)
        for k, br in enumerate(h["branches"]):
            dpre = activation_grad(br["activation"], fw.pre[k], fw.post[k], dpost[k])
            if br.get("bias"):
                grads.dense(f"branch{k}.bias")[...] += dpre.sum(axis=0)
            W = p[f"branch{k}.weights"]
            if self.c == 0:
                continue
            if br["diagonal"]:
                grads.dense(f"branch{k}.weights")[...] += np.einsum("ne,nce->ce", dpre, fw.X)
                dX += dpre[:, None, :] * W[None, :, :]
            else:
                Hk = W.shape[1]
                Wcat = W.transpose(1, 0, 2).reshape(Hk, -1)
                dW = (dpre.T @ fw.X.reshape(N, -1)).reshape(Hk, self.c, -1).transpose(1, 0, 2)
                grads.dense(f"branch{k}.weights")[...] += dW
                dX += (dpre @ Wcat).reshape(dX.shape)
        if self.c:
            E = dX.shape[2]
            grads.rows("embeddings", np.ascontiguousarray(fw.ctx.reshape(-1)),
                       np.ascontiguousarray(dX.reshape(-1, E)))
