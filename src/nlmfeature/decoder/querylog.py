"""Decoder query logs: record what a decoder asks, keep it portable, replay it on any model.

With ``NLMFEATURE_QUERY_LOG=DIR`` in its environment, every scoring session of
``libnlmfeature`` (the Moses and cdec shims, the C API) writes ``DIR/queries.<pid>.<n>.bin``:

* 8 bytes ``NLMQLOG1``; int32 key length (the model order n), int32 vocabulary size,
  two int32 zeros; the model's 8-byte checksum;
* then records of n int32: a lookup is the n-1 padded context ids (oldest first) and the
  word id; a sentence start is a record whose first value is -1 and second the sentence id.
  Records before the first sentence start come from work outside sentences (Moses scores
  every phrase in isolation when it loads the phrase table); they are dropped.

Such a raw log holds the recording model's ids.  :func:`pack` turns it into a self-contained
``.qlog.xz`` file (the vocabulary as words, the lookups per sentence, a provenance note; xz
compresses a decoder's highly repetitive stream ~45x), and :func:`load_stream` maps a packed
log onto any model's vocabulary, ready for :meth:`nlmfeature.Session.score_stream` -- this is
how ``nlmfeature bench query`` replays a real Moses search.
"""
from __future__ import annotations

import json
import lzma
import os
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

from nlmfeature.io.atomicfile import atomic_write_bytes
from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.io.textio import check_input

RAW_MAGIC = b"NLMQLOG1"
PACKED_FORMAT = "nlmfeature-querylog"
PACKED_VERSION = 1
_RAW_HEADER = struct.Struct("<8s4i8s")

#: the real Moses stream bundled with the package (see nlmfeature/data/streams/README.md)
BUNDLED_MOSES_STREAM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "streams",
                                    "moses-europarl-fr-en.qlog.xz")


@dataclass
class QueryLog:
    """A decoder's lookups: ``ids`` (N, order) int32 rows of n-1 context ids then the word,
    ``sentence_ids`` and ``sentence_starts`` (row where each sentence begins), and the
    vocabulary (``words``) the ids refer to."""

    order: int
    words: List[str]
    ids: np.ndarray
    sentence_ids: np.ndarray
    sentence_starts: np.ndarray
    note: str = ""
    checksum: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def lookups(self) -> int:
        return int(self.ids.shape[0])

    def sentence_lengths(self) -> np.ndarray:
        """Lookups of each sentence."""
        return np.diff(np.append(self.sentence_starts, self.lookups))

    def head(self, sentences: int) -> "QueryLog":
        """The first ``sentences`` sentences."""
        if sentences <= 0 or sentences >= len(self.sentence_starts):
            return self
        end = int(self.sentence_starts[sentences])
        return QueryLog(self.order, self.words, self.ids[:end], self.sentence_ids[:sentences],
                        self.sentence_starts[:sentences], self.note, self.checksum, dict(self.extra))


def read_raw(path: str, words: Sequence[str]) -> QueryLog:
    """A raw ``queries.*.bin`` recording; ``words`` is the recording model's vocabulary
    (``model.vocab.words``), checked against the vocabulary size in the file."""
    try:
        check_input(path)
        with open(path, "rb") as f:
            data = f.read()
    except (InputError, OSError) as exc:
        raise NLMFeatureError(f"{path}: cannot read the query log: "
                              f"{getattr(exc, 'message', None) or exc}") from None
    if len(data) < _RAW_HEADER.size:
        raise NLMFeatureError(f"{path}: truncated query log (shorter than its {_RAW_HEADER.size}-byte header)")
    magic, order, vocab_size, _, _, checksum = _RAW_HEADER.unpack_from(data)
    if magic != RAW_MAGIC:
        raise NLMFeatureError(f"{path}: not an nlmfeature query log (bad magic); record one with "
                              "NLMFEATURE_QUERY_LOG=DIR")
    if not 1 <= order <= 16:
        raise NLMFeatureError(f"{path}: bad order {order} in the header")
    if vocab_size != len(words):
        raise NLMFeatureError(f"{path}: recorded with a vocabulary of {vocab_size} words, the model given "
                              f"has {len(words)}: pass the model that was recorded")
    body = data[_RAW_HEADER.size:]
    if len(body) % (4 * order):
        raise NLMFeatureError(f"{path}: truncated query log ({len(body)} bytes of records is not a "
                              f"multiple of {4 * order})")
    recs = np.frombuffer(body, dtype="<i4").reshape(-1, order)
    marks = np.flatnonzero(recs[:, 0] == -1)
    if order == 1:
        raise NLMFeatureError(f"{path}: order-1 logs have no room for sentence marks")
    if len(marks) == 0:
        raise NLMFeatureError(f"{path}: no sentence in this query log (only work outside sentences)")
    sentence_ids = recs[marks, 1].astype(np.int64)
    keep = np.ones(len(recs), dtype=bool)
    keep[:marks[0]] = False
    keep[marks] = False
    ids = np.ascontiguousarray(recs[keep], dtype=np.int32)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise NLMFeatureError(f"{path}: ids outside the vocabulary 0..{vocab_size - 1}")
    # row of each sentence start among the kept rows
    starts = (marks - np.arange(len(marks)) - marks[0]).astype(np.int64)
    return QueryLog(order, list(words), ids, sentence_ids, starts, checksum=checksum.hex())


def pack(log: QueryLog, out: str, note: str = "") -> int:
    """Write ``log`` as a self-contained ``.qlog.xz`` file (atomically); returns its size."""
    header = {"format": PACKED_FORMAT, "version": PACKED_VERSION, "order": log.order,
              "words": log.words, "sentence_ids": [int(x) for x in log.sentence_ids],
              "sentence_lookups": [int(x) for x in log.sentence_lengths()],
              "recording_model_checksum": log.checksum, "note": note or log.note}
    head = json.dumps(header, ensure_ascii=False).encode("utf-8")
    payload = struct.pack("<Q", len(head)) + head + np.ascontiguousarray(log.ids, dtype="<i4").tobytes()
    data = lzma.compress(payload, preset=9 | lzma.PRESET_EXTREME)
    atomic_write_bytes(out, data)
    return len(data)


def read_packed(path: str) -> QueryLog:
    """A ``.qlog.xz`` file written by :func:`pack`."""
    try:
        check_input(path)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            take = _bounded_xz(f)
            head = take(8)
            if len(head) < 8:
                raise NLMFeatureError(f"{path}: truncated query log")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise NLMFeatureError(f"{path}: header of {n} bytes (more than "
                                      f"{MAX_HEADER_BYTES}): not a query log, or corrupt")
            try:
                header = json.loads(take(n).decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                raise NLMFeatureError(f"{path}: bad query-log header ({exc})") from None
            order, words, sids, lengths = _check_header(path, header)
            want = 4 * order * sum(lengths.tolist())     # exact (no int64 wrap-around)
            if want > MAX_RATIO * max(size, 1):
                raise NLMFeatureError(f"{path}: its header claims {want} bytes of lookups from a "
                                      f"{size}-byte file (more than {MAX_RATIO}:1): corrupt")
            body = take(want)
            if len(body) != want or take(1):
                raise NLMFeatureError(f"{path}: holds {'fewer' if len(body) != want else 'more'} "
                                      f"lookups than its header says ({want // (4 * order)})")
    except (InputError, OSError) as exc:
        raise NLMFeatureError(f"{path}: cannot read the query log: "
                              f"{getattr(exc, 'message', None) or exc}") from None
    except (lzma.LZMAError, EOFError) as exc:
        raise NLMFeatureError(f"{path}: corrupt query log ({exc})") from None
    ids = np.frombuffer(body, dtype="<i4").reshape(-1, order).astype(np.int32)
    if ids.size and (ids.min() < 0 or ids.max() >= len(words)):
        raise NLMFeatureError(f"{path}: ids outside its vocabulary")
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return QueryLog(order, words, ids, sids, starts, str(header.get("note", "")),
                    str(header.get("recording_model_checksum", "")))


#: largest JSON header of a packed log (the vocabulary and per-sentence lists)
MAX_HEADER_BYTES = 1 << 28
#: largest decompressed/compressed size ratio believed (xz on real logs: ~10-40)
MAX_RATIO = 2000


def _bounded_xz(f):
    """``take(n)``: the next ``n`` decompressed bytes of the xz file ``f`` (fewer at its end),
    decompressing no more than asked (a forged header cannot make it inflate without bound)."""
    dec = lzma.LZMADecompressor()

    def take(n: int) -> bytes:
        out = bytearray()
        while len(out) < n and not dec.eof:
            chunk = b""
            if dec.needs_input:
                chunk = f.read(1 << 16)
                if not chunk:
                    raise EOFError("the compressed stream ends early (truncated file?)")
            out += dec.decompress(chunk, max_length=n - len(out))
        return bytes(out)
    return take


def _check_header(path: str, header) -> Tuple[int, List[str], np.ndarray, np.ndarray]:
    """(order, words, sentence ids, lookups per sentence) of a packed log's header, checked."""
    def bad(what: str) -> NLMFeatureError:
        return NLMFeatureError(f"{path}: bad query-log header: {what}")
    if not isinstance(header, dict):
        raise bad("not a JSON object")
    if header.get("format") != PACKED_FORMAT or header.get("version") != PACKED_VERSION:
        raise NLMFeatureError(f"{path}: not a version-{PACKED_VERSION} {PACKED_FORMAT} file")
    order = header.get("order")
    if type(order) is not int or not 2 <= order <= 16:
        raise bad(f"order {order!r} is not an integer in 2..16")
    words = header.get("words")
    if not isinstance(words, list) or not words or not all(isinstance(w, str) for w in words):
        raise bad("'words' is not a non-empty list of strings")
    sids, lengths = header.get("sentence_ids"), header.get("sentence_lookups")
    for name, v in (("sentence_ids", sids), ("sentence_lookups", lengths)):
        if not isinstance(v, list) or not all(type(x) is int and 0 <= x < 1 << 62 for x in v):
            raise bad(f"'{name}' is not a list of non-negative integers")
    if len(sids) != len(lengths):
        raise bad(f"{len(sids)} sentence ids but {len(lengths)} lookup counts")
    return order, words, np.asarray(sids, dtype=np.int64), np.asarray(lengths, dtype=np.int64)


def map_to_model(log: QueryLog, model) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(contexts (N, n-1), words (N,), sentence starts) of ``log`` in ``model``'s ids: words
    are mapped by spelling (unknown -> ``<unk>``; the special tokens map to the model's own);
    a model of lower order keeps the last n-1 context ids, a higher order is refused."""
    n = model.order
    if n > log.order:
        raise NLMFeatureError(f"the query log was recorded with order {log.order}; a model of order {n} "
                              "needs longer contexts than it holds")
    table = np.asarray([model.vocab.id(w) for w in log.words], dtype=np.int32)
    mapped = table[log.ids]
    ctx = np.ascontiguousarray(mapped[:, log.order - n:log.order - 1])
    words = np.ascontiguousarray(mapped[:, -1])
    return ctx, words, np.ascontiguousarray(log.sentence_starts, dtype=np.int64)


def load_stream(path: Optional[str], model, sentences: int = 0):
    """Contexts, words and sentence starts of a packed log (default: the bundled Moses
    stream) on ``model``, first ``sentences`` sentences (0: all)."""
    log = read_packed(path or BUNDLED_MOSES_STREAM)
    return map_to_model(log.head(sentences), model)


def distinct_fractions(log: QueryLog, word_class: Optional[np.ndarray] = None) -> dict:
    """Per-sentence distinct n-grams, contexts and (context, class) pairs as fractions of
    the lookups: what exact per-sentence caches can at best save."""
    out = {"lookups": log.lookups, "ngrams": 0, "contexts": 0}
    if word_class is not None:
        out["context_class"] = 0
    bounds = list(log.sentence_starts) + [log.lookups]
    for a, b in zip(bounds[:-1], bounds[1:]):
        rows = log.ids[a:b]
        out["ngrams"] += len(np.unique(_rows(rows)))
        out["contexts"] += len(np.unique(_rows(rows[:, :-1])))
        if word_class is not None:
            cc = np.concatenate([rows[:, :-1], word_class[rows[:, -1]][:, None]], axis=1)
            out["context_class"] += len(np.unique(_rows(cc)))
    n = max(1, log.lookups)
    return {k: (v if k == "lookups" else v / n) for k, v in out.items()}


def _rows(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.int32)
    return a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).ravel()
