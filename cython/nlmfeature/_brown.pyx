# cython: language_level=3
"""Brown clustering kernel: the windowed agglomerative algorithm of Brown et al. (1992) as
Liang (2005, ``wcluster``) implements it, with the merge-loss table updated incrementally.

Words are given as ids ``0..n-1`` in the order they enter the window (decreasing frequency).
The window holds at most ``C + 1`` clusters in *slots*.  For each slot pair the kernel keeps

* ``p2[s, t]``: probability of the bigram (cluster s, cluster t) among all counted bigrams,
* ``q2[s, t] = p2 log(p2 / (pl[s] pr[t]))``: the pair's term of the average mutual
  information (AMI), where ``pl``/``pr`` are the left/right marginals of the *whole* bigram
  table (so the AMI of the final clustering is exactly the class-bigram mutual information),
* ``L[s, t]`` (s < t): the AMI lost if s and t were merged,
* ``S[s] = sum_t (q2[s, t] + q2[t, s]) - q2[s, s]``: every AMI term that involves s.

Adding a word and merging two clusters each update every ``L`` in O(C^2) (Liang's formulas);
terms whose bigram probabilities are zero cost no logarithm, which makes the frequent case
(a rare new word) cheap.  Loops over slot pairs run in parallel (OpenMP ``prange``).
All logarithms are natural; the AMI returned is in nats.
"""
cimport cython
from cython.parallel cimport prange
from cpython.exc cimport PyErr_CheckSignals
from libc.math cimport log, fabs, INFINITY
from libc.stdint cimport int32_t, int64_t

import numpy as np
cimport numpy as cnp

cnp.import_array()


cdef inline double qterm(double pxy, double px, double py) noexcept nogil:
    """p log(p / (px py)), 0 for p = 0."""
    if pxy <= 0.0:
        return 0.0
    return pxy * log(pxy / (px * py))


cdef inline double safe_log(double x) noexcept nogil:
    return log(x) if x > 0.0 else -INFINITY


cdef inline double correction(double x, double y, double lmarg) noexcept nogil:
    """(x+y)(log(x+y) - lmarg) - x(log(x) - lmarg), 0 log 0 = 0: replaces a bigram mass x by
    x + y in a term p (log p - lmarg)."""
    if x > 0.0:
        return (x + y) * (log(x + y) - lmarg) - x * (log(x) - lmarg)
    return y * (log(y) - lmarg)


cdef inline double split_gain(double x, double y, double lx, double ly, double lxy) noexcept nogil:
    """x log(x) + y log(y) - (x+y) log(x+y) - x lx - y ly + (x+y) lxy, with 0 log 0 = 0.

    It is q(e,a) + q(e,b) - q(e,a+b) for bigram masses x = p(e,a), y = p(e,b) and log
    marginals lx, ly, lxy of a, b and a+b: the marginal of e cancels out."""
    if x <= 0.0:
        if y <= 0.0:
            return 0.0
        return y * (lxy - ly)
    if y <= 0.0:
        return x * (lxy - lx)
    return x * log(x) + y * log(y) - (x + y) * log(x + y) - x * lx - y * ly + (x + y) * lxy


cdef class BrownKernel:
    """State of one clustering run (see the module docstring).  Use :func:`cluster`."""

    cdef int n, C, K, nthreads
    cdef int n_active, next_id
    cdef double mi
    # word data
    cdef const int64_t* r_start
    cdef const int32_t* r_word
    cdef const double* r_prob
    cdef const int64_t* l_start
    cdef const int32_t* l_word
    cdef const double* l_prob
    cdef const double* word_pl
    cdef const double* word_pr
    cdef int32_t[::1] word_slot, next_word
    # slot data
    cdef double[:, ::1] p2, q2, L
    cdef double[::1] pl, pr, lpl, lpr, S, qa, qb, qm, pm_l, pm_r, row_min, rowL, colR, newL
    cdef int32_t[::1] active, pos, slot_id, head, tail, size, free_slots, row_arg, nz, in_nz
    cdef int n_free
    cdef public double max_check_error   # largest |incremental - full| loss seen (check mode)
    cdef public bint check               # compare every incremental loss with a full computation
    # keep the inputs alive
    cdef object _keep

    def __cinit__(self, int n, int C, r_start, r_word, r_prob, l_start, l_word, l_prob,
                  word_pl, word_pr, int nthreads):
        cdef int64_t[::1] rs = r_start, ls = l_start
        cdef int32_t[::1] rw = r_word, lw = l_word
        cdef double[::1] rp = r_prob, lp = l_prob, wpl = word_pl, wpr = word_pr
        self._keep = (r_start, r_word, r_prob, l_start, l_word, l_prob, word_pl, word_pr)
        self.n, self.C, self.K = n, C, C + 1
        self.nthreads = max(1, nthreads)
        self.r_start, self.l_start = &rs[0], &ls[0]
        self.r_word = &rw[0] if rw.shape[0] else NULL
        self.l_word = &lw[0] if lw.shape[0] else NULL
        self.r_prob = &rp[0] if rp.shape[0] else NULL
        self.l_prob = &lp[0] if lp.shape[0] else NULL
        self.word_pl, self.word_pr = &wpl[0], &wpr[0]
        K = self.K
        self.word_slot = np.full(n, -1, dtype=np.int32)
        self.next_word = np.full(n, -1, dtype=np.int32)
        self.p2 = np.zeros((K, K)); self.q2 = np.zeros((K, K)); self.L = np.zeros((K, K))
        self.pl = np.zeros(K); self.pr = np.zeros(K); self.lpl = np.zeros(K); self.lpr = np.zeros(K)
        self.S = np.zeros(K); self.qa = np.zeros(K); self.qb = np.zeros(K); self.qm = np.zeros(K)
        self.pm_l = np.zeros(K); self.pm_r = np.zeros(K); self.row_min = np.zeros(K)
        self.rowL = np.zeros(K); self.colR = np.zeros(K); self.newL = np.zeros(K)
        self.check = False
        self.max_check_error = 0.0
        self.active = np.zeros(K, dtype=np.int32)
        self.pos = np.full(K, -1, dtype=np.int32)
        self.slot_id = np.full(K, -1, dtype=np.int32)
        self.head = np.full(K, -1, dtype=np.int32)
        self.tail = np.full(K, -1, dtype=np.int32)
        self.size = np.zeros(K, dtype=np.int32)
        self.row_arg = np.zeros(K, dtype=np.int32)
        self.nz = np.zeros(K, dtype=np.int32)
        self.in_nz = np.zeros(K, dtype=np.int32)
        self.free_slots = np.arange(K - 1, -1, -1, dtype=np.int32)
        self.n_free = K
        self.n_active = 0
        self.next_id = n
        self.mi = 0.0

    # ----------------------------------------------------------------------------------
    # helpers
    # ----------------------------------------------------------------------------------
    cdef inline double hyp_left(self, int x, int y, int u, double lplxy) noexcept nogil:
        """q((x+y) -> u) for a hypothetical merge of x and y; lplxy = log(pl[x] + pl[y])."""
        cdef double a = self.p2[x, u], b = self.p2[y, u]
        if a <= 0.0:
            if b <= 0.0:
                return 0.0
            return self.q2[y, u] + b * (self.lpl[y] - lplxy)
        if b <= 0.0:
            return self.q2[x, u] + a * (self.lpl[x] - lplxy)
        return (a + b) * (log(a + b) - lplxy - self.lpr[u])

    cdef inline double hyp_right(self, int x, int y, int u, double lprxy) noexcept nogil:
        """q(u -> (x+y)) for a hypothetical merge of x and y; lprxy = log(pr[x] + pr[y])."""
        cdef double a = self.p2[u, x], b = self.p2[u, y]
        if a <= 0.0:
            if b <= 0.0:
                return 0.0
            return self.q2[u, y] + b * (self.lpr[y] - lprxy)
        if b <= 0.0:
            return self.q2[u, x] + a * (self.lpr[x] - lprxy)
        return (a + b) * (log(a + b) - self.lpl[u] - lprxy)

    cdef double full_loss(self, int s, int t) noexcept nogil:
        """L[s, t] from scratch: O(active clusters)."""
        cdef double plst = self.pl[s] + self.pl[t], prst = self.pr[s] + self.pr[t]
        cdef double lplst = log(plst) if plst > 0 else -INFINITY
        cdef double lprst = log(prst) if prst > 0 else -INFINITY
        cdef double l = self.S[s] + self.S[t] - self.q2[s, t] - self.q2[t, s]
        cdef int i, u
        for i in range(self.n_active):
            u = self.active[i]
            if u == s or u == t:
                continue
            l -= self.hyp_left(s, t, u, lplst) + self.hyp_right(s, t, u, lprst)
        l -= qterm(self.p2[s, s] + self.p2[s, t] + self.p2[t, s] + self.p2[t, t], plst, prst)
        return l

    cdef inline void set_loss(self, int s, int t, double v) noexcept nogil:
        if s < t:
            self.L[s, t] = v
        else:
            self.L[t, s] = v

    cdef inline double get_loss(self, int s, int t) noexcept nogil:
        return self.L[s, t] if s < t else self.L[t, s]

    cdef void activate(self, int s, int cid) noexcept nogil:
        self.active[self.n_active] = s
        self.pos[s] = self.n_active
        self.n_active += 1
        self.slot_id[s] = cid

    cdef void deactivate(self, int s) noexcept nogil:
        cdef int i = self.pos[s], last = self.active[self.n_active - 1]
        self.active[i] = last
        self.pos[last] = i
        self.n_active -= 1
        self.pos[s] = -1
        self.slot_id[s] = -1
        self.free_slots[self.n_free] = s
        self.n_free += 1

    # ----------------------------------------------------------------------------------
    # adding a word
    # ----------------------------------------------------------------------------------
    cdef inline int nt(self, long work) noexcept nogil:
        """Threads for a parallel loop of ``work`` inner steps (1 for small loops: an OpenMP
        barrier costs more than it saves there, and much more on a loaded machine)."""
        return self.nthreads if work >= 40000 else 1

    cdef void add_word(self, int w) noexcept nogil:
        cdef int s, i, t, n_nz = 0
        cdef int64_t k
        cdef double d, rowsum = 0.0, rl, cr, v
        self.n_free -= 1
        s = self.free_slots[self.n_free]
        # clear the slot's row and column over the active slots (and itself)
        for i in range(self.n_active):
            t = self.active[i]
            self.p2[s, t] = 0.0; self.p2[t, s] = 0.0
            self.q2[s, t] = 0.0; self.q2[t, s] = 0.0
        self.p2[s, s] = 0.0; self.q2[s, s] = 0.0
        self.activate(s, w)
        self.word_slot[w] = s
        self.head[s] = w; self.tail[s] = w; self.next_word[w] = -1; self.size[s] = 1
        self.pl[s] = self.word_pl[w]; self.pr[s] = self.word_pr[w]
        self.lpl[s] = log(self.pl[s]) if self.pl[s] > 0 else -INFINITY
        self.lpr[s] = log(self.pr[s]) if self.pr[s] > 0 else -INFINITY
        # bigrams with the words already in the window
        for k in range(self.r_start[w], self.r_start[w + 1]):
            t = self.word_slot[self.r_word[k]]
            if t >= 0:
                self.p2[s, t] += self.r_prob[k]
        for k in range(self.l_start[w], self.l_start[w + 1]):
            if self.l_word[k] == w:
                continue  # the bigram (w, w) was counted with the right neighbours
            t = self.word_slot[self.l_word[k]]
            if t >= 0:
                self.p2[t, s] += self.l_prob[k]
        # q2, the slots s touches (nz), S, row/column sums and the AMI
        rl = self.p2[s, s]
        cr = self.p2[s, s]
        for i in range(self.n_active):
            t = self.active[i]
            if t == s:
                continue
            if self.p2[s, t] > 0.0 or self.p2[t, s] > 0.0:
                rl += self.p2[s, t]; cr += self.p2[t, s]
                self.rowL[t] += self.p2[t, s]; self.colR[t] += self.p2[s, t]
                self.q2[s, t] = qterm(self.p2[s, t], self.pl[s], self.pr[t])
                self.q2[t, s] = qterm(self.p2[t, s], self.pl[t], self.pr[s])
                d = self.q2[s, t] + self.q2[t, s]
                self.S[t] += d
                rowsum += d
                self.nz[n_nz] = t
                self.in_nz[t] = 1
                n_nz += 1
        self.rowL[s] = rl; self.colR[s] = cr
        self.q2[s, s] = qterm(self.p2[s, s], self.pl[s], self.pr[s])
        self.S[s] = rowsum + self.q2[s, s]
        self.mi += self.S[s]
        # old pairs (t, u) gain the terms with s: only pairs touching nz change
        for i in prange(n_nz, nogil=True, schedule="dynamic",
                        num_threads=self.nt(<long>n_nz * self.n_active)):
            self._add_update_row(s, self.nz[i])
        for i in range(n_nz):
            self.in_nz[self.nz[i]] = 0
        # the new slot's losses: from t's terms plus corrections for the slots s touches
        for i in prange(self.n_active, nogil=True, schedule="static",
                        num_threads=self.nt(<long>self.n_active * (n_nz + 8))):
            if self.active[i] != s:
                self.newL[self.active[i]] = self.add_loss(s, self.active[i], n_nz)
        for i in range(self.n_active):
            t = self.active[i]
            if t != s:
                self.set_loss(s, t, self.newL[t])
                if self.check:
                    v = fabs(self.newL[t] - self.full_loss(s, t))
                    if v > self.max_check_error:
                        self.max_check_error = v

    cdef void _add_update_row(self, int s, int t) noexcept nogil:
        cdef int j, u
        cdef double pts = self.p2[t, s], pst = self.p2[s, t], a, b
        cdef double bt = self.q2[t, s] + self.q2[s, t]
        for j in range(self.n_active):
            u = self.active[j]
            if u == s or u == t or (self.in_nz[u] and u < t):
                continue
            a = pts + self.p2[u, s]
            b = pst + self.p2[s, u]
            self.set_loss(t, u, self.get_loss(t, u) + bt + self.q2[u, s] + self.q2[s, u]
                          - qterm(a, self.pl[t] + self.pl[u], self.pr[s])
                          - qterm(b, self.pl[s], self.pr[t] + self.pr[u]))

    cdef double add_loss(self, int s, int t, int n_nz) noexcept nogil:
        """L[s, t] for the slot s of the word just added, in O(|nz|): the terms of s+t with a
        slot u that s has no bigram with are t's terms with the marginal of s+t."""
        cdef double plst = self.pl[s] + self.pl[t], prst = self.pr[s] + self.pr[t]
        cdef double lplst = safe_log(plst), lprst = safe_log(prst)
        cdef double H, PL, PR, x, y
        cdef int k, u
        H = self.S[t] - self.q2[t, t] - self.q2[t, s] - self.q2[s, t]
        PL = self.rowL[t] - self.p2[t, t] - self.p2[t, s]
        PR = self.colR[t] - self.p2[t, t] - self.p2[s, t]
        if PL > 0.0 and self.pl[t] > 0.0:
            H += PL * (self.lpl[t] - lplst)
        if PR > 0.0 and self.pr[t] > 0.0:
            H += PR * (self.lpr[t] - lprst)
        for k in range(n_nz):
            u = self.nz[k]
            if u == t:
                continue
            y = self.p2[s, u]
            if y > 0.0:
                x = self.p2[t, u]
                H += correction(x, y, lplst + self.lpr[u])
            y = self.p2[u, s]
            if y > 0.0:
                x = self.p2[u, t]
                H += correction(x, y, self.lpl[u] + lprst)
        H += qterm(self.p2[s, s] + self.p2[s, t] + self.p2[t, s] + self.p2[t, t], plst, prst)
        return self.S[s] + self.S[t] - self.q2[s, t] - self.q2[t, s] - H

    # ----------------------------------------------------------------------------------
    # merging two clusters
    # ----------------------------------------------------------------------------------
    cdef void best_pair(self, int* bs, int* bt) noexcept nogil:
        cdef int i
        cdef double best = INFINITY
        for i in prange(self.n_active, nogil=True, schedule="dynamic",
                        num_threads=self.nt(<long>self.n_active * self.n_active // 2)):
            self._row_min(i)
        bs[0] = -1; bt[0] = -1
        for i in range(self.n_active - 1):
            if self.row_min[i] < best:
                best = self.row_min[i]
                bs[0] = self.active[i]
                bt[0] = self.row_arg[i]

    cdef void _row_min(self, int i) noexcept nogil:
        cdef int j, s = self.active[i], t, arg = -1
        cdef double v, best = INFINITY
        for j in range(i + 1, self.n_active):
            t = self.active[j]
            v = self.get_loss(s, t)
            if v < best:
                best = v
                arg = t
        self.row_min[i] = best
        self.row_arg[i] = arg

    cdef int _nz_list(self, int b, int a) noexcept nogil:
        """Fill nz with the active slots other than a and b that b has a bigram with."""
        cdef int i, u, n = 0
        for i in range(self.n_active):
            u = self.active[i]
            if u != a and u != b and (self.p2[b, u] > 0.0 or self.p2[u, b] > 0.0):
                self.nz[n] = u
                n += 1
        return n

    cdef void merge(self, int a0, int b0, int32_t* record, double* loss) noexcept nogil:
        """Merge the clusters in slots a0 and b0; the result keeps the slot of the larger."""
        cdef int i, v, keep, gone, w, a, b, n_nz, na, nb
        cdef bint incremental
        cdef double plm = self.pl[a0] + self.pl[b0], prm = self.pr[a0] + self.pr[b0]
        cdef double lplm = safe_log(plm), lprm = safe_log(prm)
        cdef double pmm, Sm, e
        loss[0] = self.get_loss(a0, b0)
        self.mi -= loss[0]
        if self.slot_id[a0] < self.slot_id[b0]:
            record[0] = self.slot_id[a0]; record[1] = self.slot_id[b0]
        else:
            record[0] = self.slot_id[b0]; record[1] = self.slot_id[a0]
        record[2] = self.next_id
        # b: the cluster with fewer bigram partners (usually the word just added)
        na = self._nz_list(a0, b0)
        nb = self._nz_list(b0, a0)
        if na < nb:
            a, b, n_nz = b0, a0, na
            self._nz_list(a0, b0)
        else:
            a, b, n_nz = a0, b0, nb
        incremental = n_nz * 4 < self.n_active
        # per-slot terms of a, b and the merged cluster m
        Sm = 0.0
        for i in range(self.n_active):
            v = self.active[i]
            if v == a or v == b:
                continue
            self.qa[v] = self.q2[v, a] + self.q2[a, v]
            self.qb[v] = self.q2[v, b] + self.q2[b, v]
            self.pm_l[v] = self.p2[a, v] + self.p2[b, v]   # m -> v
            self.pm_r[v] = self.p2[v, a] + self.p2[v, b]   # v -> m
            self.qm[v] = qterm(self.pm_l[v], plm, self.pr[v]) + qterm(self.pm_r[v], self.pl[v], prm)
            Sm += self.qm[v]
        pmm = self.p2[a, a] + self.p2[a, b] + self.p2[b, a] + self.p2[b, b]
        Sm += qterm(pmm, plm, prm)
        # every other pair's loss (Liang's update)
        for i in prange(self.n_active, nogil=True, schedule="dynamic",
                        num_threads=self.nt(<long>self.n_active * self.n_active // 2)):
            self._merge_update_row(i, a, b, lplm, lprm)
        # the merged cluster's losses from a's old ones (needs the old state of a and b)
        if incremental:
            for i in prange(self.n_active, nogil=True, schedule="static",
                            num_threads=self.nt(<long>self.n_active * (n_nz + 8))):
                if self.active[i] != a and self.active[i] != b:
                    self.newL[self.active[i]] = self.merge_loss(a, b, self.active[i], n_nz, Sm, pmm)
        # write m into the slot of the larger cluster
        if self.size[a] >= self.size[b]:
            keep, gone = a, b
        else:
            keep, gone = b, a
        for i in range(self.n_active):
            v = self.active[i]
            if v == a or v == b:
                continue
            self.p2[keep, v] = self.pm_l[v]; self.p2[v, keep] = self.pm_r[v]
            self.q2[keep, v] = qterm(self.pm_l[v], plm, self.pr[v])
            self.q2[v, keep] = qterm(self.pm_r[v], self.pl[v], prm)
            self.S[v] += self.qm[v] - self.qa[v] - self.qb[v]
        self.p2[keep, keep] = pmm
        self.q2[keep, keep] = qterm(pmm, plm, prm)
        self.pl[keep] = plm; self.pr[keep] = prm
        self.lpl[keep] = lplm; self.lpr[keep] = lprm
        self.rowL[keep] = self.rowL[a] + self.rowL[b]
        self.colR[keep] = self.colR[a] + self.colR[b]
        self.S[keep] = Sm
        # move the words of `gone` to `keep`
        w = self.head[gone]
        while w >= 0:
            self.word_slot[w] = keep
            w = self.next_word[w]
        self.next_word[self.tail[keep]] = self.head[gone]
        self.tail[keep] = self.tail[gone]
        self.size[keep] += self.size[gone]
        self.head[gone] = -1; self.tail[gone] = -1; self.size[gone] = 0
        self.deactivate(gone)
        self.slot_id[keep] = self.next_id
        self.next_id += 1
        if incremental:
            for i in range(self.n_active):
                v = self.active[i]
                if v != keep:
                    self.set_loss(keep, v, self.newL[v])
                    if self.check:
                        e = fabs(self.newL[v] - self.full_loss(keep, v))
                        if e > self.max_check_error:
                            self.max_check_error = e
        else:
            for i in prange(self.n_active, nogil=True, schedule="dynamic",
                            num_threads=self.nt(<long>self.n_active * self.n_active)):
                if self.active[i] != keep:
                    self.set_loss(keep, self.active[i], self.full_loss(keep, self.active[i]))

    cdef double merge_loss(self, int a, int b, int t, int n_nz, double Sm, double pmm) noexcept nogil:
        """L[m, t] for m = a + b (b with the bigram partners nz), in O(|nz|), from the old
        L[a, t]: the terms of m+t with a slot u that b has no bigram with are those of a+t
        with the marginal of m+t."""
        cdef double ple = self.pl[a] + self.pl[t], pre = self.pr[a] + self.pr[t]
        cdef double plf = ple + self.pl[b], prf = pre + self.pr[b]
        cdef double lple = safe_log(ple), lpre = safe_log(pre)
        cdef double lplf = safe_log(plf), lprf = safe_log(prf)
        cdef double H, PL, PR, x, y, St
        cdef int k, u
        # H(a+t) before the merge, recovered from L[a, t]
        H = self.S[a] + self.S[t] - self.q2[a, t] - self.q2[t, a] - self.get_loss(a, t)
        H -= qterm(self.p2[a, b] + self.p2[t, b], ple, self.pr[b])
        H -= qterm(self.p2[b, a] + self.p2[b, t], self.pl[b], pre)
        H -= qterm(self.p2[a, a] + self.p2[a, t] + self.p2[t, a] + self.p2[t, t], ple, pre)
        PL = (self.rowL[a] - self.p2[a, a] - self.p2[a, b] - self.p2[a, t]
              + self.rowL[t] - self.p2[t, a] - self.p2[t, b] - self.p2[t, t])
        PR = (self.colR[a] - self.p2[a, a] - self.p2[b, a] - self.p2[t, a]
              + self.colR[t] - self.p2[a, t] - self.p2[b, t] - self.p2[t, t])
        if PL > 0.0 and ple > 0.0:
            H += PL * (lple - lplf)
        if PR > 0.0 and pre > 0.0:
            H += PR * (lpre - lprf)
        for k in range(n_nz):
            u = self.nz[k]
            if u == t:
                continue
            y = self.p2[b, u]
            if y > 0.0:
                x = self.p2[a, u] + self.p2[t, u]
                H += correction(x, y, lplf + self.lpr[u])
            y = self.p2[u, b]
            if y > 0.0:
                x = self.p2[u, a] + self.p2[u, t]
                H += correction(x, y, self.lpl[u] + lprf)
        H += qterm(pmm + self.pm_l[t] + self.pm_r[t] + self.p2[t, t], plf, prf)
        St = self.S[t] + self.qm[t] - self.qa[t] - self.qb[t]
        return Sm + St - self.qm[t] - H

    cdef void _merge_update_row(self, int i, int a, int b, double lplm, double lprm) noexcept nogil:
        cdef int j, v = self.active[i], w
        cdef double base_v, l
        if v == a or v == b:
            return
        base_v = self.qm[v] - self.qa[v] - self.qb[v]
        for j in range(i + 1, self.n_active):
            w = self.active[j]
            if w == a or w == b:
                continue
            # e = v+w: q(e,a) + q(e,b) - q(e,m) and q(a,e) + q(b,e) - q(m,e)
            l = base_v + self.qm[w] - self.qa[w] - self.qb[w]
            l += split_gain(self.p2[v, a] + self.p2[w, a], self.p2[v, b] + self.p2[w, b],
                            self.lpr[a], self.lpr[b], lprm)
            l += split_gain(self.p2[a, v] + self.p2[a, w], self.p2[b, v] + self.p2[b, w],
                            self.lpl[a], self.lpl[b], lplm)
            self.set_loss(v, w, self.get_loss(v, w) + l)

    # ----------------------------------------------------------------------------------
    # driver
    # ----------------------------------------------------------------------------------
    def run(self, progress=None, int every=256):
        """Cluster all words; returns (merges (n-1, 3) int32 rows (child0, child1, new id),
        losses (n-1,), AMI after stage 1 (nats), number of stage-1 merges).  Signals are
        handled every ``every`` words (and merges): Ctrl-C raises KeyboardInterrupt within
        seconds, not at the end of a run of hours."""
        cdef int n = self.n, C = self.C, w, s, t, m = 0, stage1 = 0
        cdef int32_t[:, ::1] merges = np.zeros((max(n - 1, 0), 3), dtype=np.int32)
        cdef double[::1] losses = np.zeros(max(n - 1, 0))
        cdef double mi_stage1
        cdef int step
        for w in range(n):
            with nogil:
                self.add_word(w)
                if self.n_active > C:
                    self.best_pair(&s, &t)
                    self.merge(s, t, &merges[m, 0], &losses[m])
                    m += 1
            if (w + 1) % every == 0:
                PyErr_CheckSignals()
                if progress is not None:
                    progress(every)
        if progress is not None and n % every:
            progress(n % every)
        stage1 = m
        mi_stage1 = self.mi
        while self.n_active > 1:
            with nogil:
                self.best_pair(&s, &t)
                self.merge(s, t, &merges[m, 0], &losses[m])
            m += 1
            if m % every == 0:
                PyErr_CheckSignals()
        return np.asarray(merges), np.asarray(losses), mi_stage1, stage1

    @property
    def ami(self) -> float:
        """Current AMI of the clusters in the window (nats)."""
        return self.mi
