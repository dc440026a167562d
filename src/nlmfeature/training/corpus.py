"""Training text -> vocabulary and n-gram id arrays.

Input is tokenised text, one sentence per line, plain or gzip-compressed (``.gz``), UTF-8.
Each sentence becomes the n-grams the scorer sees: every word and ``</s>``, each after a
context of the n-1 previous ids, left-padded with ``<s>`` (the padding of
:meth:`nlmfeature.Model.sentence_ngrams`).  Words outside the vocabulary become ``<unk>``.

Bad input raises :class:`nlmfeature.errors.InputError` naming the file and line: bytes
that are not UTF-8, a file without a single token, a missing file.  Empty lines are
skipped (they are not sentences).
"""
from __future__ import annotations

import os
from collections import Counter
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from nlmfeature.io import textio
from nlmfeature.errors import InputError
from nlmfeature.core.ngramdata import NgramData
from nlmfeature.core.vocab import SPECIALS, Vocabulary


def read_sentences(path: str) -> Iterator[Tuple[int, List[str]]]:
    """Yield (line number, tokens) for every non-empty line of a text file (plain or .gz).

    Raises :class:`InputError` (file:line) on bytes that are not UTF-8.
    """
    for lineno, line in textio.iter_lines(path):
        toks = textio.split_tokens(line)
        if toks:
            yield lineno, toks


def read_lines(path: str) -> List[List[str]]:
    """All non-empty sentences of a file as token lists (see :func:`read_sentences`)."""
    return [toks for _, toks in read_sentences(path)]


def check_special_tokens(path: str, sentences: Sequence[Sequence[str]]) -> None:
    """Reject literal ``<s>``, ``</s>`` and ``<null>`` tokens, which training adds itself.

    (``<unk>`` in the text is fine: it is the unknown word.)
    """
    for i, toks in enumerate(sentences):
        for t in toks:
            if t in ("<s>", "</s>", "<null>"):
                raise InputError(path, 0, f"sentence {i + 1} contains the reserved token {t!r}; "
                                 "sentence boundaries are added by nlmfeature, remove them from the text")


def build_vocabulary(sentences: Sequence[Sequence[str]], min_count: int = 1,
                     max_vocab: Optional[int] = None) -> Tuple[Vocabulary, np.ndarray]:
    """Vocabulary of words seen at least ``min_count`` times (at most ``max_vocab`` entries in
    all, specials included) and the training count of every id.

    Words below the cut-off are counted as ``<unk>``; ``</s>`` is counted once per sentence;
    ``<s>`` and ``<null>`` are never predicted and get count 0.
    """
    counts: Counter = Counter()
    for toks in sentences:
        counts.update(toks)
    vocab = Vocabulary.from_counts(counts, min_count=max(1, min_count), max_size=max_vocab)
    ids = np.zeros(len(vocab), dtype=np.float64)
    for w, c in counts.items():
        ids[vocab.id(w)] += c
    ids[vocab.eos] += len(sentences)
    ids[vocab.bos] = 0
    ids[vocab.null] = 0
    return vocab, ids


def ngrams(sentences: Sequence[Sequence[str]], vocab: Vocabulary, order: int) -> NgramData:
    """Vectorised :meth:`Model.sentence_ngrams` over many sentences (``<s>`` padding)."""
    c = order - 1
    lengths = np.fromiter((len(t) + 1 for t in sentences), dtype=np.int64, count=len(sentences))
    total = int(lengths.sum())
    words = np.empty(total, dtype=np.int32)
    pos = 0
    for toks in sentences:
        n = len(toks)
        words[pos:pos + n] = vocab.ids(toks)
        words[pos + n] = vocab.eos
        pos += n + 1
    starts = np.zeros(len(sentences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    # stream: each sentence preceded by c <s>; n-gram i reads stream[p_i - c : p_i]
    stream_len = total + c * len(sentences)
    stream = np.full(stream_len, vocab.bos, dtype=np.int32)
    sent_of = np.repeat(np.arange(len(sentences)), lengths)
    p = np.arange(total) + c * (sent_of + 1)
    stream[p] = words
    ctx = np.empty((total, c), dtype=np.int32)
    for j in range(c):
        ctx[:, j] = stream[p - c + j]
    return NgramData(ctx, words, starts)


def read_corpus(path: str) -> List[List[str]]:
    """Read a training text; raises :class:`InputError` if it holds no token at all."""
    if not os.path.exists(path):
        raise InputError(path, 0, "no such file")
    sents = read_lines(path)
    if not sents:
        raise InputError(path, 0, "the corpus is empty (no tokens): nothing to train on")
    check_special_tokens(path, sents)
    return sents


__all__ = ["read_sentences", "read_lines", "read_corpus", "build_vocabulary",
           "ngrams", "NgramData", "check_special_tokens", "SPECIALS"]
