"""Word classes: Brown clustering, Liang's ``paths`` files, and their average mutual information.

Liang's ``wcluster`` paths format (what ``nlmfeature cluster`` writes and ``--class-file``
reads) has one word per line::

    bitstring<TAB>word<TAB>count

where ``bitstring`` is the word's cluster: its path from the root of the cluster hierarchy
(``0`` = first child, ``1`` = second), so clusters sharing a prefix are similar.  Words of
one cluster share one bitstring; ``count`` is the word's frequency in the clustered text.

**Bigrams.**  As in ``wcluster``, the text is one stream: the last word of a line and the first
word of the next form a bigram, and there are no sentence-boundary tokens.  Words below
``min_count`` are left out together with every bigram that touches them.

**Average mutual information** (AMI) of a clustering is the mutual information, in bits, of
the class-bigram distribution: ``sum_{c,d} p(c,d) log2(p(c,d) / (p_left(c) p_right(d)))``
with ``p(c,d)`` the relative frequency of the bigram (class c, class d) among the counted
bigrams and ``p_left``/``p_right`` its marginals.  Brown clustering greedily maximises exactly
this quantity, and :func:`average_mutual_information` measures it for any clustering.

**Vocabulary words the class file does not cover** (words below the clustering's
``min_count``, ``<unk>``, ``</s>``, ...) are handled by :func:`class_of_word`: by default each
goes to the class of the covered word whose count is nearest to its own (ties: the rarer
word's class; a word without a known count counts 0, which puts it with the rarest words), so
rare unseen words join rare-word classes, as in frequency binning.  ``unknown="own"`` puts all
of them into one extra class instead, and ``unknown="error"`` refuses them.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from nlmfeature.io.atomicfile import atomic_open
from nlmfeature.io.textio import iter_lines
from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.core.vocab import Vocabulary

LN2 = float(np.log(2.0))
#: counts in a paths file are below this (they become int64 / float64 arrays)
MAX_COUNT = 1 << 62


# ---------------------------------------------------------------------------------------
# paths files
# ---------------------------------------------------------------------------------------
@dataclass
class PathEntry:
    """One line of a paths file."""

    bits: str
    word: str
    count: int


def read_paths(path: str) -> List[PathEntry]:
    """Read a paths file (``bitstring<TAB>word<TAB>count``; the count may be missing).

    Raises :class:`InputError` naming the file and line for a malformed line, a bitstring that
    is not made of 0s and 1s, a bad count or a word listed twice.
    """
    entries: List[PathEntry] = []
    seen: Dict[str, int] = {}
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) not in (2, 3):
            raise InputError(path, lineno, f"expected 'bitstring<TAB>word<TAB>count' "
                             f"(Liang's paths format), found {len(fields)} tab-separated "
                             f"field(s): {line[:80]!r}")
        bits, word = fields[0], fields[1]
        if bits.strip("01"):
            raise InputError(path, lineno, f"the cluster bitstring {bits[:40]!r} must "
                             "consist of 0s and 1s")
        if not word or any(c.isspace() for c in word):
            raise InputError(path, lineno, f"the word {word!r} is empty or contains "
                             "white space")
        count = 0
        if len(fields) == 3:
            try:
                count = int(fields[2])
            except ValueError:
                count = -1
            if not 0 <= count < MAX_COUNT:
                raise InputError(path, lineno, f"the count {fields[2][:40]!r} is not a "
                                 f"non-negative integer below 2^62")
        if word in seen:
            raise InputError(path, lineno, f"the word {word!r} is listed twice (first "
                             f"on line {seen[word]})")
        seen[word] = lineno
        entries.append(PathEntry(bits, word, count))
    if not entries:
        raise InputError(path, 0, "the class file lists no words")
    return entries


def write_paths(path: str, entries: Iterable[PathEntry]) -> None:
    """Write a paths file atomically (:mod:`nlmfeature.io.atomicfile`), in the order given."""
    with atomic_open(path) as f:
        f.write("".join(f"{e.bits}\t{e.word}\t{e.count}\n" for e in entries).encode("utf-8"))


def classes_of_paths(entries: Sequence[PathEntry]) -> Tuple[List[str], Dict[str, int]]:
    """(sorted distinct bitstrings, word -> class index into them).  Sorting the bitstrings
    keeps clusters that are close in the hierarchy next to each other."""
    bits = sorted({e.bits for e in entries})
    index = {b: i for i, b in enumerate(bits)}
    return bits, {e.word: index[e.bits] for e in entries}


def class_of_word(entries: Sequence[PathEntry], vocab: Vocabulary,
                  counts: Optional[Sequence[float]] = None, unknown: str = "nearest",
                  path: str = "class file") -> np.ndarray:
    """Class id of every vocabulary word (int32, indexed by word id) from a paths file.

    Classes are the file's distinct bitstrings in sorted order (``0..C-1``); classes none of
    whose words is in ``vocab`` are dropped and the ids renumbered, so every class is
    non-empty.  Vocabulary words the file does not list are handled per ``unknown``:

    * ``"nearest"``: the class of the listed vocabulary word whose file count is nearest to
      the word's count in ``counts`` (indexed by word id; missing -> 0); ties go to the rarer
      word.  Unknown rare words thus join classes of rare words.
    * ``"own"``: all of them together in one extra class (the last id).
    * ``"error"``: raise :class:`NLMFeatureError` listing some of them.
    """
    if unknown not in ("nearest", "own", "error"):
        raise ValueError(f"unknown={unknown!r}: use 'nearest', 'own' or 'error'")
    bits, word_class = classes_of_paths(entries)
    file_count = {e.word: e.count for e in entries}
    V = len(vocab)
    cw = np.full(V, -1, dtype=np.int64)
    for i, w in enumerate(vocab):
        c = word_class.get(w)
        if c is not None:
            cw[i] = c
    covered = np.flatnonzero(cw >= 0)
    if covered.size == 0:
        raise NLMFeatureError(f"{path}: none of the {V} vocabulary words is in the class file; "
                              "was it made from the same text?")
    missing = np.flatnonzero(cw < 0)
    if missing.size:
        if unknown == "error":
            shown = ", ".join(vocab[int(i)] for i in missing[:8])
            raise NLMFeatureError(f"{path}: {missing.size} vocabulary words have no class "
                                  f"(e.g. {shown}); recluster with a lower --min-count or use "
                                  "a fallback")
        if unknown == "own":
            cw[missing] = cw.max() + 1
        else:
            ref = np.array([file_count[vocab[int(i)]] for i in covered], dtype=np.float64)
            order = np.argsort(ref, kind="stable")
            ref_sorted, cls_sorted = ref[order], cw[covered][order]
            want = np.zeros(missing.size) if counts is None else \
                np.asarray(counts, dtype=np.float64)[missing]
            j = np.searchsorted(ref_sorted, want)           # first ref >= want
            lo = np.clip(j - 1, 0, len(ref_sorted) - 1)
            hi = np.clip(j, 0, len(ref_sorted) - 1)
            pick = np.where(np.abs(want - ref_sorted[lo]) <= np.abs(ref_sorted[hi] - want), lo, hi)
            cw[missing] = cls_sorted[pick]
    # renumber to 0..C'-1 keeping the sorted-bitstring order
    used = np.unique(cw)
    remap = np.full(int(used.max()) + 1, -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    return remap[cw].astype(np.int32)


def load_class_of_word(path: str, vocab: Vocabulary, counts: Optional[Sequence[float]] = None,
                       unknown: str = "nearest") -> np.ndarray:
    """:func:`class_of_word` of the paths file at ``path`` (what ``--class-file`` uses)."""
    return class_of_word(read_paths(path), vocab, counts, unknown, path)


# ---------------------------------------------------------------------------------------
# bigram statistics and AMI
# ---------------------------------------------------------------------------------------
def _stream_ids(lines: Iterable[Sequence[str]], index: Mapping[str, int]) -> np.ndarray:
    """Ids of all tokens as one stream (-1 for words not in ``index``)."""
    get = index.get
    out: List[int] = []
    for toks in lines:
        out.extend(get(t, -1) for t in toks)
    return np.asarray(out, dtype=np.int64)


def _corpus_words(corpus, min_count: int) -> Tuple[List[str], List[int], np.ndarray]:
    """(words, their counts, their corpus ids) of a compiled corpus's words seen
    ``min_count`` times, in :func:`_clustered_words` order."""
    counts = corpus.word_counts()
    words = _clustered_words(counts, min_count)
    position = {w: i for i, w in enumerate(corpus.words)}
    return words, [counts[w] for w in words], np.asarray([position[w] for w in words], dtype=np.int64)


def _corpus_stream(corpus, corpus_ids: np.ndarray, values: np.ndarray,
                   step: int = 1 << 24) -> Iterator[np.ndarray]:
    """The word stream of a compiled corpus (:class:`~nlmfeature.training.corpusfile.
    CompiledCorpus`) with ``corpus_ids`` read as ``values`` and every other word as -1 (left
    out), in chunks, without its sentence ends (the text is one stream); the pages behind are
    released as it goes."""
    remap = np.full(len(corpus.words), -1, dtype=np.int64)
    remap[corpus_ids] = values
    for o in range(0, len(corpus.ids), step):
        ids = corpus.ids[o:o + step]
        yield remap[ids[ids != 0]]
        corpus.release_ids(o, o + step)


def bigram_counts(ids: np.ndarray, n: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(left ids, right ids, counts) of the distinct bigrams of a stream of ids in ``0..n-1``;
    bigrams touching a negative id are skipped."""
    return stream_bigram_counts([ids], n)[:3]


def stream_bigram_counts(chunks: Iterable[np.ndarray], n: int
                         ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`bigram_counts` of a stream given in consecutive chunks (bigrams cross the chunk
    borders), and the stream's length.  Memory: a chunk plus the distinct bigrams."""
    keys = np.zeros(0, dtype=np.int64)
    cnt = np.zeros(0, dtype=np.int64)
    last = None
    tokens = 0
    for ids in chunks:
        ids = np.asarray(ids, dtype=np.int64)
        tokens += ids.size
        if last is not None:
            ids = np.concatenate(([last], ids))
        if ids.size == 0:
            continue
        last = ids[-1]
        a, b = ids[:-1], ids[1:]
        keep = (a >= 0) & (b >= 0)
        u, c = np.unique(a[keep] * n + b[keep], return_counts=True)
        if keys.size:
            keys, inv = np.unique(np.concatenate((keys, u)), return_inverse=True)
            cnt = np.bincount(inv.reshape(-1), weights=np.concatenate((cnt, c)),
                              minlength=keys.size).astype(np.int64)
        else:
            keys, cnt = u, c.astype(np.int64)
    return (keys // n).astype(np.int32), (keys % n).astype(np.int32), cnt, tokens


def mutual_information(left: np.ndarray, right: np.ndarray, counts: np.ndarray) -> float:
    """Mutual information (bits) of the joint distribution given as (left, right, count)
    triples over integer labels."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        return 0.0
    n = int(max(left.max(), right.max())) + 1
    keys = left.astype(np.int64) * n + right
    uniq, inv = np.unique(keys, return_inverse=True)
    joint = np.bincount(inv, weights=counts) / total
    l, r = uniq // n, uniq % n
    pl = np.bincount(left, weights=counts, minlength=n) / total
    pr = np.bincount(right, weights=counts, minlength=n) / total
    return float(np.sum(joint * np.log(joint / (pl[l] * pr[r]))) / LN2)


def stream_ami(chunks: Iterable[np.ndarray], n_classes: int) -> float:
    """AMI (bits) of a stream of class ids in ``0..n_classes-1`` given in consecutive chunks
    (-1: a word without a class; bigrams touching it are skipped)."""
    left, right, cnt, _ = stream_bigram_counts(chunks, max(1, n_classes))
    if left.size == 0:
        return 0.0
    return mutual_information(left, right, cnt)


def average_mutual_information(lines: Iterable[Sequence[str]],
                               word_class: Mapping[str, int]) -> float:
    """AMI (bits) of the clustering ``word_class`` (word -> class) on tokenised ``lines``.

    Bigrams as in clustering (the text is one stream); bigrams with a word that has no class
    are skipped."""
    return stream_ami([_stream_ids(lines, word_class)], max(word_class.values(), default=0) + 1)


def paths_ami(entries: Sequence[PathEntry], lines: Iterable[Sequence[str]]) -> float:
    """AMI (bits) of a paths file's clustering on ``lines``."""
    return average_mutual_information(lines, classes_of_paths(entries)[1])


# ---------------------------------------------------------------------------------------
# Brown clustering
# ---------------------------------------------------------------------------------------
@dataclass
class BrownResult:
    """Outcome of :func:`brown_clusters`."""

    entries: List[PathEntry]       #: one per clustered word, sorted by bitstring then count
    n_classes: int
    ami_bits: float                #: AMI of the C clusters (as tracked by the kernel)
    words: int                     #: clustered word types
    tokens: int                    #: tokens in the text
    bigrams: int                   #: counted bigrams
    merge_losses: np.ndarray = field(repr=False, default=None)  #: AMI lost per merge (nats)
    check_error: Optional[float] = None  #: largest |incremental - recomputed| loss (``check``)


def _bitstrings(merges: np.ndarray, n: int, stage1: int) -> List[str]:
    """Bitstring of every word from the merge list: stage-2 merges (the last ones) build the
    hierarchy over the final clusters; stage-1 merges happen inside a cluster."""
    if n == 1:
        return ["0"]
    code: Dict[int, str] = {int(merges[-1, 2]): ""}
    for k in range(len(merges) - 1, -1, -1):
        c0, c1, new = (int(x) for x in merges[k])
        prefix = code[new]
        if k >= stage1:
            code[c0], code[c1] = prefix + "0", prefix + "1"
        else:
            code[c0] = code[c1] = prefix
    return [code[w] for w in range(n)]


def brown_clusters(lines: Sequence[Sequence[str]], n_classes: Optional[int] = None,
                   min_count: int = 1, threads: Optional[int] = None,
                   progress: Optional[Callable[[int], None]] = None,
                   check: bool = False) -> BrownResult:
    """Brown clustering of the words of tokenised ``lines`` into ``n_classes`` clusters
    (default ``round(sqrt(V))``) with Liang's windowed algorithm: words enter by decreasing
    count (ties by spelling), each new word becomes a cluster and the pair of the ``C + 1``
    clusters whose merge loses the least AMI is merged; then the ``C`` clusters are merged
    down to one to build the hierarchy that gives the bitstrings.

    ``progress(k)`` is called as words enter (k words each time).  ``threads`` (default 1)
    parallelises the loss-table loops; it does not change the result.  ``check`` recomputes
    every incrementally updated loss from scratch and records the largest difference in
    ``BrownResult.check_error`` (slow; for tests).  :func:`brown_clusters_corpus` does the
    same for a compiled corpus of any size.
    """
    counts = Counter()
    for toks in lines:
        counts.update(toks)
    words = _clustered_words(counts, min_count)
    index = {w: i for i, w in enumerate(words)}
    return _brown(words, [counts[w] for w in words], [_stream_ids(lines, index)], n_classes,
                  threads, progress, check)


def brown_clusters_corpus(corpus, n_classes: Optional[int] = None, min_count: int = 1,
                          threads: Optional[int] = None,
                          progress: Optional[Callable[[int], None]] = None) -> BrownResult:
    """:func:`brown_clusters` of a compiled corpus (:class:`~nlmfeature.training.corpusfile.
    CompiledCorpus`; the same clustering as of its text): the words and counts come from its
    vocabulary and the bigrams from one pass over its id stream, so the memory is that of
    the vocabulary and the distinct bigrams, not of the corpus."""
    words, counts, ids = _corpus_words(corpus, min_count)
    return _brown(words, counts, _corpus_stream(corpus, ids, np.arange(len(words))), n_classes,
                  threads, progress, False)


def _clustered_words(counts: Mapping[str, int], min_count: int) -> List[str]:
    """The words clustered: those seen ``min_count`` times, by decreasing count, then spelling."""
    words = [w for w, c in counts.items() if c >= min_count]
    words.sort(key=lambda w: (-counts[w], w))
    if not words:
        raise NLMFeatureError(f"no word occurs at least {min_count} times: nothing to cluster")
    return words


def _brown(words: List[str], word_counts: Sequence[int], chunks: Iterable[np.ndarray],
           n_classes: Optional[int], threads: Optional[int],
           progress: Optional[Callable[[int], None]], check: bool) -> BrownResult:
    """The clustering of ``words`` (by decreasing count) over the id stream ``chunks``."""
    from nlmfeature._brown import BrownKernel

    n = len(words)
    C = int(round(np.sqrt(n))) if n_classes is None else int(n_classes)
    if C < 1:
        raise NLMFeatureError(f"the number of classes must be positive (got {C})")
    C = min(C, n)
    left, right, cnt, tokens = stream_bigram_counts(chunks, n)
    total = float(cnt.sum())
    if total == 0:
        raise NLMFeatureError("the text has no bigram of clustered words")
    prob = cnt / total
    # right neighbours of each word (sorted by left id) and left neighbours (sorted by right)
    r_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(left, minlength=n), out=r_start[1:])
    order = np.lexsort((left, right))
    l_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(right, minlength=n), out=l_start[1:])
    word_pl = np.bincount(left, weights=prob, minlength=n)
    word_pr = np.bincount(right, weights=prob, minlength=n)
    kernel = BrownKernel(n, C, r_start, np.ascontiguousarray(right), np.ascontiguousarray(prob),
                         l_start, np.ascontiguousarray(left[order]),
                         np.ascontiguousarray(prob[order]), word_pl, word_pr,
                         threads or 1)
    kernel.check = check
    merges, losses, mi_stage1, stage1 = kernel.run(progress)
    bits = _bitstrings(merges, n, stage1)
    entries = [PathEntry(bits[i], words[i], int(word_counts[i])) for i in range(n)]
    entries.sort(key=lambda e: (e.bits, -e.count, e.word))
    return BrownResult(entries, C, mi_stage1 / LN2, n, tokens, int(total), losses,
                       kernel.max_check_error if check else None)


def frequency_binning_ami(lines: Sequence[Sequence[str]], n_classes: int,
                          min_count: int = 1) -> float:
    """AMI (bits) of frequency binning (:func:`nlmfeature.core.outputs.frequency_classes`) with
    ``n_classes`` classes over the words occurring at least ``min_count`` times."""
    from nlmfeature.core.outputs import frequency_classes

    counts = Counter()
    for toks in lines:
        counts.update(toks)
    words = _clustered_words(counts, min_count)
    cls = frequency_classes([counts[w] for w in words], min(n_classes, len(words)))
    return average_mutual_information(lines, {w: int(c) for w, c in zip(words, cls)})


def frequency_binning_ami_corpus(corpus, n_classes: int, min_count: int = 1) -> float:
    """:func:`frequency_binning_ami` of a compiled corpus, in one pass over its id stream."""
    from nlmfeature.core.outputs import frequency_classes

    words, counts, ids = _corpus_words(corpus, min_count)
    k = min(n_classes, len(words))
    cls = np.asarray(frequency_classes(counts, k), dtype=np.int64)
    return stream_ami(_corpus_stream(corpus, ids, cls), k)
