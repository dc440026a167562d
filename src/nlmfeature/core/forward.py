"""The numpy forward pass: the one matrix-product implementation of a model's maths.

Everything that runs a model through numpy uses this module: batched scoring
(:mod:`nlmfeature.core.batch`, hence k-best rescoring, perplexity and training evaluation),
:meth:`nlmfeature.core.model.Model.hidden`, the training forward/backward pass
(:mod:`nlmfeature.training.network`, which asks for a :class:`Trace`) and the whole-vocabulary
distributions of the log-linear interpolation (:mod:`nlmfeature.training.kenlm_baseline`).  The
one-lookup-at-a-time Cython scorer is the other implementation (what decoders call), and
``tests/reference.py`` an independent float64 oracle; the tests compare all three.

The maths (``docs/model-format.md``), for padded contexts ``w_1 .. w_c`` (c = n-1)::

    branch k:      a_k = f_k( b_k + sum_j M_{k,j} e(w_j) )      (M diagonal or full; or the
                                                                 precomputed table rows)
    combination:   h0 = a_0 (one branch), max_k a_k, sum_k a_k, or ((a_0 (a_1 + 1)) (a_2 + 1)) ...
    extra layers:  h_{i+1} = g_i(W_i h_i + c_i)
    output:        raw score of w = h . r_w + b_w (+ direct n-gram weights), normalised by a
                   softmax, a class factorisation or a binary tree

Parameters are the model-file arrays (``embeddings``, ``branch{k}.weights``, ...) in float32
(or float64 for gradient checks); the result has their dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Mapping, Optional, Tuple

import numpy as np

Params = Mapping[str, np.ndarray]

#: activation names of the model format (``rectifier`` is NPLM's name of ``relu``)
ACTIVATIONS = ("identity", "relu", "rectifier", "sigmoid", "tanh", "hardtanh")

#: contexts per block of whole-vocabulary logits (bounds memory: block x V floats)
VOCAB_ROWS = 512


# -- activations ----------------------------------------------------------------------------
def activate(name: str, x: np.ndarray, inplace: bool = False) -> np.ndarray:
    """f(x) for an activation named as in the model file; in place when ``inplace``
    (``x`` is then returned), else a new array (``x`` itself for ``identity``)."""
    if name == "identity":
        return x
    out = x if inplace else None
    if name in ("relu", "rectifier"):
        return np.maximum(x, 0, out=out)
    if name == "sigmoid":
        y = np.negative(x, out=out)
        np.exp(y, out=y); y += 1; np.reciprocal(y, out=y)
        return y
    if name == "tanh":
        return np.tanh(x, out=out)
    if name == "hardtanh":
        return np.clip(x, -1, 1, out=out)
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


# -- hidden layers --------------------------------------------------------------------------
@dataclass
class Trace:
    """What a backward pass needs from :func:`hidden` (given ``trace=Trace()``)."""

    ctx: Optional[np.ndarray] = None
    X: Optional[np.ndarray] = None                   #: (N, c, E) context embeddings
    pre: List[np.ndarray] = field(default_factory=list)    #: per branch, before f
    post: List[np.ndarray] = field(default_factory=list)   #: per branch, after f
    sel: Optional[np.ndarray] = None                 #: max combination: winning branch
    partial: List[np.ndarray] = field(default_factory=list)  #: mul combination: running products
    layer_in: List[np.ndarray] = field(default_factory=list)
    layer_pre: List[np.ndarray] = field(default_factory=list)
    layer_post: List[np.ndarray] = field(default_factory=list)
    H: Optional[np.ndarray] = None                   #: (N, D) final hidden vectors


def full_matrix(W: np.ndarray) -> np.ndarray:
    """A full branch's (c, H, E) context matrices as one (H, c*E) matrix."""
    return W.transpose(1, 0, 2).reshape(W.shape[1], -1)


def _branch_pre(header: Mapping[str, Any], p: Params, k: int, ctx: np.ndarray,
                X: Optional[np.ndarray], tables: bool) -> np.ndarray:
    """b_k + sum_j M_{k,j} e(w_j) for every context (before the activation).

    A loaded joint model's context is [w source-window ids | n-1 target ids]: its branch
    weights hold the w source positions first, and source ids index ``source.embeddings`` (or
    ``branch{k}.source.tables``).  (Training runs the target-only path on one combined
    embedding table: target rows, then source rows.)"""
    br = header["branches"][k]
    W = p[f"branch{k}.weights"]
    N, c = ctx.shape
    w = int(header["source"]["window"]) if header.get("source") and "source.embeddings" in p else 0
    T = p.get(f"branch{k}.tables") if tables else None
    S = p.get(f"branch{k}.source.tables") if tables and w else None
    if X is not None and c and br["diagonal"] and T is None and not w:
        pre = np.einsum("nce,ce->ne", X, W)  # embeddings gathered already (training)
    elif not br["diagonal"] and T is None and not w:
        if X is None:
            X = p["embeddings"][ctx]
        pre = X.reshape(N, -1) @ full_matrix(W).T if c else np.zeros((N, W.shape[1]), W.dtype)
    else:
        # one context position at a time (less memory): a precomputed M_{k,j} e(w) row, or
        # the position's embedding times its (diagonal or full) matrix
        pre = np.zeros((N, br["hidden"]), dtype=W.dtype)
        for j in range(c):
            src = j < w
            tab = S if src else T
            if tab is not None:
                pre += tab[j if src else j - w][ctx[:, j]]
                continue
            e = p["source.embeddings" if src else "embeddings"][ctx[:, j]]
            pre += e * W[j] if br["diagonal"] else e @ W[j].T
    if br.get("bias"):
        pre += p[f"branch{k}.bias"]
    return pre


def hidden(header: Mapping[str, Any], p: Params, ctx: np.ndarray, tables: bool = True,
           trace: Optional[Trace] = None) -> np.ndarray:
    """Final hidden vectors (N, D) of padded contexts ``ctx`` (N, n-1) int32.

    ``tables`` uses the precomputed first-layer tables when the arrays hold them; ``trace``
    (training) records what :func:`nlmfeature.training.network.Network.backward` needs."""
    ctx = np.asarray(ctx)
    X = None
    if trace is not None:
        X = p["embeddings"][ctx]              # (N, c, E), kept for the embedding gradients
        trace.ctx, trace.X = ctx, X
        tables = False
    combine = header.get("combine")
    acc = None
    for k, br in enumerate(header["branches"]):
        pre = _branch_pre(header, p, k, ctx, X, tables)
        if trace is None:
            post = activate(br["activation"], pre, inplace=True)
        else:
            post = activate(br["activation"], pre)
            trace.pre.append(pre)
            trace.post.append(post)
        if acc is None:
            acc = post
            if trace is not None and combine == "max":
                trace.sel = np.zeros(post.shape, dtype=np.int8)
        elif combine == "max":
            if trace is not None:
                take = post > acc             # the first maximum wins ties, as the scorer's >=
                trace.sel[take] = k
                acc = np.where(take, post, acc)
            else:
                np.maximum(acc, post, out=acc)
        elif combine == "mul":
            if trace is not None:
                trace.partial.append(acc)
                acc = acc * (post + 1)
            else:
                acc *= post + 1
        else:
            if trace is not None:
                acc = acc + post
            else:
                acc += post
    for k, ly in enumerate(header["layers"]):
        pre = acc @ p[f"layer{k}.weight"].T + p[f"layer{k}.bias"]
        if trace is not None:
            trace.layer_in.append(acc)
            trace.layer_pre.append(pre)
            acc = activate(ly["activation"], pre)
            trace.layer_post.append(acc)
        else:
            acc = activate(ly["activation"], pre, inplace=True)
    if trace is not None:
        trace.H = np.ascontiguousarray(acc)
        return trace.H
    return acc


# -- output layers ----------------------------------------------------------------------------
def logsumexp_rows(x: np.ndarray) -> np.ndarray:
    """Row-wise log(sum(exp(x))) as float64; a float32 ``x`` is exponentiated in float32 (one
    pass, no float64 copy of the matrix) and summed in float64."""
    m = x.max(axis=1)
    e = np.subtract(x, m[:, None], dtype=x.dtype if x.dtype == np.float32 else np.float64)
    np.exp(e, out=e)
    return m.astype(np.float64) + np.log(e.sum(axis=1, dtype=np.float64))


def _vocab_logits(p: Params, H: np.ndarray, rows: Optional[np.ndarray] = None) -> np.ndarray:
    """h . r_w + b_w for every word (or the words ``rows``): (N, V) in H's dtype."""
    W, b = p["output.weight"], p["output.bias"]
    if rows is not None:
        W, b = W[rows], b[rows]
    z = H @ W.T.astype(H.dtype, copy=False)
    z += b.astype(H.dtype, copy=False)
    return z


def softmax_normalisers(p: Params, H: np.ndarray,
                        direct: Optional[Callable[[int, int], np.ndarray]] = None) -> np.ndarray:
    """log Z(h) = log sum_w exp(h . r_w + b_w [+ d_w]) of each hidden vector (float64), in
    blocks; ``direct(i, j)``: the direct-feature values d (float32, (j - i, V)) of the
    contexts of rows i..j-1, for a model with direct features."""
    if not len(H):
        return np.zeros(0)
    V = p["output.weight"].shape[0]
    rows = VOCAB_ROWS if direct is None else max(16, min(VOCAB_ROWS, (1 << 24) // max(V, 1)))
    out = []
    for i in range(0, len(H), rows):
        z = _vocab_logits(p, H[i:i + rows])
        if direct is not None:
            z += direct(i, i + len(z)).astype(z.dtype, copy=False)
        out.append(logsumexp_rows(z))
    return np.concatenate(out)


def class_logits(p: Params, H: np.ndarray) -> np.ndarray:
    """Raw class scores h . s_c + t_c: (N, C) in H's dtype; ``log p(class | h)`` is this
    minus :func:`logsumexp_rows` of it."""
    cl = H @ p["class.weight"].T.astype(H.dtype, copy=False)
    cl += p["class.bias"].astype(H.dtype, copy=False)
    return cl


def word_logits(header: Mapping[str, Any], p: Params, H: np.ndarray, ctx: np.ndarray,
                words: np.ndarray) -> np.ndarray:
    """Raw scores h_i . r_{w_i} + b_{w_i} (+ direct n-gram weights) of one word per row
    (float64)."""
    s = np.einsum("nd,nd->n", H, p["output.weight"][words], dtype=np.float64) + p["output.bias"][words]
    d = header.get("direct")
    if d:
        from nlmfeature._scorer import direct_feature_indices

        idx = direct_feature_indices(np.ascontiguousarray(ctx, dtype=np.int32),
                                     np.ascontiguousarray(words, dtype=np.int32), 0,
                                     d["order"], d["hash_space"])
        s += p["direct.weights"][idx].astype(np.float64).sum(axis=1)
    return s


def word_log_scores(header: Mapping[str, Any], p: Params, Hu: np.ndarray, inv: np.ndarray,
                    ctx: np.ndarray, words: np.ndarray,
                    direct_vocab: Optional[Callable[[int, int], np.ndarray]] = None) -> np.ndarray:
    """Natural-log scores (float64) of ``words`` (N,) after contexts whose distinct hidden
    vectors are ``Hu`` (row ``inv[i]`` for n-gram ``i``; normalisers are computed once per
    distinct context, or per distinct (context, class)).  Direct n-gram features of a
    normalised output need every word's direct value per context: a softmax output takes them
    from ``direct_vocab`` (see :func:`softmax_normalisers`; the Cython scorer computes them);
    class and tree outputs with direct features are the Cython scorer's alone."""
    out_type = header["output"]["type"]
    if header.get("direct") and out_type != "unnormalised" and (out_type != "softmax" or direct_vocab is None):
        raise ValueError("normalised outputs with direct features: use the Cython scorer")
    H = Hu[inv]
    if out_type == "tree":
        return _tree_word_scores(p, H, words)
    logit = word_logits(header, p, H, ctx, words)
    if out_type == "unnormalised":
        return logit
    if out_type == "softmax":
        return logit - softmax_normalisers(p, Hu, direct_vocab)[inv]
    if out_type != "class":
        raise ValueError(f"unknown output layer {out_type!r}")
    cls = p["class.of_word"][words]
    cl = class_logits(p, Hu)
    class_lp = cl[inv, cls].astype(np.float64) - logsumexp_rows(cl)[inv]
    start, members = p["class.start"], p["class.members"]
    # one within-class normaliser per distinct (context, class)
    pairs, pinv = np.unique(inv.astype(np.int64) * len(start) + cls, return_inverse=True)
    pctx, pcls = pairs // len(start), pairs % len(start)
    norm = np.empty(len(pairs), dtype=np.float64)
    order = np.argsort(pcls, kind="stable")
    bounds = np.flatnonzero(np.diff(pcls[order])) + 1
    for rows in np.split(order, bounds):
        c = pcls[rows[0]]
        norm[rows] = logsumexp_rows(_vocab_logits(p, Hu[pctx[rows]], members[start[c]:start[c + 1]]))
    # the within-class term first, as the Cython scorer: with a huge logit (a bias of 1e20
    # passes validation) log p(c|h) added before subtracting the normaliser would be lost
    return class_lp + (logit - norm[pinv.reshape(-1)])


def _tree_word_scores(p: Params, H: np.ndarray, words: np.ndarray) -> np.ndarray:
    """Sum of log-sigmoids along each word's path."""
    ps, pn, sg = p["tree.path_start"], p["tree.path_node"], p["tree.path_sign"]
    lens = (ps[words + 1] - ps[words]).astype(np.int64)
    L = int(lens.max()) if len(lens) else 0
    res = np.zeros(len(words), dtype=np.float64)
    for step in range(L):
        rows = np.flatnonzero(lens > step)
        q = ps[words[rows]] + step
        nodes = pn[q]
        x = np.einsum("nd,nd->n", H[rows], p["tree.weight"][nodes], dtype=np.float64) + p["tree.bias"][nodes]
        x *= sg[q]
        res[rows] += -np.logaddexp(0.0, -x)
    return res


def vocab_log_scores(header: Mapping[str, Any], p: Params, H: np.ndarray
                     ) -> Tuple[np.ndarray, np.ndarray]:
    """Scores of *every* vocabulary word after each hidden vector, as (raw (N, V) float32,
    offset (N,) float64) with ``log p(w | h_i) = raw[i, w] - offset[i]`` (natural logs).
    Exact for softmax, class and tree outputs; the raw scores (offset 0) for unnormalised
    ones.  Models with direct n-gram features are not supported (ValueError)."""
    if header.get("direct"):
        raise ValueError("whole-vocabulary distributions of models with direct n-gram "
                         "features are not supported")
    H = np.ascontiguousarray(H, dtype=np.float32)
    kind = header["output"]["type"]
    N = len(H)
    if kind in ("unnormalised", "softmax"):
        z = _vocab_logits(p, H)
        return z, (logsumexp_rows(z) if kind == "softmax" else np.zeros(N))
    if kind == "class":
        cl = class_logits(p, H)
        cl -= logsumexp_rows(cl)[:, None].astype(np.float32)
        z = _vocab_logits(p, H)
        start, members = p["class.start"], p["class.members"]
        for c in range(len(start) - 1):
            mem = members[start[c]:start[c + 1]]
            zc = z[:, mem]
            z[:, mem] = zc - (logsumexp_rows(zc)[:, None] - cl[:, c:c + 1]).astype(np.float32)
        return z, np.zeros(N)
    if kind != "tree":
        raise ValueError(f"unknown output layer {kind!r}")
    # tree: sum of log-sigmoids along each word's path, for every word at once
    x = (H @ p["tree.weight"].T + p["tree.bias"]).astype(np.float64)
    ps, pn, sg = p["tree.path_start"], p["tree.path_node"], p["tree.path_sign"]
    steps = -np.logaddexp(0.0, -(x[:, pn] * sg))            # (N, total path length)
    V = len(ps) - 1
    out = np.zeros((N, V), dtype=np.float32)
    nonempty = ps[1:] > ps[:-1]
    if steps.shape[1]:
        out[:, nonempty] = np.add.reduceat(steps, ps[:-1][nonempty], axis=1)
    return out, np.zeros(N)
