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
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from nlmfeature.io import textio
from nlmfeature.errors import InputError
from nlmfeature.core.vocab import SPECIALS, Vocabulary


def read_sentences(path: str) -> Iterator[Tuple[int, List[str]]]:
    """Yield (line number, tokens) for every non-empty line of a text file (plain or .gz).

    Raises :class:`InputError` (file:line) on bytes that are not UTF-8.
    """
    for lineno, line in textio.iter_lines(path):
        toks = line.split()
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


@dataclass
class NgramData:
    """The n-grams of a text: ``contexts`` (N, n-1) int32 padded ids, ``words`` (N,) int32,
    ``sentence_starts`` (S+1,) offsets of each sentence's first n-gram."""

    contexts: np.ndarray
    words: np.ndarray
    sentence_starts: np.ndarray

    def __len__(self) -> int:
        return len(self.words)

    def batches_per_epoch(self, batch: int) -> int:
        """Minibatches of ``batch`` n-grams in an epoch (the last may be shorter)."""
        return max(1, -(-len(self.words) // batch))

    def batches(self, epoch: int, seed: int, batch: int, start: int = 0):
        """(contexts, words) of every minibatch of an epoch from number ``start`` on, in the
        order of ``numpy.random.default_rng([seed, epoch]).permutation``."""
        perm = np.random.default_rng([seed, epoch]).permutation(len(self.words))
        for k in range(start, self.batches_per_epoch(batch)):
            idx = perm[k * batch:(k + 1) * batch]
            yield self.contexts[idx], self.words[idx]

    def chunks(self, size: int = 1 << 22):
        """(contexts, words) in text order, ``size`` n-grams at a time."""
        for a in range(0, len(self.words), size):
            yield self.contexts[a:a + size], self.words[a:a + size]


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


def read_heldout(path: str, vocab: Vocabulary, order: int, reverse: bool = False) -> Tuple[NgramData, int]:
    """N-grams of a held-out text (of its sentences read backwards if ``reverse``) and the
    number of out-of-vocabulary tokens.

    Raises :class:`InputError` when the file is empty or holds only unknown words (its
    perplexity would say nothing about the model)."""
    sents = read_lines(path)
    if not sents:
        raise InputError(path, 0, "the test set is empty (no tokens)")
    check_special_tokens(path, sents)
    n_tok = sum(len(s) for s in sents)
    oov = sum(1 for s in sents for t in s if t not in vocab or t == "<unk>")
    if oov == n_tok:
        raise InputError(path, 0, f"every one of the {n_tok} test-set tokens is outside the "
                         f"{len(vocab)}-word vocabulary: is this the right file (same language, "
                         "same tokenisation)?")
    if reverse:
        sents = [s[::-1] for s in sents]
    return ngrams(sents, vocab, order), oov


__all__ = ["read_sentences", "read_lines", "read_corpus", "read_heldout", "build_vocabulary",
           "ngrams", "NgramData", "check_special_tokens", "SPECIALS"]
