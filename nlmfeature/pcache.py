"""The persistent tuning cache: n-gram scores kept on disk per (model, sentence).

Tuning decodes (or rescores) the same dev set many times.  :class:`CachedScorer` keeps the
exact n-gram scores of sentence ``i`` in ``DIR/<model checksum>/<i>.nlmc``: they are loaded
by :meth:`CachedScorer.begin`, and the sentence's new scores are merged into the file by
:meth:`CachedScorer.end` (re-read, union, temporary file + rename, under a lock), so several
processes and threads may share ``DIR``.  Keys are the exact n-grams (padded context ids and
the word) -- never hashes -- and a changed model has another checksum, so it never sees old
entries.  Corrupt or foreign files are ignored with a warning and rewritten.  The decoders
use the same code through ``libnlmfeature`` (``persistent-cache=DIR`` on a feature line).

>>> from nlmfeature.pcache import CachedScorer            # doctest: +SKIP
>>> scorer = CachedScorer(model, "/tmp/nlmcache")           # doctest: +SKIP
>>> scorer.begin(17); scorer.score_sentence("a b c"); scorer.end()   # doctest: +SKIP

This module also inspects, prunes and clears such directories (``nlmfeature cache``).
"""
from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from ._pcache import (DEFAULT_MAX_BYTES, DEFAULT_NGRAM_ENTRIES, HEADER_SIZE, CachedScorer,
                      check_cache_file, data_checksum)
from ._pcache import prune as _prune
from .errors import NLMFeatureError

__all__ = ["CachedScorer", "CacheFile", "DirectoryStats", "read_cache_file", "cache_files",
           "directory_stats", "clear", "prune", "parse_size", "DEFAULT_MAX_BYTES",
           "DEFAULT_NGRAM_ENTRIES"]

MAGIC = b"NLMPCACH"
_HEADER = struct.Struct("<8sII8sqQ")
assert _HEADER.size == HEADER_SIZE
_CHECKSUM_DIR = re.compile(r"^[0-9a-f]{16}$")
_FILE = re.compile(r"^(-?\d+)\.nlmc$")
_TEMP = re.compile(r"^(-?\d+)\.nlmc\.\d+\.\d+\.tmp$")


@dataclass
class CacheFile:
    """One sentence's cache file, as read by :func:`read_cache_file`."""

    path: str
    key_len: int              #: model order (n-1 context ids + the word)
    model_checksum: str       #: hex
    sentence_id: int
    keys: np.ndarray          #: (N, key_len) int32: padded context ids, then the word id
    scores: np.ndarray        #: (N,) float64 natural-log scores


def read_cache_file(path: str) -> CacheFile:
    """Read and validate a cache file; raises :class:`NLMFeatureError` saying what is wrong."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise NLMFeatureError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) < HEADER_SIZE + 8 or data[:8] != MAGIC:
        raise NLMFeatureError(f"{path}: not an nlmfeature cache file")
    _, _version, key_len, checksum, sid, count = _HEADER.unpack_from(data, 0)
    why = check_cache_file(data, key_len, checksum, sid)
    if why is not None:
        raise NLMFeatureError(f"{path}: {why}")
    nk = count * key_len
    keys = np.frombuffer(data, dtype="<i4", count=nk, offset=HEADER_SIZE).reshape(count, key_len)
    scores = np.frombuffer(data, dtype="<f8", count=count, offset=HEADER_SIZE + 4 * nk)
    return CacheFile(path, key_len, checksum.hex(), sid, keys.copy(), scores.copy())


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
        if verify:
            try:
                n = len(read_cache_file(path).scores)
            except NLMFeatureError as exc:
                st.invalid.append(str(exc))
                continue
        else:
            with open(path, "rb") as f:
                head = f.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE or head[:8] != MAGIC:
                st.invalid.append(f"{path}: not an nlmfeature cache file")
                continue
            n = _HEADER.unpack_from(head, 0)[5]
        st.entries += n
        m["entries"] += n
    return st


def clear(directory: str, model_checksum: Optional[str] = None) -> int:
    """Delete the cache files under ``directory`` (only those of ``model_checksum`` if given),
    and the emptied model subdirectories.  Other files are left alone.  Returns files deleted."""
    removed = 0
    subdirs = set()
    for cs, path in cache_files(directory, model_checksum):
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


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"500M"`` -> bytes (suffixes K, M, G, T are powers of 1024; optional ``B``/``iB``)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(text))
    if not m:
        raise NLMFeatureError(f"bad size {text!r}: use a number with an optional K, M, G or T suffix")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
