# cython: language_level=3
"""Native inner loops of the tuners (:mod:`nlmfeature.mt.tuning`).

- :func:`segment_argmax`: the model-best hypothesis of every sentence;
- :func:`envelope`: Och's upper envelope of each sentence's lines ``a + b*gamma`` (one per
  hypothesis) and its breakpoints, for MERT's exact line search;
- :func:`mira_epoch`: one epoch of batch k-best MIRA (Cherry & Foster 2012) as Moses' kbmira.

Rows of a k-best pool are grouped by sentence: sentence ``s`` owns rows
``offsets[s]:offsets[s+1]``.  All loops run without the GIL.
"""
cimport cython
from libc.math cimport exp, log, INFINITY
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc, qsort

import numpy as np
cimport numpy as cnp

cnp.import_array()

cdef enum:
    ORDER = 4
    NSTATS = 10


cdef Py_ssize_t _check_offsets(const int64_t[::1] offsets, Py_ssize_t N) except -1:
    """Number of sentences after checking that ``offsets`` splits rows ``0..N-1`` into
    consecutive non-empty runs (``offsets[0] == 0``, strictly increasing, last ``== N``).
    Every loop below indexes raw buffers through ``offsets``: nothing reaches them unchecked."""
    cdef Py_ssize_t S = offsets.shape[0] - 1, s
    cdef bint ok = 1
    if S < 0:
        raise ValueError("offsets must have at least one entry (0)")
    with nogil:
        if offsets[0] != 0 or offsets[S] != N:
            ok = 0
        for s in range(S):
            if offsets[s + 1] <= offsets[s]:
                ok = 0
                break
    if not ok:
        raise ValueError(f"offsets must rise strictly from 0 to the number of rows ({N}): every "
                         "sentence needs at least one row")
    return S


def matvec(const double[:, ::1] F not None, const double[::1] w not None):
    """``F @ w`` for a tall, narrow ``F`` (N, D) in one thread (no BLAS thread start-up, which
    costs far more than the arithmetic on a busy machine)."""
    cdef Py_ssize_t N = F.shape[0], D = F.shape[1], i, d
    if w.shape[0] != D:
        raise ValueError(f"weights have {w.shape[0]} entries, features {D} columns")
    out = np.empty(N, dtype=np.float64)
    cdef double[::1] o = out
    cdef double acc
    with nogil:
        for i in range(N):
            acc = 0.0
            for d in range(D):
                acc = acc + F[i, d] * w[d]
            o[i] = acc
    return out


def one_best(const double[:, ::1] F not None, const double[::1] w not None, const int64_t[::1] offsets not None):
    """Row of the first model-best hypothesis (``F @ w`` maximal) of every sentence."""
    cdef Py_ssize_t S = _check_offsets(offsets, F.shape[0]), D = F.shape[1], s, j, d
    cdef int64_t best
    cdef double top, acc
    if w.shape[0] != D:
        raise ValueError(f"weights have {w.shape[0]} entries, features {D} columns")
    out = np.empty(S, dtype=np.int64)
    cdef int64_t[::1] o = out
    with nogil:
        for s in range(S):
            best = offsets[s]
            top = 0.0
            for j in range(offsets[s], offsets[s + 1]):
                acc = 0.0
                for d in range(D):
                    acc = acc + F[j, d] * w[d]
                if j == offsets[s] or acc > top:
                    top = acc
                    best = j
            o[s] = best
    return out


def segment_argmax(const double[::1] scores not None, const int64_t[::1] offsets not None):
    """Row index (int64) of the first maximum of ``scores`` within each sentence."""
    cdef Py_ssize_t S = _check_offsets(offsets, scores.shape[0]), s, j, best
    cdef double top
    out = np.empty(S, dtype=np.int64)
    cdef int64_t[::1] o = out
    with nogil:
        for s in range(S):
            best = offsets[s]
            top = scores[best]
            for j in range(offsets[s] + 1, offsets[s + 1]):
                if scores[j] > top:
                    top = scores[j]
                    best = j
            o[s] = best
    return out


cdef struct SlopeRow:
    double slope
    int64_t row


cdef int _cmp_slope(const void* a, const void* b) noexcept nogil:
    cdef const SlopeRow* x = <const SlopeRow*> a
    cdef const SlopeRow* y = <const SlopeRow*> b
    # a total order even with NaN (NaN after every number): glibc's qsort given an
    # inconsistent comparator (NaN compares "equal" to everything) writes outside the array
    cdef bint xn = x.slope != x.slope, yn = y.slope != y.slope
    if xn != yn:
        return 1 if xn else -1
    if not xn:
        if x.slope < y.slope:
            return -1
        if x.slope > y.slope:
            return 1
    return (x.row > y.row) - (x.row < y.row)


def slope_order(const double[::1] slope not None, const int64_t[::1] offsets not None):
    """Rows sentence by sentence, each sentence's rows by increasing slope (ties: row index);
    the ``order`` argument of :func:`envelope`."""
    cdef Py_ssize_t N = slope.shape[0], S = _check_offsets(offsets, N), s, p, n
    out = np.empty(N, dtype=np.int64)
    cdef int64_t[::1] o = out
    cdef SlopeRow* buf = <SlopeRow*> malloc(max(N, 1) * sizeof(SlopeRow))
    if buf == NULL:
        raise MemoryError()
    with nogil:
        for p in range(N):
            buf[p].slope = slope[p]
            buf[p].row = p
        for s in range(S):
            n = offsets[s + 1] - offsets[s]
            if n > 1:
                qsort(&buf[offsets[s]], n, sizeof(SlopeRow), _cmp_slope)
        for p in range(N):
            o[p] = buf[p].row
    free(buf)
    return out


def _envelope_outputs(Py_ssize_t S, Py_ssize_t N):
    """Output arrays of the envelopes: first row per sentence; breakpoints x, old, new (at
    most N - S of them: each sentence of k rows has at most k - 1)."""
    return (np.empty(S, dtype=np.int64), np.empty(N, dtype=np.float64),
            np.empty(N, dtype=np.int64), np.empty(N, dtype=np.int64))


cdef int _check_order(const int64_t[::1] order, const int64_t[::1] offsets) except -1:
    """``order`` must list, sentence by sentence, rows of that sentence only."""
    cdef Py_ssize_t S = offsets.shape[0] - 1, s, p
    cdef int64_t bad = -1
    with nogil:
        for s in range(S):
            for p in range(offsets[s], offsets[s + 1]):
                if order[p] < offsets[s] or order[p] >= offsets[s + 1]:
                    bad = p
                    break
            if bad >= 0:
                break
    if bad >= 0:
        raise ValueError(f"order[{bad}] = {order[bad]} is not a row of its sentence")
    return 0


def envelope(const double[::1] slope not None, const double[::1] icpt not None, const int64_t[::1] offsets not None,
             const int64_t[::1] order not None):
    """Upper envelope of the lines ``icpt[j] + slope[j] * x`` of every sentence.

    ``order`` lists the rows sentence by sentence, each sentence's rows sorted by increasing
    slope (ties by increasing row index).  Of lines with equal slope only the highest (first
    row among equal ones) can be on the envelope.

    Returns ``(first, x, old, new)``: ``first`` (S,) the best row as x -> -inf, and for every
    breakpoint (sentence by sentence, x increasing within a sentence) its position ``x`` and
    the rows that are best just left (``old``) and right (``new``) of it.
    """
    cdef Py_ssize_t N = slope.shape[0], S = _check_offsets(offsets, N)
    if icpt.shape[0] != N or order.shape[0] != N:
        raise ValueError(f"slope, icpt and order must have the same length ({N})")
    _check_order(order, offsets)
    first_a, x_a, old_a, new_a = _envelope_outputs(S, N)
    cdef int64_t[::1] first = first_a, old = old_a, new = new_a
    cdef double[::1] xs = x_a
    cdef int64_t* stack = <int64_t*> malloc(max(N, 1) * sizeof(int64_t))
    cdef double* start = <double*> malloc(max(N, 1) * sizeof(double))
    if stack == NULL or start == NULL:
        free(stack)
        free(start)
        raise MemoryError()
    cdef Py_ssize_t s, p, top, k, nb = 0
    cdef int64_t j, t
    cdef double x, mj, bj
    with nogil:
        for s in range(S):
            top = -1
            for p in range(offsets[s], offsets[s + 1]):
                j = order[p]
                mj = slope[j]
                bj = icpt[j]
                if top >= 0 and slope[stack[top]] == mj:
                    # parallel to the last line: keep the higher one (earlier row on ties)
                    if bj <= icpt[stack[top]]:
                        continue
                    top -= 1
                x = -INFINITY
                while top >= 0:
                    t = stack[top]
                    x = (icpt[t] - bj) / (mj - slope[t])
                    if top >= 1 and x <= start[top]:
                        top -= 1          # line t is nowhere on top
                        x = -INFINITY
                    else:
                        break
                top += 1
                stack[top] = j
                start[top] = x if top > 0 else -INFINITY
            first[s] = stack[0]
            for k in range(1, top + 1):
                xs[nb] = start[k]
                old[nb] = stack[k - 1]
                new[nb] = stack[k]
                nb += 1
    free(stack)
    free(start)
    return first_a, x_a[:nb].copy(), old_a[:nb].copy(), new_a[:nb].copy()


def envelope_unsorted(const double[::1] slope not None, const double[::1] icpt not None,
                      const int64_t[::1] offsets not None):
    """:func:`envelope` without a sort: per sentence, from the line on top as x -> -inf, the
    next envelope line is the one crossing the current line leftmost (ties: the steeper one,
    then the earlier row).  O(k * h) per sentence (h = envelope size, usually small)."""
    cdef Py_ssize_t N = slope.shape[0], S = _check_offsets(offsets, N)
    if icpt.shape[0] != N:
        raise ValueError(f"slope and icpt must have the same length ({N})")
    first_a, x_a, old_a, new_a = _envelope_outputs(S, N)
    cdef int64_t[::1] first = first_a, old = old_a, new = new_a
    cdef double[::1] xs = x_a
    cdef Py_ssize_t s, j, nb = 0
    cdef int64_t cur, nxt, lo, hi
    cdef double mc, bc, best_x, x, last_x
    with nogil:
        for s in range(S):
            lo = offsets[s]
            hi = offsets[s + 1]
            cur = lo
            for j in range(lo + 1, hi):
                if slope[j] < slope[cur] or (slope[j] == slope[cur] and icpt[j] > icpt[cur]):
                    cur = j
            first[s] = cur
            last_x = -INFINITY
            while True:
                mc = slope[cur]
                bc = icpt[cur]
                nxt = -1
                best_x = INFINITY
                for j in range(lo, hi):
                    # only strictly steeper lines: each step raises the slope, so a sentence
                    # of k rows has at most k - 1 breakpoints (NaN slopes never qualify, and
                    # a NaN current slope ends the walk) and nb never exceeds N
                    if not slope[j] > mc:
                        continue
                    x = (bc - icpt[j]) / (slope[j] - mc)
                    if x < last_x:
                        x = last_x          # rounding: cannot cross before the last breakpoint
                    if nxt < 0 or x < best_x or (x == best_x and (
                            slope[j] > slope[nxt] or (slope[j] == slope[nxt] and
                                                      icpt[j] > icpt[nxt]))):
                        best_x = x
                        nxt = j
                if nxt < 0:
                    break
                xs[nb] = best_x
                old[nb] = cur
                new[nb] = nxt
                nb += 1
                last_x = best_x
                cur = nxt
    return first_a, x_a[:nb].copy(), old_a[:nb].copy(), new_a[:nb].copy()


cdef inline double bg_bleu(const int32_t* st, const double* bg) noexcept nogil:
    """kbmira's sentence BLEU of ``st`` + background ``bg``, scaled by the reference length."""
    cdef double logbleu = 0.0, ref, t1, brevity
    cdef int n
    for n in range(ORDER):
        logbleu += log(st[2 + n] + bg[2 + n]) - log(st[2 + ORDER + n] + bg[2 + ORDER + n])
    logbleu /= ORDER
    ref = st[1] + bg[1]
    t1 = st[2 + ORDER] + bg[2 + ORDER]
    brevity = 1.0 - ref / t1
    if brevity < 0.0:
        logbleu += brevity
    return exp(logbleu) * ref


@cython.boundscheck(False)
@cython.wraparound(False)
def mira_epoch(const double[:, ::1] F not None, const int32_t[:, ::1] stats not None, const int64_t[::1] offsets not None,
               const int64_t[::1] sentence_order not None, double[::1] w not None, double[::1] total not None,
               double[::1] bg not None, double C, double decay, bint model_bg, int64_t num_updates):
    """One epoch of batch MIRA over the sentences in ``sentence_order`` (Moses kbmira).

    Per sentence: hope = argmax(model + BLEU), fear = argmax(model - BLEU), with BLEU the
    background sentence BLEU of :func:`bg_bleu`; when they differ and hope's BLEU is higher,
    ``w += min(C, loss / |df|^2) * df`` for a positive hinge loss, then the background decays
    and absorbs the hope's (or with ``model_bg`` the model-best's) statistics.

    ``w`` (current weights), ``total`` (running sum for averaging: initial weights plus the
    weights after every update) and ``bg`` are updated in place.  Returns
    ``(num_updates, updates_this_epoch, summed_loss)``; the averaged weights are
    ``total / num_updates`` (or ``w`` while no update happened), as kbmira's AvgWeightVector.
    """
    cdef Py_ssize_t D = F.shape[1], ii, j, d, k
    cdef Py_ssize_t nsent = sentence_order.shape[0]
    # bounds checks are off below: check every index source first
    cdef Py_ssize_t S = _check_offsets(offsets, F.shape[0])
    if stats.shape[0] != F.shape[0] or stats.shape[1] != NSTATS:
        raise ValueError(f"stats must be ({F.shape[0]}, {NSTATS}), not "
                         f"({stats.shape[0]}, {stats.shape[1]})")
    if w.shape[0] != D or total.shape[0] != D:
        raise ValueError(f"w and total must have {D} entries (the feature columns)")
    if bg.shape[0] != NSTATS:
        raise ValueError(f"bg must have {NSTATS} entries")
    for ii in range(nsent):
        if not 0 <= sentence_order[ii] < S:
            raise ValueError(f"sentence_order[{ii}] = {sentence_order[ii]} is not a sentence "
                             f"(0..{S - 1})")
    cdef int64_t s, hope, fear, model, updates = 0
    cdef double score, bleu, hope_s = 0, fear_s = 0, model_s = 0
    cdef double hope_bleu, fear_bleu, loss, norm, eta, sum_loss = 0.0, diff
    cdef const int32_t* upd
    with nogil:
        for ii in range(nsent):
            s = sentence_order[ii]
            hope = fear = model = offsets[s]
            for j in range(offsets[s], offsets[s + 1]):
                score = 0.0
                for d in range(D):
                    score += F[j, d] * w[d]
                bleu = bg_bleu(&stats[j, 0], &bg[0])
                if j == offsets[s] or score + bleu > hope_s:
                    hope_s = score + bleu
                    hope = j
                if j == offsets[s] or score - bleu > fear_s:
                    fear_s = score - bleu
                    fear = j
                if j == offsets[s] or score > model_s:
                    model_s = score
                    model = j
            if hope == fear:
                continue
            hope_bleu = bg_bleu(&stats[hope, 0], &bg[0])
            fear_bleu = bg_bleu(&stats[fear, 0], &bg[0])
            if not hope_bleu > fear_bleu:
                continue
            loss = hope_bleu - fear_bleu
            norm = 0.0
            for d in range(D):
                diff = F[hope, d] - F[fear, d]
                loss -= w[d] * diff
                norm += diff * diff
            if loss > 0:
                eta = loss / norm if norm > 0 else INFINITY
                if eta > C:
                    eta = C
                num_updates += 1
                updates += 1
                for d in range(D):
                    w[d] += eta * (F[hope, d] - F[fear, d])
                    total[d] += w[d]
                sum_loss += loss
            upd = &stats[model, 0] if model_bg else &stats[hope, 0]
            for k in range(NSTATS):
                bg[k] = bg[k] * decay + upd[k]
    return num_updates, updates, sum_loss
