"""Ensembles of unnormalised models as one model file (``nlmfeature ensemble``).

A log-linear ensemble scores a word by the weighted sum of its members' raw scores,
``sum_i a_i s_i(w | context)``.  For the feed-forward models whose hidden vector is one
first-layer branch followed by the output layer (LBL and the one-branch models, without further
hidden layers), that sum is itself such a model, exactly: the members' hidden vectors are
concatenated (embeddings side by side, the context matrices block-diagonal, a shorter member's
far context positions at zero), the output rows are ``[a_1 r1_w ; a_2 r2_w ; ...]``, the output
bias ``sum_i a_i b_i`` and the hashed direct-feature table ``sum_i a_i d_i`` (the same
hash space and direct order: an n-gram hashes to the same slot in every member).  So a decoder
gets the ensemble as one feature with one weight (``NLMFeature path=ensemble.nlm``), with
exact state, every cache and no code of its own: the file is an ordinary model and is
validated as one at load.

Why: in 1000-best rescoring of the Multi30k Moses system (docs/joint.md), the mean of the
default NCE 8-gram and the self-normalised maximum-likelihood 8-gram as one feature gave
+1.61 BLEU on test2016 (and the higher dev BLEU) where either alone gave +1.12 / +1.03; two
such models as two separately weighted features (the NCE and the exact-softmax 8-grams) gave
+1.10: one tied weight generalises, two free ones fit dev.

Only unnormalised (and self-normalised) outputs sum this way: a softmax, class or tree output
normalises after the sum, which would not be the ensemble's score.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from nlmfeature.errors import InputError, NLMFeatureError

from . import modelfile

#: arrays every member must hold identically (the shared vocabulary)
SHARED = ("vocab.offsets", "vocab.hash", "vocab.bytes")


def _reverse(h: Dict[str, Any]) -> bool:
    return bool((h.get("metadata") or {}).get("reverse"))


def _check_member(path: str, h: Dict[str, Any]) -> None:
    """Refuse a member whose score is not a linear function of one concatenable hidden vector."""
    why = None
    if h.get("source"):
        why = "a joint model (source window): ensembles are of target-only models"
    elif h["output"]["type"] != "unnormalised":
        why = (f"its output layer is {h['output']['type']!r}: only unnormalised (and "
               "self-normalised) models sum into one model; a normalised output would "
               "normalise the sum, not sum the normalised scores")
    elif len(h["branches"]) != 1:
        why = f"{len(h['branches'])} first-layer branches (one is supported)"
    elif h["layers"]:
        why = f"{len(h['layers'])} hidden layer(s) after the first (none is supported)"
    if why:
        raise InputError(path, 0, f"cannot be a member of an ensemble: {why}")


def merge(paths: Sequence[str], weights: Optional[Sequence[float]] = None
          ) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """(header, arrays) of the model scoring ``sum_i weights[i] * score_i`` for the models
    ``paths`` (default weights: the mean).  Every member must be unnormalised, of one branch
    without further layers, with the same vocabulary, activation and direction, and the same
    direct-feature hash space and order where it has direct features.  Precomputed
    first-layer tables are derived data: the ensemble has none (``nlmfeature convert`` adds
    them)."""
    if isinstance(paths, (str, bytes)) or len(paths) < 2:
        raise NLMFeatureError("an ensemble needs at least two model files (a list of paths)")
    if weights is None:
        weights = [1.0 / len(paths)] * len(paths)
    weights = [float(a) for a in weights]
    if len(weights) != len(paths):
        raise NLMFeatureError(f"{len(weights)} weights for {len(paths)} models: give one each")
    if not all(np.isfinite(a) and a > 0 for a in weights):
        raise NLMFeatureError(f"ensemble weights must be positive numbers, not {weights}")
    members: List[Tuple[str, Dict[str, Any], Dict[str, np.ndarray], str]] = []
    for p in paths:
        h, a, checksum = modelfile.read_model(p)
        _check_member(p, h)
        members.append((p, h, a, checksum))
    p0, h0, a0, _ = members[0]
    br0 = h0["branches"][0]
    hashes = {m[1]["direct"]["hash_space"] for m in members if m[1].get("direct")}
    dorders = {m[1]["direct"]["order"] for m in members if m[1].get("direct")}
    if len(hashes) > 1 or len(dorders) > 1:
        # a member reads only its own orders' slots; summed tables would hand it the other
        # orders' n-grams at the slots where they collide with its (untrained) entries
        raise InputError(paths[0], 0, f"the members' direct features differ (hash spaces "
                         f"{sorted(hashes)}, orders {sorted(dorders)}): their tables add up "
                         "slot by slot only with the same --direct-order and --hash-space")
    for p, h, a, _ in members[1:]:
        for name in SHARED:
            if a[name].shape != a0[name].shape or not np.array_equal(a[name], a0[name]):
                raise InputError(p, 0, f"its vocabulary differs from {p0}'s: ensemble members "
                                 "need the same vocabulary (train them on the same text with "
                                 "the same --min-count / --vocab)")
        br = h["branches"][0]
        if br["activation"] != br0["activation"]:
            raise InputError(p, 0, f"activation {br['activation']!r} differs from {p0}'s "
                             f"{br0['activation']!r}")
        if _reverse(h) != _reverse(h0):
            raise InputError(p, 0, f"reads in the other direction from {p0} (train --reverse)")
    order = max(h["order"] for _, h, _, _ in members)
    c = order - 1
    diagonal = all(h["branches"][0]["diagonal"] for _, h, _, _ in members)
    widths = [int(h["embed_dim"]) for _, h, _, _ in members]
    hiddens = [int(h["branches"][0]["hidden"]) for _, h, _, _ in members]
    E, H = sum(widths), sum(hiddens)
    V = int(h0["vocab_size"])
    emb = np.concatenate([a["embeddings"].astype(np.float32) for _, _, a, _ in members], axis=1)
    W = np.zeros((c, E) if diagonal else (c, H, E), dtype=np.float32)
    bias = np.zeros(H, dtype=np.float32)
    out_w = np.empty((V, H), dtype=np.float32)
    out_b = np.zeros(V, dtype=np.float64)
    direct_order = next(iter(dorders), 0)       # one order and hash space (checked above)
    direct = np.zeros(next(iter(hashes)), dtype=np.float64) if direct_order else None
    with np.errstate(over="ignore", invalid="ignore"):
        _weigh(members, weights, widths, hiddens, diagonal, c, W, bias, out_w, out_b, direct)
        finite = [arr is None or np.isfinite(arr.astype(np.float32)).all()
                  for arr in (out_w, out_b, direct)]
    for name, ok in zip(("output.weight", "output.bias", "direct.weights"), finite):
        if not ok:
            raise NLMFeatureError(f"ensemble weights {weights} make the ensemble's {name} "
                                  "overflow (NaN or infinite values): give weights of a "
                                  "sensible size (the default is the mean)")
    header = {k: v for k, v in h0.items() if k not in ("arrays", "storage", "precomputed")}
    header.update(order=order, embed_dim=E, combine="none", layers=[],
                  branches=[dict(br0, hidden=H, diagonal=diagonal,
                                 bias=any(h["branches"][0].get("bias") for _, h, _, _ in members))],
                  output={"type": "unnormalised", "dim": H})
    header.pop("direct", None)
    if direct_order:
        header["direct"] = {"order": direct_order, "hash_space": len(direct)}
    header["metadata"] = dict(
        estimator="ensemble", reverse=_reverse(h0),
        trained_by="nlmfeature ensemble",
        ensemble=[dict(path=os.path.abspath(p), checksum=ck, weight=alpha,
                       metadata=h.get("metadata", {}))
                  for (p, h, _, ck), alpha in zip(members, weights)])
    arrays: Dict[str, np.ndarray] = {name: np.asarray(a0[name]) for name in SHARED}
    arrays.update({"unigram": np.asarray(a0["unigram"], dtype=np.float32), "embeddings": emb,
                   "branch0.weights": W, "output.weight": out_w,
                   "output.bias": out_b.astype(np.float32)})
    if header["branches"][0]["bias"]:
        arrays["branch0.bias"] = bias
    if direct is not None:
        arrays["direct.weights"] = direct.astype(np.float32)
    return header, arrays


def _weigh(members, weights, widths, hiddens, diagonal, c, W, bias, out_w, out_b, direct) -> None:
    """Fill the ensemble's first layer, output layer and direct table from its members
    (in place)."""
    eo = ho = 0
    for (p, h, a, _), alpha, we, wh in zip(members, weights, widths, hiddens):
        ci = h["order"] - 1
        Wi = a["branch0.weights"].astype(np.float32)
        if diagonal:      # the nearest context word is the last position in every member
            W[c - ci:, eo:eo + we] = Wi
        elif h["branches"][0]["diagonal"]:
            for j in range(ci):
                W[c - ci + j, ho:ho + wh, eo:eo + we] = np.diag(Wi[j])
        else:
            W[c - ci:, ho:ho + wh, eo:eo + we] = Wi
        if h["branches"][0].get("bias"):
            bias[ho:ho + wh] = a["branch0.bias"]
        out_w[:, ho:ho + wh] = alpha * a["output.weight"].astype(np.float64)
        out_b += alpha * a["output.bias"].astype(np.float64)
        if h.get("direct"):
            direct += alpha * a["direct.weights"].astype(np.float64)
        eo += we
        ho += wh


def write_ensemble(out: str, paths: Sequence[str], weights: Optional[Sequence[float]] = None,
                   half: bool = False) -> str:
    """Write the ensemble of ``paths`` (:func:`merge`) to ``out`` atomically; returns its
    checksum."""
    header, arrays = merge(paths, weights)
    return modelfile.write_model(out, header, arrays, half=half)
