"""The persistent tuning cache: what a sentence computed, kept on disk per (model, sentence).

Tuning decodes (or rescores) the same dev set many times.  :class:`CachedScorer` is a core
scoring session with a persistent store attached: sentence ``i``'s files in
``DIR/<model checksum>/`` (the base ``i.nlmc`` and up to four deltas ``i.<k>.nlmc``) are
read into memory whole by :meth:`CachedScorer.begin` -- they are hash tables in the core's
own slot layout, probed as read, never parsed; read rather than mapped, so a file cut short
or changed on disk while in use cannot fault the decoder -- and hold exact n-gram scores, the class (or
softmax) normaliser of each context and the within-class normaliser of each (context,
class).  :meth:`CachedScorer.end` writes what the sentence computed and did not find, as a
new delta, and only when there is something new; when the delta names are used up they are
merged into a new base (temporary file + link/rename, under a lock), so several processes
and threads may share ``DIR``.  Keys are exact (never hashes) and a changed model has
another checksum, so it never sees old entries; a model file changed under a running
process switches its cache off.  Corrupt or foreign files are ignored with a warning and
replaced.  Models that score an n-gram faster than a probe (unnormalised, no dense layers)
skip the cache with one line on stderr (``NLMFEATURE_PERSISTENT_CACHE=always`` or
``policy="always"`` overrides).  The decoders use the same code through ``libnlmfeature``
(``persistent-cache=DIR`` on a feature line).

>>> from nlmfeature.decoder.pcache import CachedScorer            # doctest: +SKIP
>>> scorer = CachedScorer(model, "/tmp/nlmcache")           # doctest: +SKIP
>>> scorer.begin(17); scorer.score_sentence("a b c"); scorer.end()   # doctest: +SKIP

This module also reads, inspects, prunes and clears such directories (``nlmfeature cache``).
"""
from __future__ import annotations

import os
import re
import stat
import struct
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from nlmfeature._pcache import (DEFAULT_MAX_BYTES, DEFAULT_NGRAM_ENTRIES, HEADER_SIZE, MAX_DELTA_FILES,
                      POLICIES, CachedScorer, data_checksum, unpack_cache_file)
from nlmfeature._pcache import prune as _prune
from nlmfeature.errors import NLMFeatureError

__all__ = ["CachedScorer", "CacheFile", "DirectoryStats", "read_cache_file", "read_sentence",
           "cache_files", "directory_stats", "clear", "prune", "DEFAULT_MAX_BYTES",
           "DEFAULT_NGRAM_ENTRIES", "POLICIES"]

MAGIC = b"NLMPCAC2"
_HEADER = struct.Struct("<8sII8sqQ")        # magic, version, order, checksum, sentence, size
_REGION = struct.Struct("<HHIQQQ")          # key length, bytes per id, doubles, slots, entries, longest probe
_REGIONS_AT = 40
_CHECKSUM_DIR = re.compile(r"^[0-9a-f]{16}$")
_FILE = re.compile(r"^(-?\d+)(\.\d+)?\.nlmc$")
_TEMP = re.compile(r"^(-?\d+)(\.\d+)?\.nlmc\.\d+\.\d+\.tmp$")


@dataclass
class CacheFile:
    """One cache file (or the union of a sentence's files), as read by :func:`read_cache_file`."""

    path: str
    key_len: int              #: model order (n-1 context ids + the word)
    model_checksum: str       #: hex
    sentence_id: int
    keys: np.ndarray          #: (N, key_len) int32: padded context ids, then the word id
    scores: np.ndarray        #: (N,) float64 natural-log scores
    context_keys: np.ndarray = None     #: (C, n-1) int32 padded contexts
    context_norms: np.ndarray = None    #: (C, 2) float64 [log Z softmax, log Z classes] (NaN: none)
    class_keys: np.ndarray = None       #: (K, n) int32 padded context, then the class
    class_norms: np.ndarray = None      #: (K,) float64 log Z within the class


def _region(data: bytes, at: int, slots: int, key_len: int, nd: int) -> Tuple[np.ndarray, np.ndarray]:
    stride = 1 + key_len + 2 * nd
    if not slots:
        return np.zeros((0, key_len), np.int32), np.zeros((0, nd), np.float64)
    raw = np.frombuffer(data, dtype="<i4", count=slots * stride, offset=at).reshape(slots, stride)
    live = raw[raw[:, 0] == 1]
    keys = np.ascontiguousarray(live[:, 1:1 + key_len]).astype(np.int32)
    vals = np.ascontiguousarray(live[:, 1 + key_len:]).view("<f8").astype(np.float64).reshape(-1, nd)
    return keys, vals


def read_cache_file(path: str) -> CacheFile:
    """Read and validate a cache file; raises :class:`NLMFeatureError` saying what is wrong."""
    try:
        if not os.path.isfile(path):
            raise NLMFeatureError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE or head[:8] != MAGIC:
                raise NLMFeatureError(f"{path}: not an nlmfeature cache file")
            data = head + f.read()
    except OSError as exc:
        raise NLMFeatureError(f"{path}: cannot read: {exc.strerror}") from None
    _, _version, order, checksum, sid, _size = _HEADER.unpack_from(data, 0)
    why, data = unpack_cache_file(data, order, checksum, sid)  # the regions as the scorer's tables
    if why is not None:
        raise NLMFeatureError(f"{path}: {why}")
    at = HEADER_SIZE
    parts = []
    for i in range(3):
        klen, _width, nd, slots, _count, _maxp = _REGION.unpack_from(data, _REGIONS_AT + 32 * i)
        parts.append(_region(data, at, slots, klen, nd))
        at += (slots * (1 + klen + 2 * nd) * 4 + 63) // 64 * 64
    (k, v), (ck, cv), (kk, kv) = parts
    return CacheFile(path, order, checksum.hex(), sid, k, v[:, 0].copy(), ck, cv, kk, kv[:, 0].copy())


def sentence_files(model_dir: str, sentence_id: int) -> List[str]:
    """The existing files of one sentence in a model's cache directory: base, then deltas."""
    names = [f"{sentence_id}.nlmc"] + [f"{sentence_id}.{k}.nlmc" for k in range(1, MAX_DELTA_FILES + 1)]
    return [os.path.join(model_dir, n) for n in names if os.path.exists(os.path.join(model_dir, n))]


def read_sentence(model_dir: str, sentence_id: int) -> CacheFile:
    """The union of a sentence's files (base and deltas) in a model's cache directory."""
    files = [read_cache_file(p) for p in sentence_files(model_dir, sentence_id)]
    if not files:
        raise NLMFeatureError(f"{model_dir}: no cache file for sentence {sentence_id}")

    def union(keys, vals):
        k = np.concatenate(keys)
        v = np.concatenate(vals)
        _, first = np.unique(k, axis=0, return_index=True)
        first.sort()
        return k[first], v[first]

    k, v = union([f.keys for f in files], [f.scores for f in files])
    ck, cv = union([f.context_keys for f in files], [f.context_norms for f in files])
    kk, kv = union([f.class_keys for f in files], [f.class_norms for f in files])
    f0 = files[0]
    return CacheFile(model_dir, f0.key_len, f0.model_checksum, sentence_id, k, v, ck, cv, kk, kv)


def cache_files(directory: str, model_checksum: Optional[str] = None) -> Iterator[Tuple[str, str]]:
    """(model checksum, path) of every cache file (and stale temporary file) under ``directory``."""
    try:
        subdirs = sorted(os.listdir(directory))
    except FileNotFoundError:
        return
    for cs in subdirs:
        sub = os.path.join(directory, cs)
        if not _CHECKSUM_DIR.match(cs) or not os.path.isdir(sub):
            continue
        if model_checksum and cs != model_checksum:
            continue
        for name in sorted(os.listdir(sub)):
            if _FILE.match(name) or _TEMP.match(name):
                yield cs, os.path.join(sub, name)


@dataclass
class DirectoryStats:
    """Summary of a cache directory (``nlmfeature cache --stats``)."""

    directory: str
    files: int = 0
    bytes: int = 0
    entries: int = 0
    temporary_files: int = 0
    invalid: List[str] = field(default_factory=list)   #: "path: reason" (with ``verify``)
    models: Dict[str, Dict[str, int]] = field(default_factory=dict)  #: checksum -> files/bytes/entries

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def directory_stats(directory: str, verify: bool = False) -> DirectoryStats:
    """Count files, bytes and entries per model; ``verify`` checks every file's checksum."""
    st = DirectoryStats(directory)
    for cs, path in cache_files(directory):
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        m = st.models.setdefault(cs, {"files": 0, "bytes": 0, "entries": 0})
        st.bytes += size
        m["bytes"] += size
        if path.endswith(".tmp"):
            st.temporary_files += 1
            continue
        st.files += 1
        m["files"] += 1
        if not os.path.isfile(path):
            st.invalid.append(f"{path}: not a regular file")
            continue
        if verify:
            try:
                cf = read_cache_file(path)
            except NLMFeatureError as exc:
                st.invalid.append(str(exc))
                continue
            n = len(cf.scores) + len(cf.context_norms) + len(cf.class_norms)
        else:
            with open(path, "rb") as f:
                head = f.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE or head[:8] != MAGIC:
                st.invalid.append(f"{path}: not an nlmfeature cache file")
                continue
            n = sum(_REGION.unpack_from(head, _REGIONS_AT + 32 * i)[4] for i in range(3))
        st.entries += n
        m["entries"] += n
    return st


def is_cache_file(path: str) -> bool:
    """Whether ``path`` is a regular file (not a link) that the library wrote: a cache file
    starts with :data:`MAGIC`; a temporary file (a writer's, interrupted) is recognised by
    its name alone, since it may be empty."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        if _TEMP.match(os.path.basename(path)):
            return True
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def clear(directory: str, model_checksum: Optional[str] = None) -> int:
    """Delete the cache files under ``directory`` (only those of ``model_checksum`` if given),
    and the emptied model subdirectories.  Other files are left alone, even where their names
    look like cache files' (:func:`is_cache_file`).  Returns files deleted."""
    removed = 0
    subdirs = set()
    for cs, path in cache_files(directory, model_checksum):
        if not is_cache_file(path):
            continue          # a file of another kind that only has a cache file's name
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
        subdirs.add(os.path.dirname(path))
    for cs in (os.listdir(directory) if os.path.isdir(directory) else []):
        sub = os.path.join(directory, cs)
        if _CHECKSUM_DIR.match(cs) and os.path.isdir(sub) and (not model_checksum or cs == model_checksum):
            lock = os.path.join(sub, ".lock")
            if os.path.exists(lock) and os.listdir(sub) == [".lock"]:
                os.unlink(lock)
            try:
                os.rmdir(sub)
            except OSError:
                pass
    return removed


def prune(directory: str, max_bytes: int) -> Tuple[int, int]:
    """Delete least recently used files until ``directory`` is under 80% of ``max_bytes``
    (nothing happens while it is under ``max_bytes``).  Returns (bytes left, files deleted)."""
    if not os.path.isdir(directory):
        raise NLMFeatureError(f"{directory}: no such cache directory")
    return _prune(directory, int(max_bytes))


#: the line a decoder's session prints on stderr when its cache directory reaches its bound
BOUND_LINE = "is at its bound"


def bound_report(directory: str, sentences: int, decoder_log: str) -> Optional[str]:
    """What to tell a tuning run whose decoder found the cache ``directory`` at its bound
    (the decoder's stderr, ``decoder_log``, has the line): how many of the ``sentences`` dev
    sentences have files and about how much room all of them would take; None if the
    decoder did not reach the bound."""
    try:
        with open(decoder_log, "rb") as f:
            if not any(BOUND_LINE.encode() in line and b"persistent cache" in line for line in f):
                return None
    except OSError:
        return None
    kept: Dict[str, set] = {}
    size = 0
    for cs, path in cache_files(directory):
        m = _FILE.match(os.path.basename(path))
        if m:
            kept.setdefault(cs, set()).add(m.group(1))
            size += os.path.getsize(path)
    n = max((len(v) for v in kept.values()), default=0)
    if n == 0:
        return f"the persistent cache {directory} is at its bound and holds no sentence's files"
    need = size / n * max(sentences, n)
    return (f"the persistent cache {directory} is at its bound: {n} of {sentences} dev sentences have "
            f"files ({size / 2**20:.0f} MiB); all of them would take ~{need / 2**30:.1f} GiB now and more "
            f"as tuning goes on (Multi30k, class LBL: ~1.8x after four iterations): "
            f"--persistent-cache-max {max(1, int(need * 2 / 2**30 + 0.999))}G")


