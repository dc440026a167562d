"""The nlmfeature model file: read, write and validate (spec: ``docs/model-format.md``).

Layout: a 64-byte preamble (magic, format version, header position and length, file
length, checksum), a UTF-8 JSON header describing the architecture and the array table,
then the arrays, each little-endian and 64-byte aligned.  The checksum (BLAKE2b, 8 bytes)
covers every byte after the preamble.  Files are memory-mapped read-only, so decoder
threads and processes share one copy in the page cache; verification reads the file through
its descriptor, and the scorer's own copies let the mapped pages they came from go
(:func:`release_pages`).  Nothing is ever pickled.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import struct
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

import numpy as np

from nlmfeature.io.atomicfile import atomic_open
from nlmfeature.errors import ModelFileError

MAGIC = b"NLMFEAT\x00"
#: version written for joint models (a source vocabulary and window: an older reader would
#: misread their branch weights); target-only models are still written as version 1
FORMAT_VERSION = 2
#: versions this reader accepts
READ_VERSIONS = (1, 2)
#: widest source window of a joint model (NLM_MAX_WINDOW of the scorer)
MAX_SOURCE_WINDOW = 31
PREAMBLE = struct.Struct("<8sIIQQQ8s16s")  # magic, version, flags, hdr off, hdr len, file len, checksum, pad
PREAMBLE_SIZE = 64
ALIGN = 64
assert PREAMBLE.size == PREAMBLE_SIZE

ARCHS = ("lbl", "nplm", "lateral")
OUTPUT_TYPES = ("unnormalised", "softmax", "class", "tree")
ACTIVATION_NAMES = ("identity", "sigmoid", "relu", "tanh", "hardtanh")
COMBINE_NAMES = ("none", "max", "add", "mul")
#: arrays that may be stored as float16 (``storage: float16``): read as stored by the scorer
#: where it has a half path for them, widened to float32 at load otherwise
HALF_ELIGIBLE = ("embeddings", "source.embeddings", "output.weight", "direct.weights", "tables")

Header = Dict[str, Any]
Arrays = Dict[str, np.ndarray]


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


#: the native scorer's limits (``NLM_MAX_ORDER``, ``NLM_MAX_BRANCHES``, ``NLM_MAX_LAYERS`` in
#: ``cython/nlmfeature/_scorer.pxd``): a model beyond them cannot be loaded, so it is not written
MAX_ORDER = 16
MAX_BRANCHES = 8
MAX_LAYERS = 8
#: largest vocabulary, width or class/node count (ids and sizes are int32 in the scorer)
MAX_INT32 = (1 << 31) - 1
#: fixed ids of the special tokens in every model (``nlmfeature.h``: NLM_UNK .. NLM_NULL)
SPECIAL_IDS = {"<unk>": 0, "<s>": 1, "</s>": 2, "<null>": 3}


def _int(d: Mapping[str, Any], key: str, where: str, lo: int = 1, hi: int = MAX_INT32) -> int:
    """``d[key]`` as an int in [lo, hi]; JSON numbers only (no strings, booleans or floats)."""
    if key not in d:
        raise ValueError(f"{where} lacks {key!r}")
    v = d[key]
    if type(v) is not int:
        raise ValueError(f"{where}{key!r} is {v!r}, not an integer")
    if not lo <= v <= hi:
        raise ValueError(f"{where}{key!r} is {v}, outside {lo}..{hi}")
    return v


def _choice(d: Mapping[str, Any], key: str, where: str, choices: Tuple[str, ...], default=None) -> str:
    v = d.get(key, default)
    if not isinstance(v, str) or v not in choices:
        raise ValueError(f"{where}unknown {key} {v!r} (known: {', '.join(choices)})")
    return v


def _obj(v: Any, what: str) -> Dict[str, Any]:
    if not isinstance(v, dict):
        raise ValueError(f"{what} is {type(v).__name__}, not a JSON object")
    return v


def check_header(h: Any) -> None:
    """Check the types and ranges of every architecture field of a header (not the arrays).

    Raises :class:`ValueError` saying which field is wrong.  Numbers must be JSON integers
    (``"order": "4"`` is refused), objects objects and lists lists, so that nothing later
    (the scorer, the C library) meets a type it does not expect.
    """
    _obj(h, "the header")
    for key in ("arch", "order", "vocab_size", "embed_dim", "branches", "layers", "output", "special"):
        if key not in h:
            raise ValueError(f"header lacks {key!r}")
    if not isinstance(h["arch"], str) or h["arch"] not in ARCHS:
        raise ValueError(f"unknown architecture {h['arch']!r} (known: {', '.join(ARCHS)})")
    n = _int(h, "order", "", 1, MAX_ORDER)
    _int(h, "vocab_size", "", 4)
    _int(h, "embed_dim", "")
    branches = h["branches"]
    if not isinstance(branches, list) or not 1 <= len(branches) <= MAX_BRANCHES:
        raise ValueError(f"'branches' must be a list of 1..{MAX_BRANCHES} first-layer branches")
    for k, br in enumerate(branches):
        where = f"branch {k}: "
        _obj(br, f"branch {k}")
        _int(br, "hidden", where)
        _choice(br, "activation", where, ACTIVATION_NAMES)
        for flag in ("diagonal", "bias"):
            if type(br.get(flag, False)) is not bool:
                raise ValueError(f"{where}{flag!r} is {br.get(flag)!r}, not true or false")
        if "diagonal" not in br:
            raise ValueError(f"{where}lacks 'diagonal'")
    _choice(h, "combine", "", COMBINE_NAMES, "none")
    layers = h["layers"]
    if not isinstance(layers, list) or len(layers) > MAX_LAYERS:
        raise ValueError(f"'layers' must be a list of at most {MAX_LAYERS} hidden layers")
    for k, ly in enumerate(layers):
        where = f"layer {k}: "
        _obj(ly, f"layer {k}")
        _int(ly, "n_in", where)
        _int(ly, "n_out", where)
        _choice(ly, "activation", where, ACTIVATION_NAMES)
    o = _obj(h["output"], "'output'")
    if not isinstance(o.get("type"), str) or o["type"] not in OUTPUT_TYPES:
        raise ValueError(f"unknown output layer {o.get('type')!r} (known: {', '.join(OUTPUT_TYPES)})")
    _int(o, "dim", "output layer: ")
    if o["type"] == "class":
        _int(o, "classes", "output layer: ")
    elif o["type"] == "tree":
        _int(o, "nodes", "output layer: ")
    d = h.get("direct")
    if d is not None:
        _obj(d, "'direct'")
        _int(d, "order", "direct features: ", 1, n)
        _int(d, "hash_space", "direct features: ", 1, 1 << 62)
    if type(h.get("precomputed", False)) is not bool:
        raise ValueError(f"'precomputed' is {h.get('precomputed')!r}, not true or false")
    sp = _obj(h["special"], "'special'")
    for tok, want in SPECIAL_IDS.items():
        if sp.get(tok) != want or type(sp.get(tok)) is not int:
            raise ValueError(f"special token {tok} has id {sp.get(tok)!r}; every model has "
                             f"<unk> <s> </s> <null> at ids 0-3 (re-import or re-write the model)")
    src = h.get("source")
    if src is not None:  # joint models: a source vocabulary and window
        where = "source: "
        _obj(src, "'source'")
        w = _int(src, "window", where, 1, MAX_SOURCE_WINDOW)
        if w % 2 == 0:
            raise ValueError(f"source window {w} is not an odd number (2m+1)")
        _int(src, "vocab_size", where, 4)
        ssp = _obj(src.get("special"), "the source 'special'")
        for tok, want in SPECIAL_IDS.items():
            if ssp.get(tok) != want or type(ssp.get(tok)) is not int:
                raise ValueError(f"source special token {tok} has id {ssp.get(tok)!r}; the source "
                                 "vocabulary has <unk> <s> </s> <null> at ids 0-3")
        if h.get("direct"):
            raise ValueError("direct n-gram features are not supported in joint models")
        if n + w > MAX_ORDER + MAX_SOURCE_WINDOW:
            raise ValueError("the source window and order are too large")


def expected_arrays(h: Header) -> Dict[str, Tuple[str, Tuple[int, ...], bool]]:
    """Name -> (dtype, shape, required) of every array a header implies.

    Raises :class:`ValueError` when the header itself is malformed or inconsistent.
    """
    check_header(h)
    n, V, E = h["order"], h["vocab_size"], h["embed_dim"]
    c = n - 1
    f4 = "<f4"
    out: Dict[str, Tuple[str, Tuple[int, ...], bool]] = {
        "vocab.offsets": ("<i8", (V + 1,), True),
        "vocab.hash": ("<i4", (-1,), True),
        "vocab.bytes": ("|u1", (-1,), True),
        "unigram": (f4, (V,), True),
        "embeddings": (f4, (V, E), True),
    }
    src = h.get("source")
    w = 0  # joint models: source-window positions, first in the branch weights
    if src is not None:
        w, Vs = int(src["window"]), int(src["vocab_size"])
        out.update({"source.vocab.offsets": ("<i8", (Vs + 1,), True),
                    "source.vocab.hash": ("<i4", (-1,), True),
                    "source.vocab.bytes": ("|u1", (-1,), True),
                    "source.unigram": (f4, (Vs,), True),
                    "source.embeddings": (f4, (Vs, E), True)})
    branches = h["branches"]
    H = int(branches[0]["hidden"])
    for k, br in enumerate(branches):
        if int(br["hidden"]) != H:
            raise ValueError("all first-layer branches must have the same width")
        if br["diagonal"]:
            if H != E:
                raise ValueError(f"branch {k}: a diagonal context matrix needs hidden == embed_dim")
            out[f"branch{k}.weights"] = (f4, (w + c, E), True)
        else:
            out[f"branch{k}.weights"] = (f4, (w + c, H, E), True)
        out[f"branch{k}.bias"] = (f4, (H,), bool(br.get("bias", False)))
        out[f"branch{k}.tables"] = (f4, (c, V, H), bool(h.get("precomputed", False)))
        if src is not None:
            out[f"branch{k}.source.tables"] = (f4, (w, Vs, H), bool(h.get("precomputed", False)))
    if len(branches) > 1 and h.get("combine", "none") == "none":
        raise ValueError("several branches need a combination (max, add or mul)")
    width = H
    for k, ly in enumerate(h["layers"]):
        if int(ly["n_in"]) != width:
            raise ValueError(f"layer {k} takes {ly['n_in']} inputs but receives {width}")
        width = int(ly["n_out"])
        out[f"layer{k}.weight"] = (f4, (width, int(ly["n_in"])), True)
        out[f"layer{k}.bias"] = (f4, (width,), True)
    o = h["output"]
    D = int(o["dim"])
    if D != width:
        raise ValueError(f"output layer takes {D} inputs but the network gives {width}")
    out["output.weight"] = (f4, (V, D), True)
    out["output.bias"] = (f4, (V,), True)
    if o["type"] == "class":
        C = int(o["classes"])
        if not 1 <= C <= V:
            raise ValueError(f"bad number of classes {C}")
        out.update({"class.weight": (f4, (C, D), True), "class.bias": (f4, (C,), True),
                    "class.of_word": ("<i4", (V,), True), "class.start": ("<i4", (C + 1,), True),
                    "class.members": ("<i4", (V,), True)})
    elif o["type"] == "tree":
        N = int(o["nodes"])
        out.update({"tree.weight": (f4, (N, D), True), "tree.bias": (f4, (N,), True),
                    "tree.path_start": ("<i8", (V + 1,), True), "tree.path_node": ("<i4", (-1,), True),
                    "tree.path_sign": ("|i1", (-1,), True)})
    d = h.get("direct")
    if d:
        if o["type"] not in ("unnormalised", "softmax", "class"):
            raise ValueError("direct features go with unnormalised, softmax or class outputs")
        out["direct.weights"] = (f4, (int(d["hash_space"]),), True)
    return out


def _check_array(name: str, arr: np.ndarray, dtype: str, shape: Tuple[int, ...]) -> None:
    if len(shape) != arr.ndim or any(s != -1 and s != a for s, a in zip(shape, arr.shape)):
        want = tuple("*" if s == -1 else s for s in shape)
        raise ValueError(f"array {name!r} has shape {arr.shape}, expected {want}")
    want_dt = np.dtype(dtype)
    if want_dt.kind != arr.dtype.kind or (want_dt.kind != "f" and want_dt.itemsize != arr.dtype.itemsize):
        raise ValueError(f"array {name!r} has type {arr.dtype}, expected {want_dt}")


def _check_vocabulary(V: int, arrays: Mapping[str, np.ndarray], prefix: str = "") -> None:
    """Offsets, UTF-8 words (non-empty, no white space, unique, the specials at 0-3) and the
    lookup table the C library probes (rebuilt and compared: a wrong, full or oddly sized
    table would send ``nlm_word_id`` out of bounds or round in circles)."""
    from nlmfeature._scorer import vocab_hash_table
    from nlmfeature.core.vocab import Vocabulary

    what = "source vocabulary" if prefix else "vocabulary"
    offs, data = arrays[prefix + "vocab.offsets"], arrays[prefix + "vocab.bytes"]
    if offs[0] != 0 or np.any(offs[1:] <= offs[:-1]) or offs[-1] != len(data):
        raise ValueError(f"{what} offsets are inconsistent")
    words = Vocabulary.from_arrays(offs, data).words  # UTF-8, white space, duplicates
    for tok, wid in SPECIAL_IDS.items():
        if words[wid] != tok:
            raise ValueError(f"{what} entry {wid} is {words[wid]!r}, not {tok}")
    table = arrays[prefix + "vocab.hash"]
    rebuilt = vocab_hash_table(np.ascontiguousarray(offs, dtype=np.int64),
                               np.ascontiguousarray(data, dtype=np.uint8))
    if table.shape != rebuilt.shape or not np.array_equal(table, rebuilt):
        raise ValueError(f"{prefix}vocab.hash ({len(table)} slots) is not the lookup table of the {what} "
                         f"({len(rebuilt)} slots); re-write the model with nlmfeature")


def _check_classes(V: int, C: int, arrays: Mapping[str, np.ndarray]) -> None:
    """An exact partition: every class non-empty, members listed class by class in ascending
    id order (the scorer reads a class of consecutive ids as one block of the output matrix)."""
    wc, st, mem = arrays["class.of_word"], arrays["class.start"], arrays["class.members"]
    # comparisons, not np.diff: a difference of int32 file values can wrap round and pass
    if wc.min() < 0 or wc.max() >= C or st[0] != 0 or st[-1] != V or np.any(st[1:] <= st[:-1]):
        raise ValueError("class arrays are inconsistent (every class needs at least one word)")
    if mem.min() < 0 or mem.max() >= V or np.any(wc[mem] != np.repeat(np.arange(C), np.diff(st.astype(np.int64)))):
        raise ValueError("class.members is not the partition given by class.of_word")
    step = np.diff(mem.astype(np.int64))
    inner = np.ones(V - 1, dtype=bool)
    inner[st[1:-1] - 1] = False  # steps from one class to the next
    if np.any(step[inner] <= 0):
        raise ValueError("class.members does not list each class's words once, in ascending id order")


def _check_tree(V: int, N: int, arrays: Mapping[str, np.ndarray]) -> None:
    """The paths describe one full binary tree with the V words as leaves: one root, each
    (node, direction) step leads to one child, every inner node has both children and one
    parent.  Then the leaf probabilities sum to one."""
    ps, pn, sg = arrays["tree.path_start"], arrays["tree.path_node"], arrays["tree.path_sign"]
    if ps[0] != 0 or ps[-1] != len(pn) or len(sg) != len(pn) or np.any(ps[1:] <= ps[:-1]):
        raise ValueError("tree path arrays are inconsistent (every word needs a path)")
    if pn.min() < 0 or pn.max() >= N or not np.all(np.abs(sg.astype(np.int16)) == 1):
        raise ValueError("tree paths name nodes outside the tree or signs other than +-1")
    starts, ends = ps[:-1], ps[1:]
    root = pn[starts[0]]
    if np.any(pn[starts] != root):
        raise ValueError("tree paths do not all start at the same root")
    # step (node, direction) -> where it leads: the next node, or -1-w for word w's leaf
    key = pn.astype(np.int64) * 2 + (sg > 0)
    child = np.empty(len(pn), dtype=np.int64)
    child[:-1] = pn[1:]
    child[ends - 1] = -1 - np.arange(V)
    none = np.iinfo(np.int64).min
    table = np.full(2 * N, none, dtype=np.int64)
    table[key] = child
    if np.any(table[key] != child):
        raise ValueError("tree paths disagree: one step leads to two different places")
    used = np.zeros(N, dtype=bool)
    used[pn] = True
    if np.any((table[0::2] != none) != used) or np.any((table[1::2] != none) != used):
        raise ValueError("tree paths do not form a full binary tree (an inner node lacks a child)")
    kids = table[table >= 0]
    parents = np.bincount(kids, minlength=N)
    want = used.astype(np.int64)
    want[root] = 0
    if not np.array_equal(parents, want):
        raise ValueError("tree paths do not form a tree (a node with two parents, a cycle, or "
                         "a node without a parent)")


def _check_tables(h: Header, arrays: Mapping[str, np.ndarray]) -> None:
    """Precomputed first-layer tables equal their definition, ``tables[j][w] = M_j e(w)``,
    checked in one pass over the tables with a random projection (Freivalds): for a fixed
    random vector r, ``tables[j] r`` must equal ``E (M_j^T r)`` row by row, to float
    rounding.  Any entry changed by more than rounding shows (with probability ~1); the cost
    is one read of the tables, a fraction of the checksum's."""
    half = h.get("storage") == "float16"
    rng = np.random.default_rng(12345)
    w = int(h["source"]["window"]) if h.get("source") is not None else 0
    for k, br in enumerate(h["branches"]):
        # target tables use the weights after the w source positions (joint models)
        for name, E, first in ((f"branch{k}.source.tables", arrays.get("source.embeddings"), 0),
                               (f"branch{k}.tables", arrays["embeddings"], w)):
            _check_table(name, arrays.get(name), E, arrays[f"branch{k}.weights"][first:],
                         br["diagonal"], half, rng)


def _check_table(name: str, t: Optional[np.ndarray], E: np.ndarray, W: np.ndarray,
                 diagonal: bool, half: bool, rng: np.random.Generator) -> None:
    """One precomputed table against its embeddings and context matrices (see
    :func:`_check_tables`)."""
    if t is None:
        return
    H = t.shape[2]
    r = rng.standard_normal(H).astype(np.float32)
    absE = np.abs(E)
    for j in range(t.shape[0]):
        lhs = t[j] @ r
        if diagonal:
            rhs = E @ (W[j] * r)
            bound = absE @ np.abs(W[j] * r)
        else:
            rhs = E @ (W[j].T @ r)
            bound = absE @ (np.abs(W[j]).T @ np.abs(r))
        tol = ((H + 16) * 1.2e-7 + (2e-3 if half else 0.0)) * bound + 1e-30
        with np.errstate(invalid="ignore", over="ignore"):
            fin_l, fin_r = np.isfinite(lhs), np.isfinite(rhs) & np.isfinite(tol)
            ok = (fin_l & fin_r & (np.abs(lhs.astype(np.float64) - rhs) <= tol)) | (~fin_l & ~fin_r)
        if not np.all(ok):
            w = int(np.flatnonzero(~ok)[0])
            raise ValueError(f"{name}[{j}] does not match the embeddings and weights "
                             f"(word {w} first); convert the model again to recompute them")


def validate_structure(h: Header, arrays: Mapping[str, np.ndarray], strict: bool = True) -> None:
    """Check the whole model: header types, arrays against the header (shapes, types), the
    vocabulary and its lookup table, the class partition or tree, index ranges.  After it,
    native code may trust every array.  ``strict`` also refuses arrays the header does not
    imply (readers ignore them instead).  Raises :class:`ValueError` saying what is wrong."""
    spec = expected_arrays(h)
    for name, (dtype, shape, required) in spec.items():
        if name not in arrays:
            if required:
                raise ValueError(f"array {name!r} is missing")
            continue
        if not required:  # an optional array (bias, tables) the header says is absent
            raise ValueError(f"array {name!r} is present but the header says the model has none "
                             "('bias' / 'precomputed' is false)")
        _check_array(name, arrays[name], dtype, shape)
    extra = set(arrays) - set(spec)
    if extra and strict:
        raise ValueError(f"unexpected arrays {sorted(extra)}")
    V = int(h["vocab_size"])
    _check_vocabulary(V, arrays)
    if h.get("source") is not None:
        _check_vocabulary(int(h["source"]["vocab_size"]), arrays, "source.")
    out = h["output"]
    if out["type"] == "class":
        _check_classes(V, int(out["classes"]), arrays)
    elif out["type"] == "tree":
        _check_tree(V, int(out["nodes"]), arrays)
    _check_tables(h, arrays)


def check_finite(name: str, stored: np.ndarray) -> None:
    """Raise :class:`ValueError` if the float array ``name``, as stored (float32 or float16:
    they overflow where float64 did not), holds a NaN or an infinity: a model made of them
    scores NaN."""
    if stored.dtype.kind != "f" or not stored.size:
        return
    flat = stored.reshape(-1)
    step = 1 << 22          # (bounded memory for the mask of a big array)
    if all(np.isfinite(flat[a:a + step]).all() for a in range(0, flat.size, step)):
        return
    raise _not_finite(name, int(flat.size - np.count_nonzero(np.isfinite(flat))), stored.dtype)


def _not_finite(name: str, bad: int, dtype: np.dtype) -> ValueError:
    return ValueError(f"array {name!r} holds {bad} NaN or infinite value(s) as "
                      f"{np.dtype(dtype).name}: the model would score NaN")


def write_model(path: str, header: Header, arrays: Mapping[str, np.ndarray],
                half: bool = False) -> str:
    """Write a model file atomically (temporary file + rename).  Returns the checksum (hex).

    ``half=True`` stores the big float tables (embeddings, output weights, precomputed
    tables) as float16; they are widened to float32 when the file is loaded (and the scorer
    reads the embeddings and output rows as halves where the build has F16C: the same scores).
    """
    header = json.loads(json.dumps(header))  # deep copy, JSON-clean
    header.pop("arrays", None)
    try:
        validate_structure(header, arrays)
    except ValueError as exc:
        raise ModelFileError(f"{path}: refusing to write an inconsistent model: {exc}") from None
    header["storage"] = "float16" if half else "float32"
    table: Dict[str, Dict[str, Any]] = {}
    blobs = []
    offset = 0
    for name in sorted(arrays):
        arr = np.asarray(arrays[name])
        if arr.dtype.kind == "f":
            to_half = half and (name in HALF_ELIGIBLE or name.endswith(".tables"))
            with np.errstate(over="ignore", invalid="ignore"):
                arr = arr.astype("<f2" if to_half else "<f4", copy=False)
            try:
                check_finite(name, arr)
            except ValueError as exc:
                raise ModelFileError(f"{path}: refusing to write the model: {exc}") from None
        else:
            arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        arr = np.ascontiguousarray(arr)
        table[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset,
                       "nbytes": int(arr.nbytes)}
        blobs.append((offset, arr))
        offset = _align(offset + arr.nbytes)
    header["arrays"] = table
    relative = {name: entry["offset"] for name, entry in table.items()}
    data_start = _align(PREAMBLE_SIZE + len(json.dumps(header).encode("utf-8")))
    while True:  # absolute offsets lengthen the header; grow the reserve until it fits
        for name, entry in table.items():
            entry["offset"] = relative[name] + data_start
        hdr = json.dumps(header, sort_keys=True, ensure_ascii=False).encode("utf-8")
        if PREAMBLE_SIZE + len(hdr) <= data_start:
            break
        data_start = _align(PREAMBLE_SIZE + len(hdr))
    total = data_start + offset
    digest = hashlib.blake2b(digest_size=8)
    with atomic_open(path) as f:      # temp file, fsync, rename; removed on any failure
        f.write(b"\0" * PREAMBLE_SIZE)

        def put(b: bytes) -> None:
            digest.update(b)
            f.write(b)

        put(hdr)
        put(b"\0" * (data_start - PREAMBLE_SIZE - len(hdr)))
        pos = data_start
        for off, arr in blobs:
            start = data_start + off
            if start > pos:
                put(b"\0" * (start - pos))
            if arr.nbytes:  # (an empty array, e.g. the context weights of a unigram model)
                put(memoryview(arr).cast("B"))
            pos = start + arr.nbytes
        if total > pos:
            put(b"\0" * (total - pos))
        f.seek(0)
        version = FORMAT_VERSION if header.get("source") is not None else 1
        f.write(PREAMBLE.pack(MAGIC, version, 0, PREAMBLE_SIZE, len(hdr), total,
                              digest.digest(), b"\0" * 16))
    return digest.hexdigest()


def read_preamble(path: str, buf) -> Tuple[int, int, int, bytes]:
    """Validate the preamble; returns (header offset, header length, file length, checksum)."""
    if len(buf) < PREAMBLE_SIZE:
        raise ModelFileError(f"{path}: not an nlmfeature model (file is only {len(buf)} bytes)")
    magic, version, _flags, hoff, hlen, total, checksum, _ = PREAMBLE.unpack_from(buf, 0)
    if magic != MAGIC:
        hint = ""
        if bytes(buf[:7]) == b"\\config":
            hint = " (this looks like an NPLM text model: import it with `nlmfeature convert`)"
        raise ModelFileError(f"{path}: not an nlmfeature model (bad magic number){hint}")
    if version not in READ_VERSIONS:
        raise ModelFileError(
            f"{path}: model format version {version}, but this nlmfeature reads versions "
            f"{', '.join(map(str, READ_VERSIONS))}; convert the model with a matching nlmfeature release")
    if len(buf) < total:
        raise ModelFileError(f"{path}: truncated: the file has {len(buf)} bytes but its header "
                             f"says {total}; copy or write the model again")
    if len(buf) > total:
        raise ModelFileError(f"{path}: {len(buf) - total} unexpected bytes after the end of the model")
    if hoff != PREAMBLE_SIZE or hoff + hlen > total:
        raise ModelFileError(f"{path}: corrupted preamble (header position out of range)")
    return hoff, hlen, total, checksum


def file_checksum(path: str) -> str:
    """The checksum recorded in a model file's preamble (hex), without reading the rest."""
    with open(path, "rb") as f:
        buf = f.read(PREAMBLE_SIZE)
        size = os.fstat(f.fileno()).st_size
    if len(buf) < PREAMBLE_SIZE or buf[:8] != MAGIC:
        raise ModelFileError(f"{path}: not an nlmfeature model")
    total = PREAMBLE.unpack_from(buf, 0)[5]
    if size != total:
        raise ModelFileError(f"{path}: truncated or extended ({size} bytes, header says {total})")
    return PREAMBLE.unpack_from(buf, 0)[6].hex()


#: array element types a model file may use (little-endian; float16 only for HALF_ELIGIBLE)
FILE_DTYPES = ("<f4", "<f2", "<i4", "<i8", "|i1", "|u1")


def _parse_header(path: str, raw: bytes) -> Header:
    try:
        header = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ModelFileError(f"{path}: corrupted header (JSON nested too deeply)") from None
    except (UnicodeDecodeError, ValueError):
        raise ModelFileError(f"{path}: corrupted header (not valid JSON)") from None
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), dict):
        raise ModelFileError(f"{path}: corrupted header (not a JSON object with an array table)")
    return header


def _array_entry(path: str, name: str, e: Any, data_start: int, total: int) -> Tuple[np.dtype, Tuple[int, ...], int]:
    """(dtype, shape, offset) of one array-table entry, checked against the file length
    before anything is allocated or mapped."""
    def bad(why: str) -> ModelFileError:
        return ModelFileError(f"{path}: array {name!r} has an invalid type, size or position ({why})")
    if not isinstance(e, dict):
        raise bad("its entry is not a JSON object")
    dts, shape, off, nbytes = e.get("dtype"), e.get("shape"), e.get("offset"), e.get("nbytes")
    if not isinstance(dts, str) or dts not in FILE_DTYPES:
        raise bad(f"type {dts!r}")
    if not isinstance(shape, list) or len(shape) > 4 or any(type(x) is not int or x < 0 for x in shape):
        raise bad(f"shape {shape!r}")
    if type(off) is not int or type(nbytes) is not int or off < 0 or nbytes < 0:
        raise bad("offset or size is not a non-negative integer")
    dt = np.dtype(dts)
    count = 1
    for x in shape:
        count *= x
    if count * dt.itemsize != nbytes or off % ALIGN or off < data_start or off + nbytes > total:
        raise bad(f"{nbytes} bytes at {off} in a file of {total}")
    return dt, tuple(shape), off


def file_identity(fd: int) -> Tuple[int, int, int, int]:
    """(st_dev, st_ino, size, mtime in ns) of an open file: what a running process compares
    at each sentence start to notice a model file overwritten in place."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def read_model(path: str, verify: bool = True, widen: bool = True) -> Tuple[Header, Arrays, str]:
    """Map a model file read-only; returns (header, arrays, checksum hex).

    Arrays are zero-copy views of the mapping, except that float16-stored ones are widened
    to float32 (:func:`widen_arrays`) unless ``widen=False``, which leaves them as stored.
    ``verify`` recomputes the checksum over the whole file (recommended; costs one read).
    The whole model is validated (:func:`validate_structure`), so native code may trust the
    arrays; every problem is a :class:`ModelFileError` naming the file and what is wrong.
    """
    header, arrays, checksum, fd, _ = open_model(path, verify, widen)
    os.close(fd)
    return header, arrays, checksum


def open_model(path: str, verify: bool = True, widen: bool = True,
               ) -> Tuple[Header, Arrays, str, int, Tuple[int, int, int, int]]:
    """:func:`read_model` plus an open descriptor of the mapped file (the caller closes it)
    and the file's :func:`file_identity` when it was mapped: a loaded model compares them at
    each sentence start to notice the file being overwritten in place."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bool):
        # an int would be taken as a file descriptor, and closed
        raise TypeError(f"a model path must be a str or path object, not {type(path).__name__}")
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError("a model path must be a str or path object, not bytes")
    try:
        # non-blocking: opening a FIFO for reading would otherwise wait for a writer
        f = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb")
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot open model file: {exc.strerror}") from None
    with f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                    "a directory" if stat.S_ISDIR(st.st_mode) else "a device or socket")
            raise ModelFileError(f"{path}: not a regular file ({kind}): a model must be a "
                                 "file, since it is memory-mapped")
        if st.st_size == 0:
            raise ModelFileError(f"{path}: not an nlmfeature model (the file is empty)")
        ident = file_identity(f.fileno())
        mm = ModelMapping(f.fileno(), 0, access=mmap.ACCESS_READ)
        fd = os.dup(f.fileno())
    try:
        header, arrays, checksum = _read_mapped(path, mm, verify, fd)
        if widen:
            arrays = widen_arrays(arrays)
    except BaseException:
        os.close(fd)
        raise
    return header, arrays, checksum, fd, ident


#: bytes read at a time when a model file is verified through its descriptor (small: the
#: process's peak memory is not to grow by a piece of a big file)
_READ_STEP = 1 << 20


def _pread_chunks(fd: int, start: int, end: int):
    """The bytes of the file ``fd`` from ``start`` to ``end``, in chunks of at most
    :data:`_READ_STEP` read with ``pread``: verifying a model this way leaves the pages of its
    mapping untouched, so they never count in the process's resident memory."""
    while start < end:
        chunk = os.pread(fd, min(_READ_STEP, end - start), start)
        if not chunk:
            raise OSError("unexpected end of file")
        yield chunk
        start += len(chunk)


class ModelMapping(mmap.mmap):
    """The read-only shared mapping of a model file made by :func:`open_model`: the only
    memory :func:`release_pages` releases (anything else, such as a training run's anonymous
    arrays, it would zero)."""


def widened(stored: np.ndarray) -> np.ndarray:
    """A float16 array widened to float32, read-only, in memory of this process's own
    (:func:`nlmfeature.training.arrays.zeros`: on huge pages from 2 MB up), which the scorer
    reads in place (no second copy: ``NativeModel.hot``)."""
    from nlmfeature.training.arrays import zeros

    out = zeros(stored.shape, np.float32)
    src, dst = stored.reshape(-1), out.reshape(-1)
    step = 1 << 21      # (a file's pages leave the process a piece at a time: release_pages)
    for s in range(0, src.shape[0], step):
        dst[s:s + step] = src[s:s + step]
        release_pages(src[s:s + step])
    out.flags.writeable = False
    return out


def widen_arrays(arrays: Arrays, keep: Iterable[str] = ()) -> Arrays:
    """``arrays`` with each float16 array (but those named in ``keep``) :func:`widened` to
    float32 (a new dict where any is; the mapped file's pages of those widened released)."""
    keep = set(keep)
    names = [name for name, a in arrays.items() if a.dtype == np.float16 and name not in keep]
    if not names:
        return arrays
    out = dict(arrays)
    for name in names:
        out[name] = widened(arrays[name])
    return out


def in_huge_buffer(arr: np.ndarray) -> bool:
    """Whether ``arr`` lives in anonymous memory of this process's own advised for huge pages
    (:func:`nlmfeature.training.arrays.zeros`: a float16 array widened at load, a training
    run's parameters), which the scorer reads in place rather than copying."""
    root = _root(arr)
    return isinstance(root, mmap.mmap) and not isinstance(root, ModelMapping)


def file_backed(arr: np.ndarray) -> bool:
    """Whether ``arr`` is a view of a model file's read-only mapping (:class:`ModelMapping`),
    not memory of this process's own."""
    return isinstance(_root(arr), ModelMapping)


def _root(arr):
    base = arr
    while getattr(base, "base", None) is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def _address(mm) -> int:
    """Where the mapping ``mm`` starts in this process's memory."""
    return np.frombuffer(mm, dtype=np.uint8, count=1).ctypes.data


def release_pages(arr: np.ndarray) -> None:
    """Tell the kernel this process no longer needs the whole pages of ``arr``, a view of a
    model file's read-only shared mapping that was read once (verified, widened, copied or
    packed): they leave the process's resident memory and stay in the page cache, mapped
    again if read.  Nothing for an array of the process's own memory (which this would zero)."""
    if not file_backed(arr) or not hasattr(mmap, "MADV_DONTNEED"):
        return
    mm = _root(arr)
    start = arr.ctypes.data - _address(mm)
    page = mmap.PAGESIZE
    a, b = -(-start // page) * page, (start + arr.nbytes) // page * page
    if b > a:
        mm.madvise(mmap.MADV_DONTNEED, a, b - a)


def _read_mapped(path: str, mm, verify: bool, fd: int) -> Tuple[Header, Arrays, str]:
    hoff, hlen, total, checksum = read_preamble(path, mm)
    if verify:
        digest = hashlib.blake2b(digest_size=8)
        try:
            for chunk in _pread_chunks(fd, PREAMBLE_SIZE, total):
                digest.update(chunk)
        except OSError as exc:
            raise ModelFileError(f"{path}: cannot read the model file: {exc}") from None
        if digest.digest() != checksum:
            raise ModelFileError(f"{path}: checksum mismatch: the file is corrupted; "
                                 "copy or write the model again")
    header = _parse_header(path, bytes(mm[hoff:hoff + hlen]))
    arrays: Arrays = {}
    stored: Dict[str, Tuple[np.dtype, int, int]] = {}
    for name, e in header["arrays"].items():
        dt, shape, off = _array_entry(path, name, e, hoff + hlen, total)
        count = 1
        for x in shape:
            count *= x
        stored[name] = (dt, off, count)
        arr = np.frombuffer(mm, dtype=dt, count=count, offset=off).reshape(shape)
        if dt == np.float16 and name not in HALF_ELIGIBLE and not name.endswith(".tables"):
            raise ModelFileError(f"{path}: array {name!r} is stored as float16, which only "
                                 f"{', '.join(HALF_ELIGIBLE)} may be")
        arrays[name] = arr
    version = PREAMBLE.unpack_from(mm, 0)[1]
    if (header.get("source") is not None) != (version >= 2):
        raise ModelFileError(f"{path}: format version {version} does not match its header "
                             "(joint models, with a source vocabulary, are version 2)")
    try:
        validate_structure(header, arrays, strict=False)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError,
            RecursionError) as exc:
        raise ModelFileError(f"{path}: wrong architecture description: {exc}") from None
    if verify:       # the file was just read once for its checksum: the values too
        for name in sorted(arrays):
            dt, off, count = stored[name]
            try:
                if dt.kind == "f" and count * dt.itemsize >= _READ_STEP:
                    # through the descriptor, as the checksum: the mapping stays unread
                    _check_finite_file(fd, name, dt, off, count)
                else:
                    check_finite(name, arrays[name])
            except ValueError as exc:
                raise ModelFileError(f"{path}: {exc}; train or write the model again") from None
            except OSError as exc:
                raise ModelFileError(f"{path}: cannot read the model file: {exc}") from None
    return header, arrays, checksum.hex()


def _check_finite_file(fd: int, name: str, dt: np.dtype, off: int, count: int) -> None:
    """:func:`check_finite` of the array stored at byte ``off`` of the file ``fd`` (``count``
    values of type ``dt``), read in chunks of whole values."""
    step = _READ_STEP // dt.itemsize * dt.itemsize
    bad = 0
    for start in range(off, off + count * dt.itemsize, step):
        end = min(off + count * dt.itemsize, start + step)
        values = np.frombuffer(b"".join(_pread_chunks(fd, start, end)), dtype=dt)
        bad += int(values.size - np.count_nonzero(np.isfinite(values)))
    if bad:
        raise _not_finite(name, bad, dt)
