"""Structures of the factored output layers: word classes and Huffman trees.

Class partitions are stored as ``class.of_word`` / ``class.start`` / ``class.members``;
trees as per-word paths of (node, sign) pairs, where a step to the child coded 1 has
probability sigmoid(u_node . h + b_node) and sign +1, a step to the child coded 0 sign -1.
"""
from __future__ import annotations

import heapq
from typing import Dict, Sequence, Tuple

import numpy as np


def frequency_classes(counts: Sequence[float], n_classes: int) -> np.ndarray:
    """Frequency binning (Mikolov et al. 2011): class of each word, classes holding about
    equal shares of the (square-root) unigram mass, the most frequent words in class 0.

    ``counts`` is indexed by word id; returns ``class_of_word`` (int32).  Every class is
    non-empty.
    """
    counts = np.asarray(counts, dtype=np.float64)
    V = len(counts)
    if not 1 <= n_classes <= V:
        raise ValueError(f"cannot make {n_classes} classes over {V} words")
    order = np.argsort(-counts, kind="stable")
    mass = np.sqrt(np.maximum(counts[order], 0) + 1e-12)
    cum = np.cumsum(mass) / mass.sum()
    cls = np.minimum((cum * n_classes - 1e-9).astype(np.int64), n_classes - 1)
    # make classes non-empty and monotone: class k starts no earlier than rank k
    for rank in range(V):
        lo = max(0, n_classes - (V - rank))  # enough words must remain for later classes
        hi = min(rank, n_classes - 1)
        prev = cls[rank - 1] if rank else -1
        c = min(max(cls[rank], lo, prev), hi, prev + 1)
        cls[rank] = c
    out = np.empty(V, dtype=np.int32)
    out[order] = cls
    return out


def class_arrays(class_of_word: np.ndarray) -> Dict[str, np.ndarray]:
    """``class.of_word``, ``class.start`` and ``class.members`` arrays for a partition."""
    cw = np.asarray(class_of_word, dtype=np.int32)
    C = int(cw.max()) + 1
    sizes = np.bincount(cw, minlength=C)
    if np.any(sizes == 0):
        raise ValueError(f"classes {np.flatnonzero(sizes == 0)[:5].tolist()} have no words")
    start = np.zeros(C + 1, dtype=np.int32)
    np.cumsum(sizes, out=start[1:])
    members = np.argsort(cw, kind="stable").astype(np.int32)
    return {"class.of_word": cw, "class.start": start, "class.members": members}


def huffman_tree(counts: Sequence[float]) -> Tuple[int, Dict[str, np.ndarray]]:
    """Binary Huffman tree over the words; returns (number of inner nodes, path arrays).

    Frequent words get short paths.  With one word the path is empty (probability 1).
    """
    counts = np.asarray(counts, dtype=np.float64)
    V = len(counts)
    heap = [(float(c), i, i) for i, c in enumerate(counts)]  # (weight, tiebreak, node)
    heapq.heapify(heap)
    parent = np.full(2 * V, -1, dtype=np.int64)
    code = np.zeros(2 * V, dtype=np.int8)
    nxt = V
    while len(heap) > 1:
        w0, _, a = heapq.heappop(heap)
        w1, _, b = heapq.heappop(heap)
        parent[a], code[a] = nxt, 0
        parent[b], code[b] = nxt, 1
        heapq.heappush(heap, (w0 + w1, nxt, nxt))
        nxt += 1
    n_inner = nxt - V
    root = nxt - 1
    starts = np.zeros(V + 1, dtype=np.int64)
    nodes, signs = [], []
    for w in range(V):
        path = []
        x = w
        while x != root and parent[x] >= 0:
            path.append((int(parent[x]) - V, 1 if code[x] else -1))
            x = parent[x]
        path.reverse()
        nodes.extend(p[0] for p in path)
        signs.extend(p[1] for p in path)
        starts[w + 1] = len(nodes)
    return n_inner, {"tree.path_start": starts, "tree.path_node": np.asarray(nodes, dtype=np.int32),
                     "tree.path_sign": np.asarray(signs, dtype=np.int8)}
