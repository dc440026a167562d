"""Model architectures: from a :class:`ModelSpec` to a model-file header and its arrays.

All three architectures share one shape, which the scorer computes:

    first layer:  h0 = combine_k f_k( b_k + sum_j M_{k,j} e(w_j) )   (k = lateral branches)
    extra layers: h_{i+1} = f_i(W_i h_i + b_i)
    output:       phi(w) = r_w . h + b_w   (+ direct n-gram features), then the output layer

* ``lbl``: one branch, M_j the OxLM context matrices C_j (full D x D or diagonal), no bias;
* ``nplm``: one branch, M_j the position blocks of W1, with bias and ReLU; optional second layer;
* ``lateral``: K branches side by side (Devlin et al. 2015), combined by max, add or mul.

The *precomputed tables* hold M_{k,j} e(w) for every word and position, so the first layer
costs n-1 vector additions.

A *joint model* (NNJM, Devlin et al. 2014) has ``source_window`` = w = 2m+1 > 0: its first
layer also sees the w source words around the target word's affiliated source position,
through a source vocabulary and embeddings of its own (``source.embeddings``).  Its
positions come first: M_{k,0..w-1} are the source positions, M_{k,w..w+n-2} the target
ones, and a full context is [w source ids | n-1 target ids].
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from nlmfeature.core.outputs import class_arrays, frequency_classes, huffman_tree
from nlmfeature.core.vocab import Vocabulary

Arrays = Dict[str, np.ndarray]


@dataclass
class ModelSpec:
    """What to build.  Field names follow OxLM's / NPLM's options where they mean the same."""

    arch: str = "lbl"                       #: lbl | nplm | lateral
    order: int = 5                          #: n of the n-gram model
    word_width: int = 100                   #: embedding dimension E
    hidden: int = 0                         #: first-layer width H (lbl: = E; 0 = default)
    diagonal_contexts: bool = False         #: lbl: diagonal context matrices
    activation: str = "identity"            #: first-layer activation (nplm/lateral: relu)
    hidden_layers: List[int] = field(default_factory=list)  #: widths of extra hidden layers
    layer_activation: str = ""              #: extra layers' activation ('' = as the first)
    branches: int = 1                       #: lateral: number of side-by-side layers
    combine: str = "none"                   #: lateral: max | add | mul
    output: str = "unnormalised"            #: unnormalised | softmax | class | tree
    classes: int = 0                        #: class output: number of classes
    direct_order: int = 0                   #: direct n-gram features: orders 1..N (0 = none)
    hash_space: int = 0                     #: direct features: size of the hashed store
    source_window: int = 0                  #: joint models: source words 2m+1 (0 = target-only)

    def normalised(self) -> "ModelSpec":
        """A copy with architecture defaults filled in and checked."""
        s = ModelSpec(**asdict(self))
        if s.arch not in ("lbl", "nplm", "lateral"):
            raise ValueError(f"unknown architecture {s.arch!r}")
        if s.arch == "lbl":
            s.hidden = s.word_width
            s.branches, s.combine = 1, "none"
        else:
            s.diagonal_contexts = False
            if s.hidden <= 0:
                s.hidden = 750 if s.arch == "nplm" else 500
            if s.activation == "identity":
                s.activation = "relu"
        if s.arch == "lateral":
            s.branches = max(2, s.branches)
            if s.combine == "none":
                s.combine = "max"
        else:
            s.branches, s.combine = 1, "none"
        if not s.layer_activation:
            s.layer_activation = s.activation
        if s.output == "class" and s.classes <= 0:
            raise ValueError("a class-factored output needs classes > 0 (or a class file)")
        if s.direct_order and s.hash_space <= 0:
            s.hash_space = 1 << 20
        if s.source_window and (s.source_window < 1 or s.source_window % 2 == 0 or s.source_window > 31):
            raise ValueError(f"the source window must be an odd number of words in 1..31, not {s.source_window}")
        if s.source_window and s.direct_order:
            raise ValueError("direct n-gram features are not supported in joint models")
        return s

    def header(self, vocab: Vocabulary, classes: int = 0, nodes: int = 0,
               source_vocab: Optional[Vocabulary] = None) -> Dict[str, Any]:
        """The model-file header for this spec (``classes``/``nodes`` of the output layer;
        ``source_vocab`` for a joint model)."""
        s = self.normalised()
        bias = s.arch != "lbl"
        branches = [{"hidden": s.hidden, "diagonal": bool(s.diagonal_contexts),
                     "activation": s.activation, "bias": bias} for _ in range(s.branches)]
        layers, width = [], s.hidden
        for n_out in s.hidden_layers:
            layers.append({"n_in": width, "n_out": int(n_out), "activation": s.layer_activation})
            width = int(n_out)
        output: Dict[str, Any] = {"type": s.output, "dim": width}
        if s.output == "class":
            output["classes"] = int(classes or s.classes)
        if s.output == "tree":
            output["nodes"] = int(nodes)
        if s.source_window and source_vocab is None:
            raise ValueError("a joint model (source_window > 0) needs a source vocabulary")
        source = None
        if s.source_window:
            source = {"window": s.source_window, "vocab_size": len(source_vocab),
                      "special": {"<unk>": source_vocab.unk, "<s>": source_vocab.bos,
                                  "</s>": source_vocab.eos, "<null>": source_vocab.null}}
        head = {
            "arch": s.arch, "order": s.order, "vocab_size": len(vocab), "embed_dim": s.word_width,
            "branches": branches, "combine": s.combine, "layers": layers, "output": output,
            "direct": {"order": s.direct_order, "hash_space": s.hash_space} if s.direct_order else None,
            "special": {"<unk>": vocab.unk, "<s>": vocab.bos, "</s>": vocab.eos, "<null>": vocab.null},
            "precomputed": False,
        }
        if source is not None:
            head["source"] = source
        return head


def output_structure(spec: ModelSpec, counts: np.ndarray,
                     class_of_word: Optional[np.ndarray] = None) -> Arrays:
    """Class or tree arrays for the output layer (frequency binning / Huffman by ``counts``)."""
    if spec.output == "class":
        if class_of_word is None:
            class_of_word = frequency_classes(counts, spec.classes)
        return class_arrays(class_of_word)
    if spec.output == "tree":
        return huffman_tree(counts)[1]
    return {}


def random_model(spec: ModelSpec, vocab: Vocabulary, counts: Optional[Sequence[float]] = None,
                 seed: int = 0, scale: float = 0.1, class_of_word: Optional[np.ndarray] = None,
                 source_vocab: Optional[Vocabulary] = None,
                 source_counts: Optional[Sequence[float]] = None) -> tuple:
    """(header, arrays) of a randomly initialised model: the start of training, and the
    models of the tests and benchmarks.  ``counts`` (per word id) fix the unigram
    distribution, the frequency classes and the Huffman tree (uniform when omitted).
    A joint model (``spec.source_window``) needs ``source_vocab`` (``source_counts``: its
    unigram distribution, uniform when omitted)."""
    s = spec.normalised()
    rng = np.random.default_rng(seed)
    V, E, H, c = len(vocab), s.word_width, s.hidden, s.order - 1
    cnt = np.ones(V) if counts is None else np.asarray(counts, dtype=np.float64)
    structure = output_structure(s, cnt, class_of_word)
    n_classes = int(structure["class.start"].shape[0] - 1) if s.output == "class" else 0
    n_nodes = 0
    if s.output == "tree":
        n_nodes = int(structure["tree.path_node"].max()) + 1 if len(structure["tree.path_node"]) else 1
    header = s.header(vocab, classes=n_classes, nodes=n_nodes, source_vocab=source_vocab)
    w = s.source_window

    def rand(*shape: int, fan_in: Optional[int] = None) -> np.ndarray:
        sd = scale if fan_in is None else 1.0 / np.sqrt(fan_in)
        return rng.normal(0.0, sd, size=shape).astype(np.float32)

    arrays: Arrays = {"unigram": (cnt / cnt.sum()).astype(np.float32), "embeddings": rand(V, E)}
    if w:
        scnt = np.ones(len(source_vocab)) if source_counts is None else np.asarray(source_counts, np.float64)
        arrays["source.unigram"] = (scnt / scnt.sum()).astype(np.float32)
        arrays["source.embeddings"] = rand(len(source_vocab), E)
        arrays.update({"source." + n: a for n, a in source_vocab.to_arrays().items()})
    for k, br in enumerate(header["branches"]):
        if br["diagonal"]:
            arrays[f"branch{k}.weights"] = (1.0 + rand(w + c, E)).astype(np.float32)
        else:
            arrays[f"branch{k}.weights"] = rand(w + c, H, E, fan_in=E * max(w + c, 1))
        if br["bias"]:
            arrays[f"branch{k}.bias"] = rand(H)
    for k, ly in enumerate(header["layers"]):
        arrays[f"layer{k}.weight"] = rand(ly["n_out"], ly["n_in"], fan_in=ly["n_in"])
        arrays[f"layer{k}.bias"] = rand(ly["n_out"])
    D = header["output"]["dim"]
    arrays["output.weight"] = rand(V, D, fan_in=D)
    arrays["output.bias"] = np.log(arrays["unigram"] + 1e-9).astype(np.float32)
    if s.output == "class":
        arrays["class.weight"] = rand(n_classes, D, fan_in=D)
        arrays["class.bias"] = rand(n_classes)
    if s.output == "tree":
        arrays["tree.weight"] = rand(n_nodes, D, fan_in=D)
        arrays["tree.bias"] = rand(n_nodes)
    if s.direct_order:
        arrays["direct.weights"] = rand(s.hash_space)
    arrays.update(structure)
    arrays.update(vocab.to_arrays())
    set_null_embedding(arrays, vocab)
    return header, arrays


def set_null_embedding(arrays: Arrays, vocab: Vocabulary, own: bool = False) -> None:
    """Make ``<null>``'s input embedding the unigram-weighted average of the others
    (Vaswani et al. 2013): ``arrays`` gets a copy of the embeddings with that row set, or, with
    ``own``, the row is set in the embeddings themselves where they are a writable float32
    array (no copy)."""
    tables = [("", vocab)]
    if "source.embeddings" in arrays:  # joint models: the source <null> likewise
        tables.append(("source.", Vocabulary.from_arrays(arrays["source.vocab.offsets"],
                                                         arrays["source.vocab.bytes"])))
    for prefix, v in tables:
        p = np.asarray(arrays[prefix + "unigram"], dtype=np.float64).copy()
        p[[v.null, v.bos]] = 0.0
        if p.sum() <= 0:
            p[:] = 1.0
        emb = arrays[prefix + "embeddings"]
        if not (own and isinstance(emb, np.ndarray) and emb.dtype == np.float32 and emb.flags.writeable):
            emb = np.array(emb, dtype=np.float32)
        p /= p.sum()
        mean = np.zeros(emb.shape[1], dtype=np.float64)
        for s in range(0, len(emb), 8192):  # in float64, a block of rows at a time
            mean += p[s:s + 8192] @ emb[s:s + 8192].astype(np.float64)
        emb[v.null] = mean
        arrays[prefix + "embeddings"] = emb


def precompute_tables(header: Dict[str, Any], arrays: Arrays, diagonal: bool = False) -> None:
    """Add ``branch{k}.tables`` = M_{k,j} e(w) for every position j and word w, in place.

    Diagonal branches are skipped unless ``diagonal``: their table row is the elementwise
    product c_j * e(w), the same arithmetic as the direct form, but the lookups then touch
    n-1 tables instead of one embedding matrix (measured 40% slower on Brown, D=200).
    """
    E = header["embed_dim"]
    emb = np.asarray(arrays["embeddings"], dtype=np.float32)
    c = header["order"] - 1
    w = int(header["source"]["window"]) if header.get("source") else 0
    for k, br in enumerate(header["branches"]):
        if br["diagonal"] and not diagonal:
            arrays.pop(f"branch{k}.tables", None)
            arrays.pop(f"branch{k}.source.tables", None)
            continue
        W = np.asarray(arrays[f"branch{k}.weights"], dtype=np.float32)
        T = np.empty((c, emb.shape[0], br["hidden"]), dtype=np.float32)
        for j in range(c):
            T[j] = emb * W[w + j] if br["diagonal"] else emb @ W[w + j].T
        arrays[f"branch{k}.tables"] = T
        if w:  # joint models: the source positions (the first w matrices)
            semb = np.asarray(arrays["source.embeddings"], dtype=np.float32)
            S = np.empty((w, semb.shape[0], br["hidden"]), dtype=np.float32)
            for j in range(w):
                S[j] = semb * W[j] if br["diagonal"] else semb @ W[j].T
            arrays[f"branch{k}.source.tables"] = S
    assert E == emb.shape[1]
    header["precomputed"] = all(f"branch{k}.tables" in arrays for k in range(len(header["branches"])))


def drop_tables(header: Dict[str, Any], arrays: Arrays) -> None:
    """Remove precomputed tables (smaller file; slower first layer), in place."""
    for k in range(len(header["branches"])):
        arrays.pop(f"branch{k}.tables", None)
        arrays.pop(f"branch{k}.source.tables", None)
    header["precomputed"] = False
