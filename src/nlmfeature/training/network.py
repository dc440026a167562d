"""Forward and backward pass of the hidden layers over a minibatch of padded contexts.

The forward pass is :func:`nlmfeature.core.forward.hidden` (the one numpy forward pass, also
behind batched scoring), asked for a :class:`~nlmfeature.core.forward.Trace`; this module adds its
backward pass:

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

from typing import Any, Dict, List

import numpy as np

from nlmfeature.core.forward import Trace, activation_grad, full_matrix, hidden
from nlmfeature.training.optim import Gradients

Params = Dict[str, np.ndarray]


#: what the backward pass needs from the forward pass (one numpy forward pass: nlmfeature.core.forward)
Forward = Trace


class Network:
    """The hidden layers of a model described by a model-file header."""

    def __init__(self, header: Dict[str, Any], params: Params, threads: int = 1) -> None:
        self.h = header
        self.p = params
        self.threads = threads
        self.c = int(header["order"]) - 1

    def forward(self, ctx: np.ndarray) -> Forward:
        """Hidden vectors for padded contexts ``ctx`` (N, n-1) int32, with what
        :meth:`backward` needs (:func:`nlmfeature.core.forward.hidden` with a trace)."""
        fw = Trace()
        hidden(self.h, self.p, ctx, tables=False, trace=fw)
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
                Wcat = full_matrix(W)
                dW = (dpre.T @ fw.X.reshape(N, -1)).reshape(Hk, self.c, -1).transpose(1, 0, 2)
                grads.dense(f"branch{k}.weights")[...] += dW
                dX += (dpre @ Wcat).reshape(dX.shape)
        if self.c:
            E = dX.shape[2]
            grads.rows("embeddings", np.ascontiguousarray(fw.ctx.reshape(-1)),
                       np.ascontiguousarray(dX.reshape(-1, E)))
