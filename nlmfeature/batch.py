"""Batched scoring: many n-grams at once through matrix products (numpy / BLAS).

The one-lookup-at-a-time native scorer is what decoders call; this path is for whole
k-best lists and perplexity, where N contexts are known up front and the dense layers
become N x H matrix products.  Its scores equal the native scorer's to float rounding.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict

import numpy as np

from ._scorer import direct_feature_indices

if TYPE_CHECKING:  # pragma: no cover
    from .model import Model

CHUNK = 16384
SOFTMAX_ROWS = 512  # contexts per full-vocabulary logit block


def activation(name: str, x: np.ndarray) -> np.ndarray:
    """Apply an activation function (names as in the model file) in place; returns ``x``."""
    if name in ("relu", "rectifier"):
        np.maximum(x, 0, out=x)
    elif name == "sigmoid":
        np.negative(x, out=x); np.exp(x, out=x); x += 1; np.reciprocal(x, out=x)
    elif name == "tanh":
        np.tanh(x, out=x)
    elif name == "hardtanh":
        np.clip(x, -1, 1, out=x)
    elif name != "identity":
        raise ValueError(f"unknown activation {name!r}")
    return x


def logsumexp_rows(x: np.ndarray) -> np.ndarray:
    """Row-wise log(sum(exp(x))) in float64."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]


def unique_rows(x: np.ndarray):
    """(distinct rows, inverse index) of a 2-D int array."""
    x = np.ascontiguousarray(x)
    if x.shape[1] == 0:
        return x[:1], np.zeros(len(x), dtype=np.int64)
    keys = x.view(np.dtype((np.void, x.dtype.itemsize * x.shape[1])))[:, 0]
    _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    return x[first], inv.reshape(-1)


class BatchScorer:
    """Matrix-product scorer over a :class:`~nlmfeature.model.Model`'s arrays."""

    def __init__(self, model: "Model") -> None:
        self.model = model
        self.h = model.header
        self.a: Dict[str, np.ndarray] = model.arrays
        self.use_tables = model.native.uses_tables

    def hidden(self, ctx: np.ndarray) -> np.ndarray:
        """Final hidden vectors (N, D) for padded contexts (N, n-1)."""
        h, a = self.h, self.a
        acc = None
        w = int(h["source"]["window"]) if h.get("source") else 0  # joint: source columns first
        for k, br in enumerate(h["branches"]):
            v = np.zeros((len(ctx), br["hidden"]), dtype=np.float32)
            if br.get("bias"):
                v += a[f"branch{k}.bias"]
            W = a[f"branch{k}.weights"]
            T = a.get(f"branch{k}.tables") if self.use_tables else None
            S = a.get(f"branch{k}.source.tables") if self.use_tables else None
            for j in range(ctx.shape[1]):
                emb, tab, t = (a["source.embeddings"], S, j) if j < w else (a["embeddings"], T, j - w)
                if tab is not None:
                    v += tab[t][ctx[:, j]]
                elif br["diagonal"]:
                    v += emb[ctx[:, j]] * W[j]
                else:
                    v += emb[ctx[:, j]] @ W[j].T
            activation(br["activation"], v)
            if acc is None:
                acc = v
            elif h["combine"] == "max":
                np.maximum(acc, v, out=acc)
            elif h["combine"] == "mul":
                acc *= v + 1
            else:
                acc += v
        for k, ly in enumerate(h["layers"]):
            acc = activation(ly["activation"], acc @ a[f"layer{k}.weight"].T + a[f"layer{k}.bias"])
        return acc

    def _direct(self, ctx: np.ndarray, targets: np.ndarray, kind: int) -> np.ndarray:
        d = self.h["direct"]
        idx = direct_feature_indices(ctx, targets.astype(np.int32), kind, d["order"], d["hash_space"])
        return self.a["direct.weights"][idx].astype(np.float64).sum(axis=1)

    def score(self, ctx: np.ndarray, words: np.ndarray) -> np.ndarray:
        """Natural-log scores of ``words`` (N,) after padded contexts ``ctx`` (N, n-1)."""
        V = self.h["vocab_size"]
        words = np.where((words < 0) | (words >= V), self.h["special"]["<unk>"], words).astype(np.int32)
        out = np.empty(len(words), dtype=np.float64)
        for s in range(0, len(words), CHUNK):
            out[s:s + CHUNK] = self._score_chunk(ctx[s:s + CHUNK], words[s:s + CHUNK])
        return out

    def _word_logits(self, H: np.ndarray, ctx: np.ndarray, words: np.ndarray) -> np.ndarray:
        a = self.a
        s = np.einsum("nd,nd->n", H, a["output.weight"][words], dtype=np.float64) + a["output.bias"][words]
        if self.h.get("direct"):
            s += self._direct(ctx, words, 0)
        return s

    def _score_chunk(self, ctx: np.ndarray, words: np.ndarray) -> np.ndarray:
        out_type = self.h["output"]["type"]
        if self.h.get("direct") and out_type != "unnormalised":
            # normalisers over direct features need every word's hash: the native path does it
            sess = self.model.native.session(1 << 16)
            return sess.score_padded(np.ascontiguousarray(ctx), words)
        a = self.a
        # k-best lists repeat contexts heavily: compute each distinct context once
        uctx, inv = unique_rows(ctx)
        Hu = self.hidden(uctx)
        H = Hu[inv]
        logit = self._word_logits(H, ctx, words)
        if out_type == "unnormalised":
            return logit
        if out_type == "softmax":
            lz = np.concatenate([logsumexp_rows(Hu[i:i + SOFTMAX_ROWS] @ a["output.weight"].T + a["output.bias"])
                                 for i in range(0, len(Hu), SOFTMAX_ROWS)])
            return logit - lz[inv]
        if out_type == "class":
            cls = a["class.of_word"][words]
            cl = Hu @ a["class.weight"].T + a["class.bias"]
            res = cl[inv, cls].astype(np.float64) - logsumexp_rows(cl)[inv] + logit
            start, members = a["class.start"], a["class.members"]
            # one within-class normaliser per distinct (context, class)
            pairs, pinv = np.unique(inv.astype(np.int64) * len(start) + cls, return_inverse=True)
            pctx, pcls = pairs // len(start), pairs % len(start)
            norm = np.empty(len(pairs), dtype=np.float64)
            order = np.argsort(pcls, kind="stable")
            bounds = np.flatnonzero(np.diff(pcls[order])) + 1
            for rows in np.split(order, bounds):
                c = pcls[rows[0]]
                mem = members[start[c]:start[c + 1]]
                z = Hu[pctx[rows]] @ a["output.weight"][mem].T + a["output.bias"][mem]
                norm[rows] = logsumexp_rows(z)
            return res - norm[pinv]
        # tree
        ps, pn, sg = a["tree.path_start"], a["tree.path_node"], a["tree.path_sign"]
        lens = (ps[words + 1] - ps[words]).astype(np.int64)
        L = int(lens.max()) if len(lens) else 0
        res = np.zeros(len(words), dtype=np.float64)
        for step in range(L):
            rows = np.flatnonzero(lens > step)
            p = ps[words[rows]] + step
            nodes = pn[p]
            x = np.einsum("nd,nd->n", H[rows], a["tree.weight"][nodes], dtype=np.float64) + a["tree.bias"][nodes]
            x *= sg[p]
            res[rows] += -np.logaddexp(0.0, -x)
        return res
