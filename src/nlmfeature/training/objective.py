"""The whole training objective of a minibatch: hidden layers + output estimator."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from nlmfeature.training.estimators import Noise, OutputLayer, OutputSpec
from nlmfeature.training.network import Network
from nlmfeature.training.optim import Gradients

Params = Dict[str, np.ndarray]

#: arrays of a model file that training never changes
FIXED = ("unigram", "source.unigram", "vocab.offsets", "vocab.hash", "vocab.bytes", "class.of_word", "class.start",
         "class.members", "tree.path_start", "tree.path_node", "tree.path_sign")


def trainable_names(header: Dict[str, Any], arrays: Params) -> List[str]:
    """Names of the learned arrays of a model (float arrays that are not fixed structure)."""
    return sorted(n for n, a in arrays.items()
                  if n not in FIXED and not n.endswith(".tables") and a.dtype.kind == "f")


class Objective:
    """Loss and gradients of a minibatch for a model (header + parameter arrays)."""

    def __init__(self, header: Dict[str, Any], params: Params, spec: OutputSpec, threads: int = 1) -> None:
        self.header = header
        self.params = params
        self.net = Network(header, params, threads)
        self.out = OutputLayer(params, spec)

    def loss_and_grads(self, ctx: np.ndarray, targets: np.ndarray, noise: Optional[Noise],
                       grads: Gradients, dropout_mask: Optional[np.ndarray] = None) -> float:
        """Summed loss of the minibatch; gradients are added to ``grads``.

        ``dropout_mask`` (N, D), if given, multiplies the final hidden vectors during training
        (inverted dropout: kept units are scaled by 1/(1-p) in the mask, so nothing changes at
        test time and the model file is the same)."""
        fw = self.net.forward(ctx)
        H = fw.H if dropout_mask is None else np.ascontiguousarray(fw.H * dropout_mask)
        loss, dH = self.out.loss_and_grad(H, ctx, targets, noise, grads)
        if dropout_mask is not None:
            dH *= dropout_mask
        self.net.backward(fw, dH, grads)
        return loss

    def loss(self, ctx: np.ndarray, targets: np.ndarray, noise: Optional[Noise],
             dropout_mask: Optional[np.ndarray] = None) -> float:
        """Loss only (gradient checks): runs the gradient code into a throw-away buffer."""
        scratch = Gradients(self.params, trainable_names(self.header, self.params))
        return self.loss_and_grads(ctx, targets, noise, scratch, dropout_mask)


def dropout_mask(shape, p: float, seed: int, step: int, dtype=np.float32) -> Optional[np.ndarray]:
    """Inverted-dropout mask (0 or 1/(1-p)) for minibatch ``step``: reproducible from
    (seed, step), so a resumed run drops what an uninterrupted one would."""
    if p <= 0:
        return None
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(step), 0xD0])
    return ((rng.random(shape, dtype=np.float32) >= p) / (1.0 - p)).astype(dtype)
