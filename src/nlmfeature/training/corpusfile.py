"""The compiled corpus: tokenised text of any size as a memory-mapped file of word ids.

One streaming pass (:func:`compile_corpus`) turns tokenised text (one sentence per line; plain,
``.gz``, ``.bz2`` or ``.xz``) into a ``.nlmcorpus`` file holding

* ``ids``: one uint32 per token and one ``0`` after every sentence (the end-of-sentence mark);
  words are numbered from 1 in order of first appearance, so the pass needs no vocabulary in
  advance and its memory is O(vocabulary), not O(corpus);
* ``counts``: uint64 count of every word (entry 0: the number of sentences);
* ``vocab``: the words, UTF-8, one per line, in id order;
* ``blocks``: int64 token offsets cutting the id stream into sentence-aligned blocks of about
  :data:`BLOCK_TOKENS` tokens (the unit of shuffling: no n-gram crosses a block).

Layout: the magic ``NLMCORP\\0``, a uint32 format version, a uint32 header length, the header
(JSON: sizes, offsets, SHA-256 of every section, where the text came from), zero padding to
:data:`DATA_OFFSET`, then the sections, each 64-byte aligned.  :class:`CompiledCorpus` checks
all of it when it opens a file (magic, version, sizes, checksums, every id below the number of
words) and refuses a truncated or corrupt file with a message naming it; a second
:func:`compile_corpus` of the same text (same path, size and modification time) reuses the file.

Training reads n-grams from it through :class:`NgramStream`, one shuffle window at a time (a
seeded permutation of the blocks, cut into windows of :data:`WINDOW_TOKENS` tokens, each
window's n-grams permuted): a window holds its words and each one's position in its sentence
(5 bytes a token), and a minibatch's contexts are built from them when it is served, so the
memory of training does not grow with the corpus or with the order, and the order of the
n-grams depends on the seed and the epoch only.  Passes that count every n-gram (the direct
features' filter) read whole contexts in chunks of :data:`CHUNK_NGRAMS`.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.core.vocab import Vocabulary

MAGIC = b"NLMCORP\0"
VERSION = 1
#: the header region; the first section starts here
DATA_OFFSET = 1 << 16
#: a block closes at the first sentence end after this many tokens
BLOCK_TOKENS = 1 << 15
#: tokens of one shuffle window (training holds one window's n-grams at a time)
WINDOW_TOKENS = 1 << 22
#: minibatches gathered from a window at a time
GATHER_BATCHES = 64
#: n-grams (with their contexts) of one chunk of :meth:`NgramStream.chunks`
CHUNK_NGRAMS = 1 << 20
#: tokens (with sentence ends) buffered by the compiler before they are written
_FLUSH = 1 << 20
RESERVED = ("<s>", "</s>", "<null>")
SUFFIX = ".nlmcorpus"


def _align(n: int, a: int = 64) -> int:
    return (n + a - 1) // a * a


def source_identity(path: str) -> Dict[str, Any]:
    """What identifies a text for reuse: its real path, size, modification time and the SHA-256
    of its first and last MiB (a rewrite within the file system's time resolution that keeps
    the size is still told apart)."""
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if st.st_size > 2 << 20:
            f.seek(st.st_size - (1 << 20))
        h.update(f.read(1 << 20))
    return {"path": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ends_sha256": h.hexdigest()}


def compile_corpus(text: str, out: str, reuse: bool = True, progress=None) -> "CompiledCorpus":
    """Compile ``text`` into ``out`` (written atomically) and return it opened.

    With ``reuse``, an existing valid ``out`` compiled from the same file (same real path, size
    and modification time) is returned as it is.  Raises :class:`InputError` (file:line) for
    bytes that are not UTF-8, the reserved tokens ``<s>``, ``</s>``, ``<null>`` in the text, or a
    text without a single token."""
    from nlmfeature.io import textio
    from nlmfeature.io.atomicfile import atomic_open, check_output

    textio.check_input(text)
    ident = source_identity(text)
    if reuse and os.path.exists(out):
        try:
            old = CompiledCorpus(out)
            if old.header.get("source") == ident:
                return old
            old.close()
        except InputError:
            pass   # corrupt or another format: compile again
    check_output(out, "compiled corpus")
    index: Dict[str, int] = {}
    words: List[str] = [""]
    counts = np.zeros(1 << 16, dtype=np.uint64)
    blocks = [0]
    tokens = sentences = 0
    since_block = 0
    buf: List[int] = []
    h = hashlib.sha256()
    with atomic_open(out, suffix=".tmp") as f:
        f.write(b"\0" * DATA_OFFSET)

        def flush() -> None:
            nonlocal counts
            if not buf:
                return
            arr = np.asarray(buf, dtype=np.uint32)
            b = arr.tobytes()
            f.write(b)
            h.update(b)
            bc = np.bincount(arr, minlength=len(words))
            if len(bc) > len(counts):
                counts = np.concatenate([counts, np.zeros(max(len(bc), 2 * len(counts)) - len(counts),
                                                          dtype=np.uint64)])
            counts[:len(bc)] += bc.astype(np.uint64)
            buf.clear()

        get = index.get
        for lineno, line in textio.iter_lines(text):
            toks = line.split()
            if not toks:
                continue
            ids = list(map(get, toks))
            if None in ids:
                for k, t in enumerate(toks):
                    if ids[k] is None:
                        i = get(t)
                        if i is None:
                            if t in RESERVED:
                                raise InputError(text, lineno, f"the reserved token {t!r}: sentence "
                                                 "boundaries are added by nlmfeature, remove them from the text")
                            i = index[t] = len(words)
                            words.append(t)
                        ids[k] = i
            buf.extend(ids)
            buf.append(0)
            n = len(toks) + 1
            tokens += len(toks)
            sentences += 1
            since_block += n
            if since_block >= BLOCK_TOKENS:
                blocks.append(blocks[-1] + since_block)
                since_block = 0
            if len(buf) >= _FLUSH:
                flush()
            if progress is not None and sentences % 100000 == 0:
                progress(tokens)
        flush()
        if sentences == 0:
            f.discard()
            raise InputError(text, 0, "the corpus is empty (no tokens): nothing to compile")
        if since_block:
            blocks.append(blocks[-1] + since_block)
        _finish(f, out, h.hexdigest(), tokens, sentences, counts[:len(words)], words, blocks, ident)
    return CompiledCorpus(out)


def _finish(f, out: str, ids_sha256: str, tokens: int, sentences: int, counts: np.ndarray, words: List[str],
            blocks: List[int], source: Dict[str, Any]) -> None:
    """Write the sections after the id stream (already written from :data:`DATA_OFFSET`) and
    the header at the start of ``f``."""
    stream_len = tokens + sentences
    sections: Dict[str, Dict[str, Any]] = {"ids": {"offset": DATA_OFFSET, "bytes": stream_len * 4,
                                                   "sha256": ids_sha256}}
    pos = DATA_OFFSET + stream_len * 4
    payloads = {"counts": np.asarray(counts).astype("<u8").tobytes(),
                "vocab": "\n".join(words).encode("utf-8"),
                "blocks": np.asarray(blocks, dtype="<i8").tobytes()}
    for name, data in payloads.items():
        start = _align(pos)
        f.write(b"\0" * (start - pos))
        f.write(data)
        sections[name] = {"offset": start, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        pos = start + len(data)
    header = {"format": "nlmfeature compiled corpus", "version": VERSION, "tokens": tokens,
              "sentences": sentences, "types": len(words) - 1, "stream": stream_len,
              "blocks": len(blocks) - 1, "file_bytes": pos, "sections": sections, "source": source}
    raw = json.dumps(header, sort_keys=True).encode("utf-8")
    if 16 + len(raw) > DATA_OFFSET:
        raise NLMFeatureError(f"{out}: header too long ({len(raw)} bytes)")
    f.seek(0)
    f.write(MAGIC + struct.pack("<II", VERSION, len(raw)) + raw)


def write_repeated(corpus: "CompiledCorpus", times: int, out: str) -> "CompiledCorpus":
    """A compiled corpus holding ``corpus``'s text ``times`` times over (same vocabulary, counts
    and blocks repeated): large corpora for memory measurements without compiling large texts."""
    from nlmfeature.io.atomicfile import atomic_open, check_output

    if times < 1:
        raise NLMFeatureError("the repeat count must be >= 1")
    check_output(out, "compiled corpus")
    h = hashlib.sha256()
    ids = corpus.ids
    step = 1 << 24
    with atomic_open(out, suffix=".tmp") as f:
        f.write(b"\0" * DATA_OFFSET)
        for _ in range(times):
            for a in range(0, len(ids), step):
                b = ids[a:a + step].tobytes()
                f.write(b)
                h.update(b)
        n = len(ids)
        blocks = np.concatenate([np.asarray(corpus.blocks[:-1]) + k * n for k in range(times)] + [[times * n]])
        _finish(f, out, h.hexdigest(), corpus.tokens * times, corpus.sentences * times,
                np.asarray(corpus.counts, dtype=np.uint64) * np.uint64(times), corpus.words, blocks.tolist(),
                {"repeated": os.path.realpath(corpus.path), "times": int(times)})
    return CompiledCorpus(out)


class CompiledCorpus:
    """A compiled corpus file, memory-mapped and checked completely when opened (see the
    module doc).  ``ids`` is the uint32 id stream; ``words`` and ``counts`` the vocabulary."""

    def __init__(self, path: str, verify: bool = True) -> None:
        self.path = path
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise InputError(path, 0, f"cannot open: {exc.strerror or exc}") from None
        try:
            size = os.fstat(fd).st_size
            if size < 16:
                raise InputError(path, 0, "not an nlmfeature compiled corpus (too short)")
            self._mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        mm = self._mm
        if mm[:8] != MAGIC:
            raise InputError(path, 0, "not an nlmfeature compiled corpus (bad magic bytes)")
        version, hlen = struct.unpack("<II", mm[8:16])
        if version != VERSION:
            raise InputError(path, 0, f"compiled corpus format version {version}; this nlmfeature reads "
                             f"version {VERSION}: compile the text again")
        try:
            self.header = json.loads(bytes(mm[16:16 + hlen]).decode("utf-8"))
            secs = self.header["sections"]
            if self.header["file_bytes"] != size:
                raise InputError(path, 0, f"truncated or extended: {size} bytes, the header says "
                                 f"{self.header['file_bytes']}")
            for name in ("ids", "counts", "vocab", "blocks"):
                s = secs[name]
                if s["offset"] < DATA_OFFSET or s["offset"] + s["bytes"] > size:
                    raise InputError(path, 0, f"section {name} lies outside the file")
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(path, 0, f"unreadable compiled-corpus header ({exc})") from None
        self.ids = np.frombuffer(mm, dtype="<u4", count=secs["ids"]["bytes"] // 4, offset=secs["ids"]["offset"])
        self.counts = np.frombuffer(mm, dtype="<u8", count=secs["counts"]["bytes"] // 8,
                                    offset=secs["counts"]["offset"])
        self.blocks = np.frombuffer(mm, dtype="<i8", count=secs["blocks"]["bytes"] // 8,
                                    offset=secs["blocks"]["offset"])
        if verify:
            self.verify()
        v = secs["vocab"]
        self._vocab_raw = bytes(mm[v["offset"]:v["offset"] + v["bytes"]])
        nl = np.flatnonzero(np.frombuffer(self._vocab_raw, dtype=np.uint8) == 10)
        if len(nl) != len(self.counts) - 1:
            raise InputError(path, 0, "corrupt: the word list does not match the counts")
        # word i is _vocab_raw[_bounds[i] + 1:_bounds[i + 1]]; the list of every word is decoded
        # only where it is asked for (training looks at the words it keeps)
        self._bounds = np.concatenate(([-1], nl, [len(self._vocab_raw)]))
        self._words: Optional[List[str]] = None

    @property
    def words(self) -> List[str]:
        """Every word of the text in id order (id 0: the empty string, for ``</s>``); decoded
        on first use, one Python string per word type."""
        if self._words is None:
            self._words = self._vocab_raw.decode("utf-8").split("\n")
        return self._words

    def word(self, i: int) -> str:
        """The word of id ``i`` (without decoding the others)."""
        return self._vocab_raw[self._bounds[i] + 1:self._bounds[i + 1]].decode("utf-8")

    def verify(self) -> None:
        """Check every section's SHA-256 and the structure (raises :class:`InputError`)."""
        secs, mm, path = self.header["sections"], self._mm, self.path
        for name, s in secs.items():
            h = hashlib.sha256()
            a, n = s["offset"], s["bytes"]
            step = 1 << 24
            for o in range(a, a + n, step):
                h.update(mm[o:min(a + n, o + step)])
                self.release(o, min(a + n, o + step))
            if h.hexdigest() != s["sha256"]:
                raise InputError(path, 0, f"corrupt: the checksum of section {name} does not match")
        hd = self.header
        if (len(self.ids) != hd["stream"] or len(self.counts) != hd["types"] + 1
                or len(self.blocks) != hd["blocks"] + 1 or self.blocks[0] != 0 or self.blocks[-1] != hd["stream"]
                or np.any(np.diff(self.blocks) <= 0)):
            raise InputError(path, 0, "corrupt: inconsistent sizes")
        from nlmfeature import _train

        mx, ends = 0, 0
        step = 1 << 24
        for o in range(0, len(self.ids), step):
            m, e = _train.stream_stats(self.ids[o:o + step])
            mx, ends = max(mx, m), ends + e
            self.release_ids(o, o + step)
        if mx > hd["types"] or ends != hd["sentences"] or (len(self.ids) and self.ids[-1] != 0):
            raise InputError(path, 0, "corrupt: the id stream does not match the vocabulary")
        if int(self.counts[0]) != hd["sentences"]:
            raise InputError(path, 0, "corrupt: the counts do not match the id stream")

    def release(self, start: int, end: int) -> None:
        """Drop the pages of bytes [start, end) from this process's memory (they stay in the page
        cache): streaming passes call it behind them so that the resident memory of a pass over
        the whole corpus does not grow with the corpus."""
        page = mmap.PAGESIZE
        a = start // page * page
        b = min(len(self._mm), (end + page - 1) // page * page)
        if b > a:
            try:
                self._mm.madvise(mmap.MADV_DONTNEED, a, b - a)
            except (AttributeError, OSError, ValueError):   # no madvise here: only the RSS figure differs
                pass

    def release_ids(self, first: int, last: int) -> None:
        """:meth:`release` of the id stream's entries [first, last)."""
        off = self.header["sections"]["ids"]["offset"]
        self.release(off + 4 * max(0, first), off + 4 * min(len(self.ids), last))

    @property
    def tokens(self) -> int:
        """Words of the text (sentence ends not included)."""
        return int(self.header["tokens"])

    @property
    def sentences(self) -> int:
        return int(self.header["sentences"])

    def __len__(self) -> int:
        """N-grams of the text: its words plus one ``</s>`` per sentence."""
        return int(self.header["stream"])

    def word_counts(self) -> Dict[str, int]:
        """Count of every word of the text (O(vocabulary))."""
        return dict(zip(self.words[1:], self.counts[1:].tolist()))

    def vocabulary(self, min_count: int = 1, max_vocab: Optional[int] = None) -> Tuple[Vocabulary, np.ndarray, np.ndarray]:
        """(vocabulary, count of every vocabulary id, map from corpus id to vocabulary id):
        the vocabulary rules of :func:`nlmfeature.training.corpus.build_vocabulary` (words below
        ``min_count`` and beyond ``max_vocab`` become ``<unk>``; ``</s>`` counted once per
        sentence; ``<s>`` and ``<null>`` never)."""
        c = self.counts
        keep = np.flatnonzero(c[1:] >= max(1, min_count)) + 1
        if max_vocab is not None and len(keep) > max_vocab:   # words below the max_vocab-th count
            cut = np.partition(c[keep], len(keep) - max_vocab)[len(keep) - max_vocab]   # cannot be kept
            keep = keep[c[keep] >= cut]
        # only those words are decoded and looked at (a compiled text holds no special token):
        # the Python objects of the choice grow with the vocabulary kept, not with the text's types
        words = [self.word(i) for i in keep]
        vocab = Vocabulary.from_counts(dict(zip(words, c[keep].tolist())), min_count=max(1, min_count),
                                       max_size=max_vocab)
        remap = np.full(len(c), vocab.unk, dtype=np.int32)
        remap[keep] = vocab.ids(words)
        remap[0] = vocab.eos
        counts, remap = self.counts_in(vocab, remap)
        return vocab, counts, remap

    def counts_in(self, vocab: Vocabulary, remap: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """(count of every id of ``vocab`` in this corpus, map from corpus id to ``vocab`` id):
        the corpus read with a vocabulary of its own or another's (words it lacks: ``<unk>``;
        ``<s>`` and ``<null>`` never counted); ``remap`` when the caller has it."""
        remap = self.remap_to(vocab) if remap is None else remap
        counts = np.bincount(remap, weights=self.counts.astype(np.float64), minlength=len(vocab))
        counts[vocab.bos] = 0
        counts[vocab.null] = 0
        return counts, remap

    def remap_to(self, vocab: Vocabulary) -> np.ndarray:
        """Map from corpus id to the id of ``vocab`` (unknown words: ``<unk>``)."""
        remap = np.fromiter((vocab.id(w) for w in self.words), dtype=np.int32, count=len(self.words))
        remap[0] = vocab.eos
        return remap

    def close(self) -> None:
        self.ids = self.counts = self.blocks = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:   # arrays still viewing the map: the GC closes it later
            pass


@dataclass
class Window:
    """One shuffle window: the blocks it holds and the n-grams it yields."""

    blocks: np.ndarray
    ngrams: int


class NgramStream:
    """The n-grams of a compiled corpus (contexts of ``order - 1`` ids padded with ``<s>``, words
    in the ids of a vocabulary), served in minibatches in a seeded shuffled order with bounded
    memory (see the module doc).  ``reverse`` reads every sentence backwards."""

    def __init__(self, corpus: CompiledCorpus, remap: np.ndarray, bos: int, order: int,
                 reverse: bool = False, window_tokens: int = WINDOW_TOKENS) -> None:
        self.corpus = corpus
        self.remap = np.ascontiguousarray(remap, dtype=np.int32)
        self.bos = int(bos)
        self.order = int(order)
        self.reverse = bool(reverse)
        self.sizes = np.diff(corpus.blocks)
        self.window_tokens = max(1, int(window_tokens))

    def __len__(self) -> int:
        return len(self.corpus)

    def block_ngrams(self, blocks: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(contexts (N, order-1) int32, words (N,) int32) of the given blocks, in order."""
        ctx, words, _ = self._stream(blocks, True)
        return ctx, words

    def block_words(self, blocks: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(words (N,) int32, depths (N,) uint8) of the n-grams of the given blocks, in order:
        each n-gram's word and its position in its sentence, capped at order-1, from which
        :meth:`gather` builds the contexts that :meth:`block_ngrams` would give."""
        _, words, depth = self._stream(blocks, False)
        return words, depth

    def _stream(self, blocks: np.ndarray, contexts: bool
                ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
        """(contexts or an empty array, words, depths or None) of the given blocks
        (:func:`nlmfeature._train.stream_ngrams`); their pages of the id stream are released."""
        from nlmfeature import _train

        starts = np.ascontiguousarray(self.corpus.blocks[blocks], dtype=np.int64)
        ends = np.ascontiguousarray(self.corpus.blocks[np.asarray(blocks) + 1], dtype=np.int64)
        n = int((ends - starts).sum())
        ctx = np.empty((n if contexts else 0, self.order - 1), dtype=np.int32)
        words = np.empty(n, dtype=np.int32)
        depth = None if contexts else np.empty(n, dtype=np.uint8)
        _train.stream_ngrams(self.corpus.ids, starts, ends, self.remap, self.bos, self.reverse, ctx, words, depth)
        for a, b in zip(starts.tolist(), ends.tolist()):
            self.corpus.release_ids(a, b)
        return ctx, words, depth

    def gather(self, words: np.ndarray, depth: np.ndarray, idx: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(contexts, words) of the n-grams ``idx`` of a :meth:`block_words` stream."""
        from nlmfeature import _train

        idx = np.ascontiguousarray(idx, dtype=np.int64)
        ctx = np.empty((len(idx), self.order - 1), dtype=np.int32)
        out = np.empty(len(idx), dtype=np.int32)
        _train.gather_contexts(words, depth, idx, self.bos, ctx, out)
        return ctx, out

    def chunks(self, size: int = CHUNK_NGRAMS) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """All n-grams in text order, in chunks of whole blocks (about ``size`` n-grams each)."""
        nb = len(self.sizes)
        b = 0
        while b < nb:
            e, tot = b, 0
            while e < nb and (e == b or tot + self.sizes[e] <= size):
                tot += int(self.sizes[e])
                e += 1
            yield self.block_ngrams(np.arange(b, e))
            b = e

    def windows(self, epoch: int, seed: int) -> List[Window]:
        """The shuffle windows of an epoch: the blocks in the order of
        ``numpy.random.default_rng([seed, epoch])``, cut into runs of about ``window_tokens``."""
        order = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)]).permutation(len(self.sizes))
        out: List[Window] = []
        cur: List[int] = []
        tot = 0
        for b in order.tolist():
            cur.append(b)
            tot += int(self.sizes[b])
            if tot >= self.window_tokens:
                out.append(Window(np.asarray(cur, dtype=np.int64), tot))
                cur, tot = [], 0
        if cur:
            out.append(Window(np.asarray(cur, dtype=np.int64), tot))
        return out

    def batches_per_epoch(self, batch: int) -> int:
        """Minibatches of ``batch`` n-grams in an epoch (the last may be shorter)."""
        return max(1, -(-len(self) // batch))

    def batches(self, epoch: int, seed: int, batch: int, start: int = 0
                ) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """(contexts, words) of every minibatch of an epoch from number ``start`` on.

        The epoch's n-grams are its windows' n-grams one window after another, each window's
        permuted by ``numpy.random.default_rng([seed, epoch, w + 1])``; minibatch k holds
        n-grams ``k*batch`` to ``(k+1)*batch`` of that sequence (it may span two windows).
        Only the windows a minibatch needs are built."""
        first = start * batch
        pos = 0
        carry_c: Optional[np.ndarray] = None
        carry_w: Optional[np.ndarray] = None
        for wi, w in enumerate(self.windows(epoch, seed)):
            if pos + w.ngrams <= first:
                pos += w.ngrams
                continue
            words, depth = self.block_words(w.blocks)
            perm = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), wi + 1]).permutation(len(words))
            skip = max(0, first - pos)
            pos += w.ngrams
            j = skip
            if carry_c is not None:
                need = batch - len(carry_w)
                idx = np.sort(perm[:need])
                more_c, more_w = self.gather(words, depth, idx)
                carry_c = np.concatenate([carry_c, more_c])
                carry_w = np.concatenate([carry_w, more_w])
                j = len(idx)
                if len(carry_w) < batch:   # a window shorter than what the minibatch lacks
                    continue
                yield carry_c, carry_w
                carry_c = carry_w = None
            full = (len(perm) - j) // batch
            for k0 in range(0, full, GATHER_BATCHES):
                # GATHER_BATCHES minibatches in one gather (each one's n-grams in corpus order);
                # the minibatches are then slices of it
                k1 = min(full, k0 + GATHER_BATCHES)
                idx = np.sort(perm[j + k0 * batch:j + k1 * batch].reshape(k1 - k0, batch), axis=1).ravel()
                gc, gw = self.gather(words, depth, idx)
                for k in range(k1 - k0):
                    yield gc[k * batch:(k + 1) * batch], gw[k * batch:(k + 1) * batch]
            j += full * batch
            if j < len(perm):
                idx = np.sort(perm[j:])
                carry_c, carry_w = self.gather(words, depth, idx)
            del words, depth, perm
        if carry_c is not None:
            yield carry_c, carry_w




def default_corpus_dir() -> str:
    """Where texts given to ``train`` are compiled: ``$XDG_CACHE_HOME/nlmfeature/corpora`` (or
    ``~/.cache/nlmfeature/corpora``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nlmfeature", "corpora")


def is_compiled(path: str) -> bool:
    """Whether ``path`` is a compiled corpus (by its magic bytes)."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == MAGIC
    except OSError:
        return False


def open_corpus(path: str, corpus_dir: Optional[str] = None, progress=None) -> CompiledCorpus:
    """A compiled corpus for ``path``: the file itself when it is one, else the text compiled
    into ``corpus_dir`` (default :func:`default_corpus_dir`; reused while the text is unchanged)."""
    from nlmfeature.io import textio

    textio.check_input(path)
    if is_compiled(path):
        return CompiledCorpus(path)
    d = corpus_dir or default_corpus_dir()
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as exc:
        raise NLMFeatureError(f"corpus folder {d}: cannot create it ({exc.strerror or exc}); "
                              "choose another with --corpus-dir") from None
    real = os.path.realpath(path)
    key = hashlib.sha256(real.encode("utf-8")).hexdigest()[:16]
    name = os.path.basename(real)
    for ext in (".gz", ".bz2", ".xz"):
        name = name[:-len(ext)] if name.endswith(ext) else name
    return compile_corpus(path, os.path.join(d, f"{name}.{key}{SUFFIX}"), progress=progress)


def heldout_ngrams(path: str, vocab: Vocabulary, order: int, reverse: bool = False,
                   corpus_dir: Optional[str] = None):
    """(:class:`~nlmfeature.training.corpus.NgramData`, out-of-vocabulary tokens) of a held-out
    text, read through its compiled corpus.  Raises :class:`InputError` when every token is
    outside the vocabulary (its perplexity would say nothing about the model)."""
    from nlmfeature.training.corpus import NgramData

    corpus = open_corpus(path, corpus_dir)
    remap = corpus.remap_to(vocab)
    unk_ids = remap == vocab.unk
    unk_ids[0] = False
    oov = int(corpus.counts[unk_ids].sum())
    if oov == corpus.tokens:
        raise InputError(path, 0, f"every one of the {corpus.tokens} test-set tokens is outside the "
                         f"{len(vocab)}-word vocabulary: is this the right file (same language, "
                         "same tokenisation)?")
    stream = NgramStream(corpus, remap, vocab.bos, order, reverse)
    parts = list(stream.chunks())
    ctx = np.concatenate([c for c, _ in parts]) if len(parts) > 1 else parts[0][0]
    words = np.concatenate([w for _, w in parts]) if len(parts) > 1 else parts[0][1]
    ends = np.flatnonzero(words == vocab.eos)
    starts = np.zeros(len(ends) + 1, dtype=np.int64)
    starts[1:] = ends + 1
    return NgramData(ctx, words, starts), oov


__all__ = ["compile_corpus", "CompiledCorpus", "NgramStream", "open_corpus", "heldout_ngrams", "is_compiled",
           "default_corpus_dir", "source_identity", "MAGIC", "VERSION", "SUFFIX"]
