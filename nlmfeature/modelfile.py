"""The nlmfeature model file: read, write and validate (spec: ``docs/model-format.md``).

Layout: a 64-byte preamble (magic, format version, header position and length, file
length, checksum), a UTF-8 JSON header describing the architecture and the array table,
then the arrays, each little-endian and 64-byte aligned.  The checksum (BLAKE2b, 8 bytes)
covers every byte after the preamble.  Files are memory-mapped read-only, so decoder
threads and processes share one copy in the page cache.  Nothing is ever pickled.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import tempfile
from typing import Any, Dict, Mapping, Tuple

import numpy as np

from .errors import ModelFileError

MAGIC = b"NLMFEAT\x00"
#: version written for joint models (a source vocabulary and window: an older reader would
#: misread their branch weights); target-only models are still written as version 1
FORMAT_VERSION = 2
#: versions this reader accepts
READ_VERSIONS = (1, 2)
PREAMBLE = struct.Struct("<8sIIQQQ8s16s")  # magic, version, flags, hdr off, hdr len, file len, checksum, pad
PREAMBLE_SIZE = 64
ALIGN = 64
assert PREAMBLE.size == PREAMBLE_SIZE

ARCHS = ("lbl", "nplm", "lateral")
OUTPUT_TYPES = ("unnormalised", "softmax", "class", "tree")
ACTIVATION_NAMES = ("identity", "sigmoid", "relu", "tanh", "hardtanh")
COMBINE_NAMES = ("none", "max", "add", "mul")
#: arrays that may be stored as float16 (``storage: float16``) and are widened at load
HALF_ELIGIBLE = ("embeddings", "source.embeddings", "output.weight", "tables")

Header = Dict[str, Any]
Arrays = Dict[str, np.ndarray]


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def expected_arrays(h: Header) -> Dict[str, Tuple[str, Tuple[int, ...], bool]]:
    """Name -> (dtype, shape, required) of every array a header implies.

    Raises :class:`ValueError` when the header itself is inconsistent.
    """
    for key in ("arch", "order", "vocab_size", "embed_dim", "branches", "layers", "output", "special"):
        if key not in h:
            raise ValueError(f"header lacks {key!r}")
    if h["arch"] not in ARCHS:
        raise ValueError(f"unknown architecture {h['arch']!r} (known: {', '.join(ARCHS)})")
    n, V, E = int(h["order"]), int(h["vocab_size"]), int(h["embed_dim"])
    if n < 1 or V < 4 or E < 1:
        raise ValueError(f"bad sizes: order {n}, vocab_size {V}, embed_dim {E}")
    c = n - 1
    f4 = "<f4"
    src = h.get("source")
    w = 0  # joint models: source-window positions, first in the branch weights
    if src is not None:
        try:
            w, Vs = int(src["window"]), int(src["vocab_size"])
            ssp = src["special"]
        except (KeyError, TypeError, ValueError):
            raise ValueError("the source description needs window, vocab_size and special") from None
        if w < 1 or w % 2 == 0 or w > 31:
            raise ValueError(f"source window {w} is not an odd number in 1..31")
        if Vs < 4:
            raise ValueError(f"bad source vocab_size {Vs}")
        for tok in ("<unk>", "<s>", "</s>", "<null>"):
            if not 0 <= int(ssp.get(tok, -1)) < Vs:
                raise ValueError(f"source special token {tok} has no valid id")
        if h.get("direct"):
            raise ValueError("direct n-gram features are not supported in joint models")
    out: Dict[str, Tuple[str, Tuple[int, ...], bool]] = {
        "vocab.offsets": ("<i8", (V + 1,), True),
        "vocab.hash": ("<i4", (-1,), True),
        "vocab.bytes": ("|u1", (-1,), True),
        "unigram": (f4, (V,), True),
        "embeddings": (f4, (V, E), True),
    }
    if src is not None:
        out.update({"source.vocab.offsets": ("<i8", (Vs + 1,), True),
                    "source.vocab.hash": ("<i4", (-1,), True),
                    "source.vocab.bytes": ("|u1", (-1,), True),
                    "source.unigram": (f4, (Vs,), True),
                    "source.embeddings": (f4, (Vs, E), True)})
    branches = h["branches"]
    if not branches:
        raise ValueError("a model needs at least one first-layer branch")
    H = int(branches[0]["hidden"])
    for k, br in enumerate(branches):
        if br["activation"] not in ACTIVATION_NAMES:
            raise ValueError(f"branch {k}: unknown activation {br['activation']!r}")
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
    if h.get("combine", "none") not in COMBINE_NAMES:
        raise ValueError(f"unknown combination {h.get('combine')!r}")
    if len(branches) > 1 and h.get("combine", "none") == "none":
        raise ValueError("several branches need a combination (max, add or mul)")
    width = H
    for k, ly in enumerate(h["layers"]):
        if int(ly["n_in"]) != width:
            raise ValueError(f"layer {k} takes {ly['n_in']} inputs but receives {width}")
        if ly["activation"] not in ACTIVATION_NAMES:
            raise ValueError(f"layer {k}: unknown activation {ly['activation']!r}")
        width = int(ly["n_out"])
        out[f"layer{k}.weight"] = (f4, (width, int(ly["n_in"])), True)
        out[f"layer{k}.bias"] = (f4, (width,), True)
    o = h["output"]
    if o.get("type") not in OUTPUT_TYPES:
        raise ValueError(f"unknown output layer {o.get('type')!r} (known: {', '.join(OUTPUT_TYPES)})")
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
        if not 1 <= int(d["order"]) <= n or int(d["hash_space"]) < 1:
            raise ValueError("direct features need 1 <= order <= model order and hash_space >= 1")
        if o["type"] not in ("unnormalised", "softmax", "class"):
            raise ValueError("direct features go with unnormalised, softmax or class outputs")
        out["direct.weights"] = (f4, (int(d["hash_space"]),), True)
    sp = h["special"]
    for tok in ("<unk>", "<s>", "</s>", "<null>"):
        if not 0 <= int(sp.get(tok, -1)) < V:
            raise ValueError(f"special token {tok} has no valid id")
    return out


def _check_array(name: str, arr: np.ndarray, dtype: str, shape: Tuple[int, ...]) -> None:
    if len(shape) != arr.ndim or any(s != -1 and s != a for s, a in zip(shape, arr.shape)):
        want = tuple("*" if s == -1 else s for s in shape)
        raise ValueError(f"array {name!r} has shape {arr.shape}, expected {want}")
    if np.dtype(dtype).kind != arr.dtype.kind:
        raise ValueError(f"array {name!r} has type {arr.dtype}, expected {np.dtype(dtype)}")


def validate_structure(h: Header, arrays: Mapping[str, np.ndarray], strict: bool = True) -> None:
    """Check that arrays match the header (shapes, types) and that index arrays are in range.
    ``strict`` also refuses arrays the header does not imply (readers ignore them instead)."""
    spec = expected_arrays(h)
    for name, (dtype, shape, required) in spec.items():
        if name not in arrays:
            if required:
                raise ValueError(f"array {name!r} is missing")
            continue
        _check_array(name, arrays[name], dtype, shape)
    extra = set(arrays) - set(spec)
    if extra and strict:
        raise ValueError(f"unexpected arrays {sorted(extra)}")
    V = int(h["vocab_size"])
    for prefix in ("", "source.") if h.get("source") is not None else ("",):
        offs = arrays[prefix + "vocab.offsets"]
        if offs[0] != 0 or np.any(np.diff(offs) <= 0) or offs[-1] != len(arrays[prefix + "vocab.bytes"]):
            raise ValueError(f"{prefix or 'target '}vocabulary offsets are inconsistent")
    out = h["output"]
    if out["type"] == "class":
        C = int(out["classes"])
        wc, st, mem = arrays["class.of_word"], arrays["class.start"], arrays["class.members"]
        if wc.min() < 0 or wc.max() >= C or st[0] != 0 or st[-1] != V or np.any(np.diff(st) <= 0):
            raise ValueError("class arrays are inconsistent (every class needs at least one word)")
        if not np.array_equal(np.sort(mem), np.arange(V)) or np.any(wc[mem] != np.repeat(np.arange(C), np.diff(st))):
            raise ValueError("class.members is not the partition given by class.of_word")
    elif out["type"] == "tree":
        ps, pn, sg = arrays["tree.path_start"], arrays["tree.path_node"], arrays["tree.path_sign"]
        if ps[0] != 0 or ps[-1] != len(pn) or len(sg) != len(pn) or np.any(np.diff(ps) < 0):
            raise ValueError("tree path arrays are inconsistent")
        if len(pn) and (pn.min() < 0 or pn.max() >= int(out["nodes"]) or not np.all(np.abs(sg) == 1)):
            raise ValueError("tree paths name nodes outside the tree or signs other than +-1")


def write_model(path: str, header: Header, arrays: Mapping[str, np.ndarray],
                half: bool = False) -> str:
    """Write a model file atomically (temporary file + rename).  Returns the checksum (hex).

    ``half=True`` stores the big float tables (embeddings, output weights, precomputed
    tables) as float16; they are widened to float32 when the file is loaded.
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
            arr = arr.astype("<f2" if to_half else "<f4")
        else:
            arr = arr.astype(arr.dtype.newbyteorder("<"))
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
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".nlm-", suffix=".tmp", dir=directory)
    try:
        digest = hashlib.blake2b(digest_size=8)
        with os.fdopen(fd, "wb") as f:
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
                put(memoryview(arr).cast("B"))
                pos = start + arr.nbytes
            if total > pos:
                put(b"\0" * (total - pos))
            f.seek(0)
            version = FORMAT_VERSION if header.get("source") is not None else 1
            f.write(PREAMBLE.pack(MAGIC, version, 0, PREAMBLE_SIZE, len(hdr), total,
                                  digest.digest(), b"\0" * 16))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
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


def read_model(path: str, verify: bool = True) -> Tuple[Header, Arrays, str]:
    """Map a model file read-only; returns (header, arrays, checksum hex).

    Arrays are zero-copy views of the mapping except float16-stored ones, which are widened.
    ``verify`` recomputes the checksum over the whole file (recommended; costs one read).
    """
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot open model file: {exc.strerror}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ModelFileError(f"{path}: not an nlmfeature model (the file is empty)")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    hoff, hlen, total, checksum = read_preamble(path, mm)
    version = PREAMBLE.unpack_from(mm, 0)[1]
    if verify:
        digest = hashlib.blake2b(digest_size=8)
        view = memoryview(mm)
        step = 1 << 24
        for start in range(PREAMBLE_SIZE, total, step):
            digest.update(view[start:min(total, start + step)])
        view.release()
        if digest.digest() != checksum:
            raise ModelFileError(f"{path}: checksum mismatch: the file is corrupted; "
                                 "copy or write the model again")
    try:
        header = json.loads(bytes(mm[hoff:hoff + hlen]).decode("utf-8"))
        table = header["arrays"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise ModelFileError(f"{path}: corrupted header (not valid JSON with an array table)") from None
    arrays: Arrays = {}
    for name, e in table.items():
        try:
            dt = np.dtype(e["dtype"])
            shape = tuple(int(s) for s in e["shape"])
            off, nbytes = int(e["offset"]), int(e["nbytes"])
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"{path}: corrupted entry for array {name!r}") from None
        count = int(np.prod(shape)) if shape else 1
        if (dt.byteorder == ">" or dt.kind not in "iuf" or count * dt.itemsize != nbytes or off % ALIGN
                or off < hoff + hlen or off + nbytes > total):
            raise ModelFileError(f"{path}: array {name!r} has an invalid type, size or position")
        arr = np.frombuffer(mm, dtype=dt, count=count, offset=off).reshape(shape)
        if dt == np.float16:
            arr = arr.astype(np.float32)
        arrays[name] = arr
    if (header.get("source") is not None) != (version >= 2):
        raise ModelFileError(f"{path}: format version {version} does not match its header "
                             "(joint models, with a source vocabulary, are version 2)")
    try:
        validate_structure(header, arrays, strict=False)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(f"{path}: wrong architecture description: {exc}") from None
    return header, arrays, checksum.hex()
