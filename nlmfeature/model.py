"""The Python API: load a model, score n-grams and sentences, compute perplexity.

All scores are **natural logarithms** (base e), as Moses and NPLM use; divide by ln(10)
for KenLM-style log10.  For unnormalised (NCE / self-normalised) output layers the score is
the raw network output, which training makes approximately a log-probability.

>>> import nlmfeature
>>> lm = nlmfeature.load("model.nlm")                     # doctest: +SKIP
>>> lm.score(["the", "cat"], "sat")                      # doctest: +SKIP
>>> lm.score_sentence("the cat sat".split())              # doctest: +SKIP
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import modelfile
from ._scorer import NativeModel, Session
from .vocab import Vocabulary

Tokens = Union[str, Sequence[str]]

#: default bound on the entries of each per-sentence cache of a session
DEFAULT_CACHE_ENTRIES = 1 << 18


@dataclass
class Perplexity:
    """Result of :meth:`Model.perplexity`.  ``perplexity = exp(-log_prob / tokens)``."""

    perplexity: float
    log_prob: float        #: natural-log probability of all counted tokens
    tokens: int            #: counted tokens (words and one ``</s>`` per sentence)
    sentences: int
    oovs: int              #: tokens not in the vocabulary (scored as ``<unk>`` unless excluded)
    oovs_excluded: bool

    def as_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)


def _tokens(sentence: Tokens) -> List[str]:
    return sentence.split() if isinstance(sentence, str) else list(sentence)


class Model:
    """A loaded (memory-mapped) neural language model.  Thread-safe: share one ``Model``
    and give each thread its own :meth:`session`."""

    def __init__(self, path: str, header: Dict[str, Any], arrays: Dict[str, np.ndarray],
                 checksum: str, use_tables: bool = True) -> None:
        self.path = path
        self.header = header
        self.arrays = arrays
        self.checksum = checksum
        self.vocab = Vocabulary.from_arrays(arrays["vocab.offsets"], arrays["vocab.bytes"])
        self.native = NativeModel(header, arrays, use_tables)
        self._session: Optional[Session] = None
        self._batch = None

    # -- description --------------------------------------------------------------------
    @property
    def order(self) -> int:
        """n: the model scores a word given the n-1 words before it."""
        return int(self.header["order"])

    @property
    def output_type(self) -> str:
        """``unnormalised``, ``softmax``, ``class`` or ``tree``."""
        return str(self.header["output"]["type"])

    @property
    def normalised(self) -> bool:
        """Whether scores are exact log-probabilities (softmax, class- and tree-factored)."""
        return self.output_type != "unnormalised"

    def describe(self) -> Dict[str, Any]:
        """Architecture summary (what ``nlmfeature info`` prints)."""
        h = self.header
        return {
            "path": self.path, "checksum": self.checksum, "arch": h["arch"], "order": h["order"],
            "vocab_size": h["vocab_size"], "embed_dim": h["embed_dim"],
            "first_layer": [f"{'diagonal' if b['diagonal'] else 'full'} {b['hidden']} {b['activation']}"
                            for b in h["branches"]],
            "combine": h["combine"], "hidden_layers": [f"{l['n_out']} {l['activation']}" for l in h["layers"]],
            "output": h["output"], "direct": h.get("direct"), "precomputed_tables": h.get("precomputed", False),
            "storage": h.get("storage", "float32"),
            "parameters": int(sum(a.size for n, a in self.arrays.items()
                                  if a.dtype.kind == "f" and not n.endswith(".tables") and n != "unigram")),
            "metadata": h.get("metadata", {}),
        }

    # -- ids ----------------------------------------------------------------------------
    def ids(self, words: Iterable[str]) -> np.ndarray:
        """Vocabulary ids (int32) of ``words``; unknown words map to ``<unk>``."""
        return self.vocab.ids(words)

    def pad(self, history_ids: Sequence[int]) -> np.ndarray:
        """The n-1 context ids the model sees for a history (oldest first): the last n-1 ids,
        left-padded with ``<s>`` if the history starts with ``<s>``, else with ``<null>``."""
        return self.native.pad_context(np.ascontiguousarray(history_ids, dtype=np.int32))

    def sentence_ngrams(self, sentence: Tokens, bos: bool = True, eos: bool = True,
                        ) -> Tuple[np.ndarray, np.ndarray]:
        """(contexts (N, n-1), words (N,)) of a sentence: every word and ``</s>``, each after
        ``<s>`` and the words before it (``bos``), padded as :meth:`pad` does."""
        ids = self.ids(_tokens(sentence))
        v = self.vocab
        if eos:
            ids = np.append(ids, np.int32(v.eos))
        c = self.order - 1
        if bos:  # histories start with <s>, so padding is <s> too: a sliding window
            hist = np.concatenate([np.full(c + 1, v.bos, dtype=np.int32), ids[:-1]]) if len(ids) else ids
            ctx = np.lib.stride_tricks.sliding_window_view(hist[1:], c)[: len(ids)].copy() if c \
                else np.empty((len(ids), 0), dtype=np.int32)
            return np.ascontiguousarray(ctx, dtype=np.int32), ids.astype(np.int32)
        ctx = np.empty((len(ids), c), dtype=np.int32)
        for i in range(len(ids)):
            ctx[i] = self.native.pad_context(np.ascontiguousarray(ids[max(0, i - c):i]))
        return ctx, ids.astype(np.int32)

    # -- scoring ------------------------------------------------------------------------
    def session(self, cache_entries: int = DEFAULT_CACHE_ENTRIES, ngram_entries: int = -1) -> Session:
        """A new :class:`Session` (per-thread scorer with per-sentence caches).
        ``cache_entries`` bounds the context and class-normaliser caches (0 turns caching
        off); ``ngram_entries`` bounds the exact n-gram score cache (-1: ``4 * cache_entries``
        when a lookup costs more than a probe, i.e. normalised outputs or dense layers;
        0: off)."""
        return self.native.session(cache_entries, ngram_entries)

    def _default_session(self) -> Session:
        if self._session is None:
            self._session = self.session()
        return self._session

    def score(self, context: Sequence[str], word: str) -> float:
        """Natural-log score of ``word`` after ``context`` (oldest word first).  Not
        thread-safe (it uses the model's own session); threads use :meth:`session`."""
        s = self._default_session()
        s.begin_sentence()
        return float(s.score(self.ids(context), self.vocab.id(word)))

    def score_sentence(self, sentence: Tokens, bos: bool = True, eos: bool = True) -> np.ndarray:
        """Per-token natural-log scores of a sentence's words (and of ``</s>`` if ``eos``)."""
        ctx, words = self.sentence_ngrams(sentence, bos, eos)
        s = self._default_session()
        s.begin_sentence()
        return s.score_padded(ctx, words)

    def sentence_logprob(self, sentence: Tokens) -> float:
        """Sum of :meth:`score_sentence`: the sentence's natural-log probability."""
        return float(self.score_sentence(sentence).sum())

    def _batcher(self):
        if self._batch is None:
            from .batch import BatchScorer
            self._batch = BatchScorer(self)
        return self._batch

    @property
    def context_width(self) -> int:
        """Ids in a padded context: n-1 (joint models: the source window first, then n-1)."""
        return int(self.native.key_len)

    def _check_contexts(self, contexts: np.ndarray) -> None:
        w = self.native.source_window
        if contexts.size and w:
            src, tgt = contexts[:, :w], contexts[:, w:]
            if src.min() < 0 or src.max() >= int(self.header["source"]["vocab_size"]):
                raise ValueError("contexts hold source-window ids outside the source vocabulary")
            if tgt.size and (tgt.min() < 0 or tgt.max() >= len(self.vocab)):
                raise ValueError("contexts hold ids outside the vocabulary")
        elif contexts.size and (contexts.min() < 0 or contexts.max() >= len(self.vocab)):
            raise ValueError("contexts hold ids outside the vocabulary")

    def hidden(self, contexts: np.ndarray) -> np.ndarray:
        """Final hidden vectors (N, D) of padded contexts (N, n-1): what the output layer
        sees (for whole-vocabulary distributions, analyses)."""
        contexts = np.ascontiguousarray(contexts, dtype=np.int32)
        if contexts.ndim != 2 or contexts.shape[1] != self.context_width:
            raise ValueError(f"contexts must have shape (N, {self.context_width})")
        self._check_contexts(contexts)
        return self._batcher().hidden(contexts)

    def score_batch(self, contexts: np.ndarray, words: np.ndarray) -> np.ndarray:
        """Scores of many n-grams at once through matrix products (k-best lists, perplexity).
        ``contexts`` are padded (N, n-1) int32 ids; equals the one-at-a-time scorer to float
        rounding."""
        contexts = np.asarray(contexts)
        if contexts.ndim != 2 or contexts.shape[1] != self.context_width or len(contexts) != len(words):
            raise ValueError(f"contexts must have shape (N, {self.context_width}) with N = len(words)")
        self._check_contexts(contexts)
        return self._batcher().score(np.ascontiguousarray(contexts, dtype=np.int32),
                                 np.ascontiguousarray(words, dtype=np.int32))

    def score_sentences(self, sentences: Iterable[Tokens], batch_size: int = 8192) -> List[float]:
        """Natural-log probabilities of many sentences, scored in batches."""
        out: List[float] = []
        ctxs: List[np.ndarray] = []
        words: List[np.ndarray] = []
        lengths: List[int] = []
        pending = 0

        def flush() -> None:
            nonlocal pending
            if not lengths:
                return
            scores = self.score_batch(np.concatenate(ctxs), np.concatenate(words))
            bounds = np.cumsum([0] + lengths)
            out.extend(float(scores[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:]))
            ctxs.clear(); words.clear(); lengths.clear()
            pending = 0

        for sent in sentences:
            c, w = self.sentence_ngrams(sent)
            ctxs.append(c); words.append(w); lengths.append(len(w))
            pending += len(w)
            if pending >= batch_size:
                flush()
        flush()
        return out

    def perplexity(self, lines: Iterable[Tokens], exclude_oov: bool = False,
                   batch_size: int = 8192) -> Perplexity:
        """Perplexity over sentences (one per line), counting each word and one ``</s>`` per
        sentence.  Unknown words are scored as ``<unk>`` and counted, as KenLM's ``query``
        does, unless ``exclude_oov`` (SRILM's convention: OOV tokens are skipped)."""
        total, n_tok, n_sent, n_oov = 0.0, 0, 0, 0
        ctxs: List[np.ndarray] = []
        words: List[np.ndarray] = []
        unk = self.vocab.unk

        def flush() -> float:
            if not ctxs:
                return 0.0
            s = self.score_batch(np.concatenate(ctxs), np.concatenate(words))
            ctxs.clear(); words.clear()
            return float(s.sum())

        pending = 0
        for line in lines:
            toks = _tokens(line)
            c, w = self.sentence_ngrams(toks)
            n_sent += 1
            oov_mask = np.zeros(len(w), dtype=bool)
            oov_mask[:-1] = np.array([t not in self.vocab or t == "<unk>" for t in toks], dtype=bool) \
                if toks else np.zeros(0, dtype=bool)
            n_oov += int(oov_mask.sum())
            if exclude_oov:
                c, w = c[~oov_mask], w[~oov_mask]
            assert not exclude_oov or not np.any(w == unk) or unk == self.vocab.eos
            ctxs.append(c); words.append(w)
            n_tok += len(w)
            pending += len(w)
            if pending >= batch_size:
                total += flush()
                pending = 0
        total += flush()
        ppl = math.exp(-total / n_tok) if n_tok else float("nan")
        return Perplexity(ppl, total, n_tok, n_sent, n_oov, exclude_oov)


def load(path: str, verify: bool = True, use_tables: bool = True) -> Model:
    """Memory-map a model file and return a :class:`Model`.

    ``verify`` checks the file's checksum (one sequential read of the file);
    ``use_tables=False`` ignores precomputed first-layer tables (for comparisons).
    Raises :class:`nlmfeature.errors.ModelFileError` naming the file and the problem.
    """
    header, arrays, checksum = modelfile.read_model(path, verify=verify)
    try:
        if header.get("source"):
            from .joint import JointModel
            return JointModel(path, header, arrays, checksum, use_tables)
        return Model(path, header, arrays, checksum, use_tables)
    except (ValueError, KeyError) as exc:
        raise modelfile.ModelFileError(f"{path}: wrong architecture description: {exc}") from None


def save(path: str, header: Dict[str, Any], arrays: Dict[str, np.ndarray], half: bool = False) -> str:
    """Write a model file atomically; returns its checksum.  See :mod:`nlmfeature.modelfile`."""
    return modelfile.write_model(path, header, arrays, half=half)
