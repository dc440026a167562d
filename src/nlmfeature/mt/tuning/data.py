"""The k-best pool the optimisers work on: per sentence, every distinct hypothesis seen so far.

For each hypothesis the pool keeps its dense feature vector (float64) and its BLEU sufficient
statistics (:mod:`nlmfeature.mt.bleu`, 10 ints), plus its text (for reports and 1-best output).
Lists from several tuning iterations are merged; a hypothesis whose features *and* statistics
equal one already stored for the same sentence is dropped, as Moses' ``mert`` does
(``Data::removeDuplicates``).

Features are laid out by label in order of first appearance: a Moses label with k values takes
k columns (``Label_0 .. Label_{k-1}`` internally; written back as ``Label= v0 v1 ...``), a
cdec ``name=value`` feature one column.  A label missing from a line counts as 0 there (cdec
omits zero features), so the layout can grow as new labels appear.

:meth:`KbestPool.arrays` gives the flat, optimiser-friendly view: ``features`` (N, D) float64,
``stats`` (N, 10) int32 and ``offsets`` (S+1,) int64 (sentence ``s`` owns rows
``offsets[s]:offsets[s+1]``).  :meth:`KbestPool.save` / :meth:`KbestPool.load` store a pool as
a ``.npz`` (no pickle) so that an interrupted tuning run can resume.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from nlmfeature.io.atomicfile import atomic_open
from nlmfeature.mt.bleu import NUM_STATS, References
from nlmfeature.errors import InputError
from nlmfeature.mt.kbest import Hypothesis, group_by_sentence, read_kbest
from nlmfeature.io.textio import check_input

#: version of the .npz layout written by :meth:`KbestPool.save`
POOL_VERSION = 1


@dataclass
class PoolArrays:
    """Flat view of a pool (see the module doc)."""

    features: np.ndarray   #: (N, D) float64, C order
    stats: np.ndarray      #: (N, 10) int32
    offsets: np.ndarray    #: (S+1,) int64

    @property
    def num_sentences(self) -> int:
        return len(self.offsets) - 1

    def sentence_of_rows(self) -> np.ndarray:
        """Sentence index of every row, (N,) int64."""
        return np.repeat(np.arange(self.num_sentences, dtype=np.int64), np.diff(self.offsets))


def _read_one(refs: References, path: str, fmt: str, skip_bad: bool) -> Tuple["KbestPool", int]:
    """Worker of :meth:`KbestPool.add_files`: one list as a pool of its own."""
    part = KbestPool(refs)
    read, _ = part.add_file(path, fmt, skip_bad)
    return part, read


class _LineTagger:
    """Iterates a k-best reader, recording each hypothesis' line number; ``lineno`` is the
    reader's (so that :func:`group_by_sentence` errors name the line)."""

    def __init__(self, reader, linenos: List[int]) -> None:
        self.reader = reader
        self.linenos = linenos

    @property
    def lineno(self) -> int:
        return self.reader.lineno

    def __iter__(self) -> Iterator[Hypothesis]:
        for hyp in self.reader:
            self.linenos.append(self.reader.lineno)
            yield hyp


def _check_pool_arrays(path: str, feats: np.ndarray, stats: np.ndarray, offsets: np.ndarray,
                       text_offsets: np.ndarray, text_bytes: int, dim: int) -> None:
    """Raise :class:`InputError` unless a loaded pool's arrays are consistent (the native
    optimisers index through ``offsets`` without bounds checks)."""
    def bad(what: str) -> InputError:
        return InputError(path, 0, f"damaged k-best pool: {what}; delete it to rebuild")
    n = len(feats)
    if feats.ndim != 2 or feats.shape[1] != dim:
        raise bad(f"features of shape {feats.shape}, expected (N, {dim})")
    if not np.all(np.isfinite(feats)):
        raise bad("non-finite feature values")
    if stats.shape != (n, NUM_STATS) or (stats < 0).any():
        raise bad(f"statistics of shape {stats.shape}, expected ({n}, {NUM_STATS}), non-negative")
    if offsets.ndim != 1 or offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
        raise bad("sentence offsets do not rise from 0 to the number of rows")
    if (text_offsets.shape != (n + 1,) or text_offsets[0] != 0 or text_offsets[-1] != text_bytes
            or np.any(np.diff(text_offsets) < 0)):
        raise bad("text offsets do not match the stored texts")


class KbestPool:
    """Accumulated k-best hypotheses of one tuning set (see the module doc).

    ``refs`` are the references of the tuning set; their count fixes the number of sentences,
    and every k-best list added must have ids ``0 .. len(refs)-1``.
    """

    def __init__(self, refs: References) -> None:
        self.refs = refs
        self.num_sentences = len(refs)
        self.labels: List[Tuple[str, int]] = []      # (label, number of values) in column order
        self._label_col: Dict[str, Tuple[int, int]] = {}
        self.dim = 0
        self._fast_signature: Optional[tuple] = None
        self._rows: List[List[np.ndarray]] = [[] for _ in range(self.num_sentences)]
        self._stats: List[List[np.ndarray]] = [[] for _ in range(self.num_sentences)]
        self._texts: List[List[str]] = [[] for _ in range(self.num_sentences)]
        self._keys: List[set] = [set() for _ in range(self.num_sentences)]
        self.sources: List[str] = []
        self._flat: Optional[PoolArrays] = None

    # -- layout -------------------------------------------------------------------------
    def feature_names(self) -> List[str]:
        """Column names: ``Label`` for a one-valued label, ``Label_i`` for each of k values."""
        names: List[str] = []
        for label, k in self.labels:
            names.extend([label] if k == 1 else [f"{label}_{i}" for i in range(k)])
        return names

    def _columns(self, hyp: Hypothesis, path: str, lineno: int) -> np.ndarray:
        signature = tuple((label, len(values)) for label, values in hyp.features)
        if signature == self._fast_signature:      # the usual case: the layout of the list
            return np.array([v for _, values in hyp.features for v in values], dtype=np.float64)
        vec = np.zeros(self.dim + sum(len(v) for _, v in hyp.features), dtype=np.float64)
        for label, values in hyp.features:
            where = self._label_col.get(label)
            if where is None:
                where = (self.dim, len(values))
                self._label_col[label] = where
                self.labels.append((label, len(values)))
                self.dim += len(values)
            elif where[1] != len(values):
                raise InputError(path, lineno, f"feature {label!r} has {len(values)} value(s) "
                                 f"here but {where[1]} earlier; all lines must agree")
            start, k = where
            vec[start:start + k] = values
        if signature == tuple(self.labels):
            self._fast_signature = signature
        return vec[:self.dim]

    @staticmethod
    def _key(vec: np.ndarray, stats: np.ndarray) -> Tuple[bytes, bytes]:
        """De-duplication key: features without trailing zero columns (so that a layout grown
        by later labels keeps old keys valid) and statistics."""
        raw = vec.tobytes()
        end = (len(raw.rstrip(b"\0")) + 7) // 8 * 8      # whole float64 values only
        return raw[:end], np.asarray(stats, dtype=np.int64).tobytes()

    # -- adding -------------------------------------------------------------------------
    def add_sentence(self, sid: int, hyps: Sequence[Hypothesis], path: str = "<k-best>",
                     lineno: Union[int, Sequence[int]] = 0) -> int:
        """Add the hypotheses of sentence ``sid``; returns how many were new.

        ``lineno`` (one number, or one per hypothesis) is used in error messages.
        """
        if not 0 <= sid < self.num_sentences:
            first_line = lineno if isinstance(lineno, int) else (lineno[0] if lineno else 0)
            raise InputError(path, first_line, f"sentence id {sid} but the references have only "
                             f"{self.num_sentences} lines (ids 0..{self.num_sentences - 1}); "
                             "use the reference file of the set that was decoded")
        if isinstance(lineno, int):
            lines = [lineno] * len(hyps)
        else:
            lines = list(lineno)
        vecs = [self._columns(h, path, ln) for h, ln in zip(hyps, lines)]
        stats = self.refs.stats_many(sid, [h.text for h in hyps])
        new = 0
        keys = self._keys[sid]
        for h, vec, st in zip(hyps, vecs, stats):
            key = self._key(vec, st)
            if key in keys:
                continue
            keys.add(key)
            self._rows[sid].append(vec)
            self._stats[sid].append(st.astype(np.int32))
            self._texts[sid].append(h.text)
            new += 1
        if new:
            self._flat = None
        return new

    def add_file(self, path: str, fmt: str = "auto", skip_bad: bool = False,
                 progress: bool = False) -> Tuple[int, int]:
        """Read a k-best list and add it; returns (hypotheses read, new distinct ones).

        The list must cover every sentence ``0 .. len(refs)-1`` exactly once as a consecutive
        run; otherwise :class:`InputError` names the file (and line).
        """
        reader = read_kbest(path, fmt=fmt, skip_bad=skip_bad)
        linenos: List[int] = []
        groups = group_by_sentence(_LineTagger(reader, linenos), path)
        done = 0
        bar = None
        if progress:
            from nlmfeature.io.progress import progress

            bar = progress(total=self.num_sentences, desc=os.path.basename(path), unit="sent",
                           leave=False)
        read = new = 0
        covered = np.zeros(self.num_sentences, dtype=bool)
        try:
            for sid, hyps in groups:
                new += self.add_sentence(sid, hyps, path, linenos[done:done + len(hyps)])
                done += len(hyps)
                read += len(hyps)
                covered[sid] = True
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        if read == 0:
            raise InputError(path, 0, "the k-best list is empty (no hypotheses); did the decoder "
                             "fail?")
        if not covered.all():
            missing = np.flatnonzero(~covered)
            raise InputError(path, 0, f"the k-best list covers {int(covered.sum())} of the "
                             f"{self.num_sentences} reference sentences (first missing id "
                             f"{int(missing[0])}); the reference must have one line per "
                             "decoded sentence")
        self.sources.append(os.path.abspath(path))
        return read, new

    def add_files(self, paths: Sequence[str], fmt: str = "auto", skip_bad: bool = False,
                  jobs: int = 1, progress: bool = False,
                  log: Optional[Callable[[str], None]] = None) -> List[Tuple[int, int]]:
        """:meth:`add_file` for several lists; with ``jobs`` > 1 they are read in parallel
        processes and merged in the given order (same result as reading one by one)."""
        jobs = max(1, min(jobs, len(paths)))
        results: List[Tuple[int, int]] = []
        if jobs == 1:
            for path in paths:
                results.append(self.add_file(path, fmt, skip_bad, progress))
                if log is not None:
                    log(f"{path}: {results[-1][0]} hypotheses, {results[-1][1]} new; pool "
                        f"{self.num_hypotheses}")
            return results
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs,
                                 mp_context=multiprocessing.get_context("fork")) as ex:
            futures = [ex.submit(_read_one, self.refs, p, fmt, skip_bad) for p in paths]
            for path, fut in zip(paths, futures):
                part, read = fut.result()
                results.append((read, self.merge(part)))
                if log is not None:
                    log(f"{path}: {read} hypotheses, {results[-1][1]} new; pool "
                        f"{self.num_hypotheses}")
        return results

    def merge(self, other: "KbestPool") -> int:
        """Add the hypotheses of ``other`` (same references); returns how many were new."""
        if other.num_sentences != self.num_sentences:
            raise ValueError("pools of different sentence counts cannot be merged")
        cols: List[int] = []
        for label, k in other.labels:
            where = self._label_col.get(label)
            if where is None:
                where = (self.dim, k)
                self._label_col[label] = where
                self.labels.append((label, k))
                self.dim += k
            elif where[1] != k:
                raise InputError(other.sources[-1] if other.sources else "<pool>", 0,
                                 f"feature {label!r} has {k} value(s) there but {where[1]} in "
                                 "earlier lists")
            cols.extend(range(where[0], where[0] + k))
        identity = cols == list(range(len(cols)))
        new = 0
        for s in range(self.num_sentences):
            keys = self._keys[s]
            for vec, st, text in zip(other._rows[s], other._stats[s], other._texts[s]):
                if not identity:
                    full = np.zeros(self.dim)
                    full[cols[:len(vec)]] = vec
                    vec = full
                key = self._key(vec, st)
                if key in keys:
                    continue
                keys.add(key)
                self._rows[s].append(vec)
                self._stats[s].append(st)
                self._texts[s].append(text)
                new += 1
        if new:
            self._flat = None
        self.sources.extend(other.sources)
        return new

    # -- views --------------------------------------------------------------------------
    @property
    def num_hypotheses(self) -> int:
        return sum(len(r) for r in self._rows)

    def arrays(self) -> PoolArrays:
        """The flat view (cached until the pool changes)."""
        if self._flat is None:
            sizes = np.array([len(r) for r in self._rows], dtype=np.int64)
            offsets = np.zeros(self.num_sentences + 1, dtype=np.int64)
            np.cumsum(sizes, out=offsets[1:])
            feats = np.zeros((int(offsets[-1]), self.dim), dtype=np.float64)
            stats = np.zeros((int(offsets[-1]), NUM_STATS), dtype=np.int32)
            for s in range(self.num_sentences):
                lo = offsets[s]
                for j, (vec, st) in enumerate(zip(self._rows[s], self._stats[s])):
                    feats[lo + j, :len(vec)] = vec
                    stats[lo + j] = st
            self._flat = PoolArrays(feats, stats, offsets)
        return self._flat

    def text(self, row: int) -> str:
        """Text of flat row ``row``."""
        offsets = self.arrays().offsets
        s = int(np.searchsorted(offsets, row, side="right") - 1)
        return self._texts[s][row - int(offsets[s])]

    def texts(self, rows: Iterable[int]) -> List[str]:
        """Texts of several flat rows."""
        return [self.text(int(r)) for r in rows]

    def check_complete(self) -> None:
        """Raise :class:`InputError` unless every sentence has at least one hypothesis."""
        empty = [s for s in range(self.num_sentences) if not self._rows[s]]
        if empty:
            raise InputError(self.sources[-1] if self.sources else "<pool>", 0,
                             f"{len(empty)} of {self.num_sentences} sentences have no hypotheses "
                             f"(first: id {empty[0]}); add their k-best lists")

    # -- weights ------------------------------------------------------------------------
    def weight_vector(self, weights: Dict[str, List[float]], path: str = "<weights>",
                      missing_ok: bool = False) -> np.ndarray:
        """Flat weight vector in the pool's column order.

        Every k-best label needs weights, unless ``missing_ok`` (cdec: an unlisted feature
        has weight 0), when missing ones are 0.
        """
        from nlmfeature.mt.weights import weights_for

        flat, missing = weights_for(self.labels, weights, path)
        if missing and not missing_ok:
            raise InputError(path, 0, f"no weights for k-best feature(s) {', '.join(missing)}; "
                             "the weights must name every feature of the k-best lists")
        return np.asarray(flat, dtype=np.float64)

    def weights_dict(self, vector: np.ndarray, base: Optional[Dict[str, List[float]]] = None
                     ) -> Dict[str, List[float]]:
        """``{label: [values]}`` for ``vector``; labels of ``base`` not in the pool (e.g.
        untuned features such as Moses' ``UnknownWordPenalty0``) keep their values and order."""
        tuned: Dict[str, List[float]] = {}
        col = 0
        for label, k in self.labels:
            tuned[label] = [float(v) for v in vector[col:col + k]]
            col += k
        if base is None:
            return tuned
        out: Dict[str, List[float]] = {}
        for label, vals in base.items():
            out[label] = tuned.pop(label, list(vals))
        out.update(tuned)
        return out

    # -- persistence --------------------------------------------------------------------
    def reference_digest(self) -> str:
        """Digest of the references and BLEU options, stored with a saved pool."""
        h = hashlib.sha256()
        h.update(f"{self.refs.tokenize}|{self.refs.lowercase}|{self.num_sentences}".encode())
        for counts, lens in zip(self.refs._counts, self.refs._lens):
            h.update(repr(lens).encode())
            h.update(repr(sorted(counts.items())).encode())
        return h.hexdigest()

    def save(self, path: str) -> None:
        """Write the pool to ``path`` (.npz, no pickle) atomically."""
        flat = self.arrays()
        texts = [t for s in range(self.num_sentences) for t in self._texts[s]]
        blobs = [t.encode("utf-8") for t in texts]
        text_offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in blobs], out=text_offsets[1:])
        data = dict(
            version=np.array([POOL_VERSION], dtype=np.int64),
            features=flat.features, stats=flat.stats, offsets=flat.offsets,
            label_names=np.array([l for l, _ in self.labels], dtype=np.str_),
            label_sizes=np.array([k for _, k in self.labels], dtype=np.int64),
            text_bytes=np.frombuffer(b"".join(blobs), dtype=np.uint8),
            text_offsets=text_offsets,
            sources=np.array(self.sources, dtype=np.str_),
            ref_digest=np.array([self.reference_digest()], dtype=np.str_),
        )
        with atomic_open(path, suffix=".npz") as f:
            np.savez(f, **data)

    @classmethod
    def load(cls, path: str, refs: References) -> "KbestPool":
        """Read a pool saved by :meth:`save`; ``refs`` must be the references it was built with."""
        check_input(path)
        try:
            z = np.load(path, allow_pickle=False)
        except Exception as exc:          # OSError, ValueError, zipfile.BadZipFile, ...
            raise InputError(path, 0, f"cannot read the k-best pool: {exc}") from None
        try:
            return cls._from_npz(path, z, refs)
        except (KeyError, ValueError, TypeError, IndexError, EOFError, OSError) as exc:
            raise InputError(path, 0, f"damaged k-best pool ({type(exc).__name__}: {exc}); "
                             "delete it to rebuild from the k-best lists") from None
        finally:
            z.close()

    @classmethod
    def _from_npz(cls, path: str, z, refs: References) -> "KbestPool":
        """The pool stored in the open ``.npz`` ``z``, every array checked first."""
        if int(z["version"][0]) != POOL_VERSION:
            raise InputError(path, 0, f"pool version {int(z['version'][0])}, expected "
                             f"{POOL_VERSION}; delete it to rebuild from the k-best lists")
        pool = cls(refs)
        if str(z["ref_digest"][0]) != pool.reference_digest():
            raise InputError(path, 0, "the pool was built with other references or BLEU "
                             "options; delete it (or use the original --ref) to continue")
        feats, stats, offsets = z["features"], z["stats"], z["offsets"]
        tb, toff = z["text_bytes"].tobytes(), z["text_offsets"]
        pool.labels = [(str(l), int(k)) for l, k in zip(z["label_names"], z["label_sizes"])]
        if any(k < 1 for _, k in pool.labels):
            raise InputError(path, 0, "damaged k-best pool: a label without values")
        col = 0
        for label, k in pool.labels:
            pool._label_col[label] = (col, k)
            col += k
        pool.dim = col
        pool.sources = [str(s) for s in z["sources"]]
        if len(offsets) != pool.num_sentences + 1:
            raise InputError(path, 0, "pool sentence count differs from the references")
        _check_pool_arrays(path, feats, stats, offsets, toff, len(tb), pool.dim)
        for s in range(pool.num_sentences):
            for r in range(int(offsets[s]), int(offsets[s + 1])):
                vec = np.array(feats[r], dtype=np.float64)
                st = np.array(stats[r], dtype=np.int32)
                pool._keys[s].add(cls._key(vec, st))
                pool._rows[s].append(vec)
                pool._stats[s].append(st)
                pool._texts[s].append(tb[toff[r]:toff[r + 1]].decode("utf-8"))
        pool._flat = PoolArrays(np.ascontiguousarray(feats, dtype=np.float64),
                                np.ascontiguousarray(stats, dtype=np.int32),
                                np.asarray(offsets, dtype=np.int64))
        return pool
