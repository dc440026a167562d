"""The Python API: load a model, score n-grams and sentences, compute perplexity.

Scores are **natural logarithms** (base e), as Moses and NPLM use, except where a method
takes KenLM's name: :meth:`Model.score` and :meth:`Model.full_scores` return log10 as
KenLM's do, so code written for KenLM's Python module ports by changing the import.  For
unnormalised (NCE / self-normalised) output layers the score is the raw network output,
which training makes approximately a log-probability (it can be above 0).

>>> import nlmfeature
>>> lm = nlmfeature.load("model.nlm")                     # doctest: +SKIP
>>> lm.score("the cat sat")                               # doctest: +SKIP
>>> lm.score_ngram(["the", "cat"], "sat")                 # doctest: +SKIP
>>> lm.score_sentence("the cat sat")                      # doctest: +SKIP
>>> lm.perplexity("test.txt")                             # doctest: +SKIP

Where tokens are expected, a string is split on white space (the text is tokenised already)
and a sequence of strings is taken as it is; anything else raises :class:`TypeError`.
"""
from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass
from typing import (AbstractSet, Any, Callable, Dict, Iterable, Iterator, List, Mapping,
                    Optional, Sequence, Tuple, Union)

import numpy as np

from nlmfeature.core import modelfile
from nlmfeature.errors import InputError
from nlmfeature._scorer import DEFAULT_CACHE_ENTRIES as _DEFAULT_CACHE_ENTRIES, NativeModel, Session
from nlmfeature.io.textio import ASCII_SPACE, iter_lines, split_tokens
from nlmfeature.core.vocab import Vocabulary

Tokens = Union[str, Sequence[str]]

#: log10(e): multiply a natural log by it for KenLM's log10
LOG10_E = 1.0 / math.log(10.0)

#: default bound on the entries of each per-sentence cache of a session
DEFAULT_CACHE_ENTRIES = _DEFAULT_CACHE_ENTRIES  # NLM_DEFAULT_CACHE_ENTRIES of nlmfeature.h


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


def _tokens(sentence: Tokens, what: str = "a sentence") -> List[str]:
    """The tokens of ``sentence``: a string is split on white space (the text is tokenised
    already), a sequence of strings is taken as it is; anything else is refused."""
    if isinstance(sentence, str):
        return split_tokens(sentence)
    if isinstance(sentence, (bytes, bytearray)):
        raise TypeError(f"{what} must be str or a sequence of str tokens, not bytes "
                        "(decode it first)")
    if isinstance(sentence, np.ndarray) and sentence.dtype.kind in "iu":
        raise TypeError(f"{what} must be words, not ids (the Session API takes ids)")
    if isinstance(sentence, (Mapping, AbstractSet)) or not isinstance(sentence, Iterable):
        # a dict or set has no word order: its keys are not a sentence
        raise TypeError(f"{what} must be str or a sequence of str tokens, "
                        f"not {type(sentence).__name__}")
    try:
        toks = list(sentence)
    except TypeError:
        raise TypeError(f"{what} must be str or a sequence of str tokens, "
                        f"not {type(sentence).__name__}") from None
    for t in toks:
        if not isinstance(t, str):
            raise TypeError(f"{what} must be str or a sequence of str tokens; it holds a "
                            f"{type(t).__name__} ({t!r})")
    return toks


def _word(word: str) -> str:
    """One token: a string without white space."""
    if not isinstance(word, str):
        raise TypeError(f"the word must be one str token, not {type(word).__name__} ({word!r})")
    if len(split_tokens(word)) != 1 or word != word.strip(ASCII_SPACE):
        raise ValueError(f"the word must be one token without white space, got {word!r} "
                         "(score_sentence scores a whole sentence)")
    return word


def _flag(value: Any, name: str) -> None:
    """Refuse a non-bool flag (``bos="no"`` would be true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__} ({value!r})")


def _check_bos_eos(bos: object, eos: object, method: str) -> None:
    """Refuse a word where KenLM's ``bos`` / ``eos`` flags go: ``score(context, word)`` of
    older versions is :meth:`Model.score_ngram` now."""
    for name, value in (("bos", bos), ("eos", eos)):
        if not isinstance(value, (bool, np.bool_)):
            hint = " (one word after a context is score_ngram(context, word))" \
                if method == "score" and isinstance(value, str) else ""
            raise TypeError(f"{method}(): {name} must be a bool, not "
                            f"{type(value).__name__}{hint}")


def _lines(source: Union[str, "os.PathLike[str]", Iterable[Tokens]]) -> Iterator[Tokens]:
    """Sentences of a perplexity source: a path (str or path object; plain, .gz or ``-``)
    is read line by line, any other iterable yields sentences (lines or token lists)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if path != "-" and not os.path.exists(path):
            raise InputError(path, 0, "no such file (perplexity() reads a str as a path; give "
                                      "a list of lines to score text)")
        for _, line in iter_lines(path):
            yield line
        return
    if isinstance(source, (bytes, bytearray)):
        raise TypeError("perplexity() takes a path or an iterable of sentences, not bytes")
    try:
        it = iter(source)
    except TypeError:
        raise TypeError("perplexity() takes a path or an iterable of sentences, "
                        f"not {type(source).__name__}") from None
    yield from it


@dataclass(frozen=True)
class State:
    """What the model remembers of a sentence's history: its last n-1 word ids (oldest
    first).  Like KenLM's ``State``: :meth:`Model.begin_sentence` gives the state after
    ``<s>``, :meth:`Model.null_context` the state with no history, and
    :meth:`Model.score_word` returns a word's score with the state after the word.  States
    are immutable and hashable, so a decoder-style search can share them."""

    history: Tuple[int, ...]


class Model:
    """A loaded (memory-mapped) neural language model.  Thread-safe: threads share one
    ``Model``; its sentence-level methods (:meth:`score`, :meth:`score_sentence`,
    :meth:`sentence_logprob`, :meth:`score_word`, :meth:`score_batch`, :meth:`perplexity`)
    each use a session of the calling thread, and a thread that wants its own caches takes
    its own :meth:`session`."""

    def __init__(self, path: str, header: Dict[str, Any], arrays: Dict[str, np.ndarray],
                 checksum: str, use_tables: bool = True, hot_copies: bool = True) -> None:
        """A model over ``arrays`` (those of a file, or in memory); ``hot_copies=False`` has
        the scorer read them in place rather than from huge-page copies of the large tables
        (arrays already in memory, such as a training run's parameters)."""
        self.path = path
        self.header = header
        self.arrays = arrays
        self.checksum = checksum
        self.vocab = Vocabulary.from_arrays(arrays["vocab.offsets"], arrays["vocab.bytes"], lazy=True)
        self.native = NativeModel(header, arrays, use_tables, hot_copies=hot_copies)
        self._local = threading.local()   # the calling thread's own default session
        self._batch = None
        self._float32_arrays: Optional[Dict[str, np.ndarray]] = None

    def float32_arrays(self) -> Dict[str, np.ndarray]:
        """The model's arrays with any float16-stored one widened to float32 (made on first
        use and kept): what numpy computations over the parameters read.  :attr:`arrays`
        holds a float16 model file's arrays as stored, which the scorer reads as halves."""
        if self._float32_arrays is None:
            self._float32_arrays = modelfile.widen_arrays(self.arrays)
        return self._float32_arrays

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

    @property
    def reverse(self) -> bool:
        """Whether this is a right-to-left model (``nlmfeature train --reverse``): it reads
        sentences backwards, and the sentence-level methods (:meth:`sentence_ngrams`,
        :meth:`score_sentence`, :meth:`perplexity`, ``nlmfeature-rescore``) reverse the tokens
        for it.  For k-best rescoring only: decoders extend hypotheses left to right."""
        return bool(self.header.get("metadata", {}).get("reverse", False))

    @property
    def target_to_source(self) -> bool:
        """Whether this is an inverse joint model (``nlmfeature train --target-to-source``;
        always false for a target-only model): its "target" is the translation's source side
        and its "source" the translation, so :meth:`JointModel.score_sentence` takes
        (translation, source sentence, ``j-i`` alignment) and gives log p(source |
        translation); ``nlmfeature-rescore``, ``perplexity`` and ``score`` swap the roles for
        it.  For k-best rescoring only: decoders refuse it."""
        return bool(self.header.get("source")) and bool(
            self.header.get("metadata", {}).get("target_to_source", False))

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

    def check_file(self) -> None:
        """Raise :class:`nlmfeature.errors.ModelFileError` if the model file was changed in
        place since it was loaded (sessions do this at each sentence start).  Replace models
        by writing a new file and renaming it over the old one; see docs/model-format.md."""
        self.native.check_file()

    # -- ids ----------------------------------------------------------------------------
    def ids(self, words: Tokens) -> np.ndarray:
        """Vocabulary ids (int32) of ``words`` (a string is split on white space); unknown
        words map to ``<unk>``."""
        return self.vocab.ids(_tokens(words, "words"))

    def pad(self, history_ids: Sequence[int]) -> np.ndarray:
        """The n-1 context ids the model sees for a history (oldest first): the last n-1 ids,
        left-padded with ``<s>`` if the history starts with ``<s>``, else with ``<null>``."""
        return self.native.pad_context(np.ascontiguousarray(history_ids, dtype=np.int32))

    def sentence_ngrams(self, sentence: Tokens, bos: bool = True, eos: bool = True,
                        ) -> Tuple[np.ndarray, np.ndarray]:
        """(contexts (N, n-1), words (N,)) of a sentence: every word and ``</s>``, each after
        ``<s>`` and the words before it (``bos``), padded as :meth:`pad` does.  A right-to-left
        model (:attr:`reverse`) gets the words last to first."""
        _flag(bos, "bos")
        _flag(eos, "eos")
        toks = _tokens(sentence)
        ids = self.vocab.text_ids(toks[::-1] if self.reverse else toks)
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
    def session(self, cache_entries: int = DEFAULT_CACHE_ENTRIES, ngram_entries: int = -1,
                position_terms: bool = False) -> Session:
        """A new :class:`Session` (per-thread scorer with per-sentence caches).
        ``cache_entries`` bounds the context and class-normaliser caches (0 turns caching
        off); ``ngram_entries`` bounds the exact n-gram score cache (-1: ``4 * cache_entries``
        when a lookup costs more than a probe, i.e. normalised or tree outputs, dense layers
        or full context matrices; 0: off).  A diagonal network with unnormalised or tree
        outputs keeps its recent contexts' hidden vectors in a small memo (``stats()``:
        ``context_memo_slots``, its hits counted as context hits).  ``position_terms=True``
        scores as the decoders' sessions do: a log-bilinear class or softmax model's
        normalisers are sums of per-sentence vectors, one per context position's word (2x
        faster than the hidden-vector path on a decoder's search, where each such vector
        serves dozens of normalisers; ~5x slower on a sentence scored once); the two paths
        agree within 1e-6."""
        if not isinstance(position_terms, bool):
            raise TypeError(f"position_terms must be a bool, not {type(position_terms).__name__}")
        return self.native.session(cache_entries, ngram_entries, position_terms)

    def _default_session(self) -> Session:
        """The calling thread's session (a session's caches and buffers are not shared:
        two threads scoring through one session corrupt each other's state)."""
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = self.session()
        return s

    def score_ngram(self, context: Tokens, word: str) -> float:
        """Natural-log score of ``word`` after ``context`` (oldest word first; a string is
        split on white space, so ``score_ngram("the jury", "said")`` is ln p(said | the
        jury)).  A context not starting with ``<s>`` is padded with ``<null>`` (see
        :meth:`pad`)."""
        ctx = self.ids(_tokens(context, "the context"))
        wid = self.vocab.id(_word(word))
        s = self._default_session()
        s.begin_sentence()
        return float(s.score(ctx, wid))

    # -- KenLM's Python names, with KenLM's meaning (log10) -------------------------------
    def score(self, sentence: Tokens, bos: bool = True, eos: bool = True) -> float:
        """Log10 probability of a whole sentence, as KenLM's ``Model.score(sentence, bos=True,
        eos=True)``: ``bos`` conditions the first word on ``<s>``, ``eos`` adds ``</s>``.
        Code written for KenLM ports by changing the import.  The natural-log value is
        :meth:`logprob`; one word after a context is :meth:`score_ngram`."""
        _check_bos_eos(bos, eos, "score")
        return self.logprob(sentence, bos, eos) * LOG10_E

    def full_scores(self, sentence: Tokens, bos: bool = True, eos: bool = True,
                    ) -> Iterator[Tuple[float, int, bool]]:
        """Per token (each word, then ``</s>`` if ``eos``): (log10 probability, n-gram length,
        whether the word is out of vocabulary), as KenLM's ``Model.full_scores``.  The n-gram
        length is the number of real words the model saw (the word and its history, ``<s>``
        included, at most the order): a feed-forward model has no back-off, so it is
        ``min(order, position + 1 + bos)``."""
        _check_bos_eos(bos, eos, "full_scores")
        toks = _tokens(sentence)
        scores = self.score_sentence(toks, bos, eos)
        words = (toks[::-1] if self.reverse else toks) + (["</s>"] if eos else [])
        for i, (w, lp) in enumerate(zip(words, scores)):
            oov = i < len(toks) and self.vocab.is_oov(w)    # the sentence end is no word of the text
            yield float(lp) * LOG10_E, min(self.order, i + 1 + int(bool(bos))), oov

    def logprob(self, sentence: Tokens, bos: bool = True, eos: bool = True) -> float:
        """Natural-log probability of a sentence (the sum of :meth:`score_sentence`);
        :meth:`score` is the same in log10."""
        _check_bos_eos(bos, eos, "logprob")
        return float(self.score_sentence(sentence, bos, eos).sum())

    def __contains__(self, word: object) -> bool:
        """``"word" in model``: whether ``word`` is in the vocabulary (KenLM's meaning);
        ``<unk>``, ``<s>`` and ``</s>`` are in every model's vocabulary."""
        return isinstance(word, str) and word in self.vocab

    # -- incremental scoring with states (KenLM's shape) ---------------------------------
    def begin_sentence(self) -> State:
        """The state at the start of a sentence (after ``<s>``), as KenLM's
        ``BeginSentenceWrite``."""
        self._default_session().begin_sentence()
        return State(tuple(self.pad([self.vocab.bos]).tolist()))

    def null_context(self) -> State:
        """The state with no history (contexts padded with ``<null>``), as KenLM's
        ``NullContextWrite``."""
        self._default_session().begin_sentence()
        return State(tuple(self.pad([]).tolist()))

    def score_word(self, state: State, word: str) -> Tuple[float, State]:
        """(natural-log score of ``word`` after ``state``, the state after ``word``), as
        KenLM's ``BaseScore(in_state, word, out_state)``; ``"</s>"`` ends a sentence.
        Summing over a sentence's words and ``</s>`` from :meth:`begin_sentence` gives
        :meth:`sentence_logprob`."""
        if not isinstance(state, State):
            raise TypeError(f"state must be a State (from begin_sentence() or null_context()), "
                            f"not {type(state).__name__}")
        wid = self.vocab.id(_word(word))
        hist = np.asarray(state.history, dtype=np.int32)
        score = float(self._default_session().score(hist, wid))
        nxt = state.history[1:] + (wid,) if state.history else ()
        return score, State(nxt)

    def score_sentence(self, sentence: Tokens, bos: bool = True, eos: bool = True) -> np.ndarray:
        """Per-token natural-log scores of a sentence's words (and of ``</s>`` if ``eos``)."""
        ctx, words = self.sentence_ngrams(sentence, bos, eos)
        s = self._default_session()
        s.begin_sentence()
        return s.score_padded(ctx, words)

    def sentence_logprob(self, sentence: Tokens, bos: bool = True, eos: bool = True) -> float:
        """Sum of :meth:`score_sentence`: the sentence's natural-log probability (the same as
        :meth:`logprob`)."""
        return self.logprob(sentence, bos, eos)

    def _batcher(self):
        if self._batch is None:
            from nlmfeature.core.batch import BatchScorer
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
        ``contexts`` are padded (N, n-1) ids and ``words`` (N,) ids, as :meth:`sentence_ngrams`
        returns them: ``lm.score_batch(*lm.sentence_ngrams("the jury said"))``; equals the
        one-at-a-time scorer to float rounding.  Words (strings) are refused: map them with
        :meth:`ids` or use :meth:`score_sentences`."""
        for name, x in (("contexts", contexts), ("words", words)):
            arr = x if isinstance(x, np.ndarray) else None
            if arr is None:
                try:
                    arr = np.asarray(x)
                except Exception:  # ragged nested lists and the like
                    raise TypeError(f"score_batch: {name} must be an array of ids") from None
            if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
                raise TypeError(f"score_batch: {name} must hold integer word ids, not "
                                f"{arr.dtype} values (map words with Model.ids, or build both "
                                "arrays with Model.sentence_ngrams)")
        contexts = np.asarray(contexts)
        words = np.asarray(words)
        if contexts.ndim != 2 or contexts.shape[1] != self.context_width or words.ndim != 1 \
                or len(contexts) != len(words):
            raise ValueError(f"contexts must have shape (N, {self.context_width}) and words "
                             "(N,) with N = len(words)")
        self._check_contexts(contexts)
        if words.size and (words.min() < 0 or words.max() >= len(self.vocab)):
            # (checked before the int32 conversion, which would wrap 2**32 + 5 to 5)
            raise ValueError(f"words hold ids outside the vocabulary (0..{len(self.vocab) - 1})")
        self.check_file()
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

        if isinstance(sentences, (str, bytes)):
            raise TypeError("score_sentences() takes an iterable of sentences, not one string "
                            "(use sentence_logprob for one sentence)")
        for sent in sentences:
            c, w = self.sentence_ngrams(sent)
            ctxs.append(c); words.append(w); lengths.append(len(w))
            pending += len(w)
            if pending >= batch_size:
                flush()
        flush()
        return out

    def perplexity(self, lines: Union[str, "os.PathLike[str]", Iterable[Tokens]],
                   exclude_oov: bool = False, batch_size: int = 8192) -> Perplexity:
        """Perplexity of a text: ``lines`` is a path (plain, ``.gz`` or ``-``; a ``str`` is
        always a path) or an iterable of sentences (lines, e.g. an open file, or token
        lists).  Each word and one ``</s>`` per sentence is counted.  Unknown words are scored
        as ``<unk>`` and counted, as KenLM's ``query`` does, unless ``exclude_oov`` (SRILM's
        convention: OOV tokens are skipped)."""
        lines = _lines(lines)
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
            if self.reverse:
                toks = toks[::-1]
            n_sent += 1
            oov_mask = np.zeros(len(w), dtype=bool)
            oov_mask[:-1] = np.array([self.vocab.is_oov(t) for t in toks], dtype=bool) \
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


#: the model classes :func:`load` can return besides :class:`Model`, each with the test of a
#: file header that selects it; :mod:`nlmfeature.core.joint` adds the joint model (the package
#: imports it), so this module needs none of its subclasses
MODEL_KINDS: List[Tuple[Callable[[Dict[str, Any]], bool], type]] = []


def load(path: str, verify: bool = True, use_tables: bool = True) -> Model:
    """Memory-map a model file and return a :class:`Model`.

    ``verify`` checks the file's checksum (one sequential read of the file);
    ``use_tables=False`` ignores precomputed first-layer tables (for comparisons).
    Raises :class:`nlmfeature.errors.ModelFileError` naming the file and the problem.
    """
    # float16 arrays as stored: the scorer reads the rows as halves (half the memory)
    header, arrays, checksum, fd, identity = modelfile.open_model(path, verify=verify, widen=False)
    try:
        cls = next((kind for test, kind in MODEL_KINDS if test(header)), Model)
        model = cls(path, header, arrays, checksum, use_tables)
    except (ValueError, KeyError, TypeError) as exc:
        os.close(fd)
        raise modelfile.ModelFileError(f"{path}: wrong architecture description: {exc}") from None
    model.native.watch_file(path, fd, identity)
    _probe(model)
    return model


def _probe(model: Model) -> None:
    """Refuse a model that scores NaN or an infinity (non-finite weights, e.g. an ensemble
    whose weights overflowed): ``</s>`` and ``<unk>`` after ``<s>`` (a joint model: with a
    window of source ``<null>``), one lookup each."""
    v = model.vocab
    w = model.native.source_window
    ctx = np.zeros((2, model.context_width), dtype=np.int32)
    if w:
        ctx[:, :w] = int(model.header["source"]["special"]["<null>"])
    ctx[:, w:] = model.pad([v.bos])
    scores = model.native.session(0, 0).score_padded(ctx, np.array([v.eos, v.unk], dtype=np.int32))
    if not np.isfinite(scores).all():
        raise modelfile.ModelFileError(
            f"{model.path}: the model scores {scores.tolist()} (p(</s> | <s>), p(<unk> | <s>)): "
            "its weights hold NaN or infinite values; train or write it again")


def exactly_normalised(model: Model) -> Model:
    """The one exactly normalised scorer of the package: ``model`` itself if its scores are
    log-probabilities; for an unnormalised (NCE or self-normalised) model, a view of the same
    arrays whose scores are renormalised by a softmax over the whole vocabulary (direct
    features included): true log-probabilities, at the cost of a pass over the vocabulary per
    scored token.  Perplexities with ``--exact``, the benchmarks' and the trainer's exact
    held-out scores all come from it."""
    if model.normalised:
        return model
    header = json.loads(json.dumps(model.header))
    header["output"]["type"] = "softmax"
    # the same class (a joint model stays one: its contexts hold the source window)
    return type(model)(model.path, header, model.arrays, model.checksum,
                       use_tables=bool(header.get("precomputed")))


def save(path: str, header: Dict[str, Any], arrays: Dict[str, np.ndarray], half: bool = False) -> str:
    """Write a model file atomically; returns its checksum.  See :mod:`nlmfeature.core.modelfile`."""
    return modelfile.write_model(path, header, arrays, half=half)
