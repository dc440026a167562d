"""Vocabulary: UTF-8 words <-> integer ids, with the special tokens every model has.

Ids 0..3 are always ``<unk>``, ``<s>``, ``</s>`` and ``<null>`` (NPLM's order), followed by
the words, usually by decreasing frequency.  A vocabulary is stored in the model file as
``vocab.offsets`` (int64, V+1) and ``vocab.bytes`` (the UTF-8 words back to back), plus
``vocab.hash``, an open-addressing table the native code uses for word -> id lookups.
"""
from __future__ import annotations

import re
import threading
from collections import Counter
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np

from nlmfeature.io.textio import split_tokens

UNK = "<unk>"
BOS = "<s>"
EOS = "</s>"
NULL = "<null>"
SPECIALS = (UNK, BOS, EOS, NULL)
#: the markers the model adds itself: in a text to score they are unknown words
_MARKERS = frozenset((BOS, EOS, NULL))
#: the white space that separates tokens (:func:`nlmfeature.io.textio.split_tokens`): no word
#: holds it
_SPACE = re.compile("[ \t\n\r\x0b\x0c]")


def _decode(offsets: np.ndarray, data: np.ndarray) -> List[str]:
    """The words of the ``vocab.offsets`` / ``vocab.bytes`` arrays."""
    raw = bytes(data)
    offs = np.asarray(offsets).tolist()
    try:
        return [raw[a:b].decode("utf-8") for a, b in zip(offs[:-1], offs[1:])]
    except UnicodeDecodeError as exc:
        raise ValueError(f"vocabulary is not valid UTF-8: {exc}") from None


#: one thread decodes a lazy vocabulary
_DECODING = threading.Lock()


class Vocabulary:
    """An ordered list of words with constant-time lookups in both directions."""

    def __init__(self, words: Sequence[str]) -> None:
        words = list(words)
        index: Dict[str, int] = {w: i for i, w in enumerate(words)}
        if len(index) != len(words) or not all(isinstance(w, str) and w for w in words) \
                or _SPACE.search("".join(words)):  # the common case in one pass of C loops
            index = {}
            for i, w in enumerate(words):
                if not isinstance(w, str) or not w or _SPACE.search(w):
                    raise ValueError(f"vocabulary entry {i} ({w!r}) is empty or contains white space")
                if w in index:
                    raise ValueError(f"vocabulary entry {i} ({w!r}) is a duplicate")
                index[w] = i
        missing = [s for s in SPECIALS if s not in index]
        if missing:
            raise ValueError(f"vocabulary lacks the special tokens {missing}")
        self._words = words
        self._index = index
        self.unk = index[UNK]
        self.bos = index[BOS]
        self.eos = index[EOS]
        self.null = index[NULL]

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_counts(cls, counts: Counter, min_count: int = 1,
                    max_size: Optional[int] = None) -> "Vocabulary":
        """Specials first, then words with ``count >= min_count`` by decreasing count (ties by
        spelling), at most ``max_size`` entries in all."""
        kept = [w for w, c in counts.items() if c >= min_count and w not in SPECIALS]
        kept.sort(key=lambda w: (-counts[w], w))
        if max_size is not None:
            kept = kept[: max(0, max_size - len(SPECIALS))]
        return cls(list(SPECIALS) + kept)

    @classmethod
    def from_arrays(cls, offsets: np.ndarray, data: np.ndarray, lazy: bool = False) -> "Vocabulary":
        """Decode the ``vocab.offsets`` / ``vocab.bytes`` arrays of a model file.  ``lazy``
        decodes them on the first lookup by word or id (arrays a model file's validation has
        checked, whose specials are at ids 0-3): a decoder, which looks words up in the
        file's own table through the C library, never holds the words as Python strings."""
        if not lazy:
            return cls(_decode(offsets, data))
        v = cls.__new__(cls)
        v._size = len(offsets) - 1
        v._raw = (offsets, data)
        v.unk, v.bos, v.eos, v.null = range(len(SPECIALS))
        return v

    def __getattr__(self, name: str):
        # the words and their index of a lazy vocabulary (from_arrays), decoded once
        if name not in ("_words", "_index") or "_raw" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        with _DECODING:
            if "_words" not in self.__dict__:
                full = Vocabulary(_decode(*self._raw))
                if (full.unk, full.bos, full.eos, full.null) != (self.unk, self.bos, self.eos, self.null):
                    raise ValueError("vocabulary's special tokens are not at ids 0-3")
                self._index = full._index
                self._words = full._words
        return self.__dict__[name]

    def to_arrays(self) -> Dict[str, np.ndarray]:
        """The arrays stored in a model file for this vocabulary."""
        from nlmfeature._scorer import vocab_hash_table

        encoded = [w.encode("utf-8") for w in self._words]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        data = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
        return {"vocab.offsets": offsets, "vocab.bytes": data,
                "vocab.hash": vocab_hash_table(offsets, data)}

    # -- lookups ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._size if "_raw" in self.__dict__ else len(self._words)

    def __iter__(self) -> Iterator[str]:
        return iter(self._words)

    def __contains__(self, word: object) -> bool:
        return word in self._index

    def __getitem__(self, wid: int) -> str:
        return self._words[wid]

    def text_ids(self, words: Iterable[str]) -> np.ndarray:
        """Ids of the words of a text to score, as training reads them: unknown words and a
        literal ``<s>``, ``</s>`` or ``<null>`` (never a word of training text: markers the
        model adds itself) are ``<unk>``."""
        if isinstance(words, str):
            words = split_tokens(words)
        elif not isinstance(words, (list, tuple)):
            words = list(words)
        get, unk = self._index.get, self.unk
        if not _MARKERS.isdisjoint(words):      # (rare: the common case costs one pass in C)
            return np.fromiter((unk if w in _MARKERS else get(w, unk) for w in words),
                               dtype=np.int32, count=len(words))
        return np.fromiter((get(w, unk) for w in words), dtype=np.int32, count=len(words))

    def is_oov(self, word: str) -> bool:
        """Whether a word of a text counts as out of vocabulary: it is scored as ``<unk>``
        (:meth:`text_ids`): not in the vocabulary, the literal ``<unk>``, or a literal marker
        ``<s>``, ``</s>``, ``<null>``, as KenLM's ``query`` counts OOVs.  The one rule behind
        every OOV count and flag (perplexity, ``full_scores``, ``score``,
        ``rescore --oov-feature``)."""
        return word in _MARKERS or self._index.get(word, self.unk) == self.unk

    def id(self, word: str) -> int:
        """Id of ``word``; ``<unk>``'s id for an unknown word."""
        return self._index.get(word, self.unk)

    def ids(self, words: Iterable[str]) -> np.ndarray:
        """Ids of ``words`` as an int32 array (unknown words -> ``<unk>``); a string is split
        on white space (not iterated character by character)."""
        if isinstance(words, str):
            words = split_tokens(words)
        get, unk = self._index.get, self.unk
        return np.fromiter((get(w, unk) for w in words), dtype=np.int32)

    @property
    def words(self) -> List[str]:
        """All words, in id order (a copy)."""
        return list(self._words)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self._words == other._words

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} words)"


def count_words(lines: Iterable[str]) -> Counter:
    """Token counts of whitespace-tokenised lines."""
    counts: Counter = Counter()
    for line in lines:
        counts.update(split_tokens(line))
    return counts
