"""A plain numpy reference implementation of every model, written from the maths in
``nlmfeature/core/architecture.py`` and independent of the package's scorer code: float64,
no precomputed tables, one n-gram at a time, explicit loops over the output layer."""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def direct_index(ctx: Sequence[int], target: int, kind: int, k: int, space: int) -> int:
    """Index of the direct feature (last k context words, target) as docs/model-format.md says."""
    state = splitmix64(kind)
    for i in range(1, k + 1):
        state = splitmix64(state ^ ctx[len(ctx) - i])
    return splitmix64(state ^ (target << 32)) % space


def act(name: str, x: np.ndarray) -> np.ndarray:
    return {"identity": lambda v: v, "relu": lambda v: np.maximum(v, 0),
            "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh,
            "hardtanh": lambda v: np.clip(v, -1, 1)}[name](x)


def pad(header: Dict, history: List[int]) -> List[int]:
    """The specification of context padding."""
    c = header["order"] - 1
    sp = header["special"]
    hist = list(history)[-c:] if c else []
    fill = sp["<s>"] if hist and hist[0] == sp["<s>"] else sp["<null>"]
    return [fill] * (c - len(hist)) + hist


def hidden(header: Dict, a: Dict[str, np.ndarray], ctx: Sequence[int]) -> np.ndarray:
    E = np.asarray(a["embeddings"], np.float64)
    outs = []
    for k, br in enumerate(header["branches"]):
        W = np.asarray(a[f"branch{k}.weights"], np.float64)
        v = np.zeros(br["hidden"])
        if br.get("bias"):
            v += a[f"branch{k}.bias"]
        for j, w in enumerate(ctx):
            v += W[j] * E[w] if br["diagonal"] else W[j] @ E[w]
        outs.append(act(br["activation"], v))
    h = outs[0]
    for v in outs[1:]:
        h = {"max": np.maximum(h, v), "add": h + v, "mul": h * (v + 1)}[header["combine"]]
    for k, ly in enumerate(header["layers"]):
        h = act(ly["activation"], np.asarray(a[f"layer{k}.weight"], np.float64) @ h + a[f"layer{k}.bias"])
    return h


#: logits beyond this magnitude have no float32 resolution left for the scores computed from
#: them (an ulp of 1e8 in float32 is 8): the reference then gives no verdict (NaN)
RESOLVABLE = 1e6


def logprob(header: Dict, a: Dict[str, np.ndarray], history: List[int], word: int) -> float:
    """Natural-log score of ``word`` after ``history`` (unpadded ids, oldest first); NaN when a
    logit it is computed from exceeds :data:`RESOLVABLE` (fuzzed weights of 1e20-1e30: the
    score is then a difference of huge numbers that float32 and float64 round differently)."""
    v = _logprob(header, a, history, word)
    return float("nan") if _LARGEST[0] > RESOLVABLE else v


_LARGEST = [0.0]


def _seen(x):
    """Record the magnitude of logits (largest of this call) and pass them through."""
    _LARGEST[0] = max(_LARGEST[0], float(np.max(np.abs(x))) if np.size(x) else 0.0)
    return x


def _logprob(header: Dict, a: Dict[str, np.ndarray], history: List[int], word: int) -> float:
    _LARGEST[0] = 0.0
    ctx = pad(header, history)
    h = hidden(header, a, ctx)
    R = np.asarray(a["output.weight"], np.float64)
    b = np.asarray(a["output.bias"], np.float64)
    d = header.get("direct")

    def direct(target: int, kind: int) -> float:
        if not d:
            return 0.0
        return float(sum(a["direct.weights"][direct_index(ctx, target, kind, k, d["hash_space"])]
                         for k in range(d["order"])))

    def word_logit(w: int) -> float:
        return _seen(float(R[w] @ h + b[w]) + direct(w, 0))

    def word_logits(ws: np.ndarray) -> np.ndarray:
        """word_logit of every id in ``ws`` (the products as one float64 matrix-vector product)."""
        z = R[ws] @ h + b[ws]
        if d:
            z = z + np.array([direct(int(w), 0) for w in ws])
        return _seen(z)

    out = header["output"]["type"]
    if out == "unnormalised":
        return word_logit(word)
    if out == "softmax":
        z = word_logits(np.arange(header["vocab_size"]))
        return word_logit(word) - float(np.log(np.exp(z - z.max()).sum()) + z.max())
    if out == "class":
        cw = a["class.of_word"]
        c = int(cw[word])
        cl = _seen(np.array([float(a["class.weight"][k] @ h + a["class.bias"][k]) + direct(k, 1)
                             for k in range(header["output"]["classes"])]))
        wl = word_logits(np.flatnonzero(np.asarray(cw)[:header["vocab_size"]] == c))
        lse = lambda x: float(np.log(np.exp(x - x.max()).sum()) + x.max())
        return float(cl[c] - lse(cl) + word_logit(word) - lse(wl))
    # tree
    s = 0.0
    for p in range(a["tree.path_start"][word], a["tree.path_start"][word + 1]):
        node = a["tree.path_node"][p]
        x = _seen(float(a["tree.weight"][node] @ h + a["tree.bias"][node]) * a["tree.path_sign"][p])
        s += -np.log1p(np.exp(-x))
    return s
