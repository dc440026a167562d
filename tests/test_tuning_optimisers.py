"""MERT, MIRA and PRO on real Moses k-best lists: exact line search, BLEU gains checked by sacrebleu."""
from __future__ import annotations

import os

import numpy as np
import pytest
import sacrebleu

from nlmfeature import _mert
from nlmfeature.mt.bleu import References, background_bleu, corpus_bleu
from nlmfeature.mt.tuning import optimise_pool
from nlmfeature.mt.tuning.data import KbestPool
from nlmfeature.mt.tuning.mert import LineSearcher, MertOptions
from nlmfeature.mt.tuning import mert, mira, pro
from nlmfeature.mt.weights import read_weights

DATA = os.path.join(os.path.dirname(__file__), "data", "tuning")
IT1 = os.path.join(DATA, "multi30k.dev.iter1.200x30.kbest.gz")
IT2 = os.path.join(DATA, "multi30k.dev.iter2.200x30.kbest.gz")
REF = os.path.join(DATA, "multi30k.dev.ref.200.en")
INI1 = os.path.join(DATA, "multi30k.dev.iter1.moses.ini")
REG = [os.path.join(DATA, f"regtest.nbest.{i}.gz") for i in (1, 2)]
REG_REF = os.path.join(DATA, "regtest.reference")


@pytest.fixture(scope="module")
def m30k():
    refs = References.from_files([REF])
    pool = KbestPool(refs)
    pool.add_file(IT1)
    pool.add_file(IT2)
    w0 = pool.weight_vector(read_weights(INI1), INI1)
    return pool, w0


@pytest.fixture(scope="module")
def regtest():
    pool = KbestPool(References.from_files([REG_REF]))
    for p in REG:
        pool.add_file(p)
    return pool


def sacrebleu_of(pool, weights):
    """sacrebleu's corpus BLEU of the 1-best texts under ``weights`` (independent check)."""
    rows = LineSearcher(pool.arrays()).one_best(weights)
    with open(REF, encoding="utf-8") as f:
        refs = [l.rstrip("\n") for l in f]
    return sacrebleu.corpus_bleu(pool.texts(rows), [refs], tokenize="none", force=True).score


def brute_force(searcher, origin, direction, grid):
    """BLEU at every grid point along the line, by re-ranking from scratch."""
    return np.array([searcher.bleu(origin + x * direction) for x in grid])


# -- MERT line search -------------------------------------------------------------------------
def test_envelope_matches_argmax_everywhere(regtest):
    A = regtest.arrays()
    s = LineSearcher(A)
    rng = np.random.default_rng(3)
    origin, direction = rng.standard_normal(s.dim), rng.standard_normal(s.dim)
    slope, icpt = s.F @ direction, s.F @ origin
    order = np.lexsort((slope, s.sentence))
    first, xs, old, new = _mert.envelope(slope, icpt, A.offsets, order)
    # the first line is the best as x -> -inf: smallest slope, then highest intercept
    for sid in range(A.num_sentences):
        lo, hi = A.offsets[sid], A.offsets[sid + 1]
        cand = np.flatnonzero(slope[lo:hi] == slope[lo:hi].min())
        assert first[sid] == lo + cand[np.argmax(icpt[lo:hi][cand])]
    # walk every sentence's breakpoints: between them the argmax must be the envelope's line
    for sid in range(A.num_sentences):
        lo, hi = A.offsets[sid], A.offsets[sid + 1]
        mask = (old >= lo) & (old < hi)
        bx, bnew = xs[mask], new[mask]
        assert np.all(np.diff(bx) > 0)
        pad = [bx[0] - 1.0] if len(bx) else [-1.0]
        edges = np.concatenate((pad, bx, [bx[-1] + 1.0] if len(bx) else [1.0]))
        owners = np.concatenate(([first[sid]], bnew))
        for (a, b), owner in zip(zip(edges[:-1], edges[1:]), owners):
            x = 0.5 * (a + b)
            scores = icpt[lo:hi] + x * slope[lo:hi]
            assert scores[owner - lo] == pytest.approx(scores.max(), abs=1e-9)


def test_envelope_without_sort_equals_sorted_envelope(m30k):
    pool, w0 = m30k
    A = pool.arrays()
    s = LineSearcher(A)
    rng = np.random.default_rng(11)
    for trial in range(5):
        direction = rng.standard_normal(s.dim) if trial else np.eye(s.dim)[8]   # WordPenalty:
        slope, icpt = _mert.matvec(s.F, direction), _mert.matvec(s.F, w0)      # many ties
        assert np.allclose(slope, s.F @ direction) and np.allclose(icpt, s.F @ w0)
        order = _mert.slope_order(slope, A.offsets)
        assert np.array_equal(order, np.lexsort((slope, s.sentence)))
        a = _mert.envelope(slope, icpt, A.offsets, order)
        b = _mert.envelope_unsorted(slope, icpt, A.offsets)
        assert np.array_equal(a[0], b[0])
        assert np.array_equal(a[2], b[2]) and np.array_equal(a[3], b[3])
        np.testing.assert_allclose(a[1], b[1], rtol=1e-9, atol=1e-12)
    assert np.array_equal(_mert.one_best(s.F, w0, A.offsets),
                          _mert.segment_argmax(s.F @ w0, A.offsets))


def test_line_search_finds_the_grid_optimum(regtest):
    s = LineSearcher(regtest.arrays())
    rng = np.random.default_rng(7)
    for trial in range(4):
        origin = rng.standard_normal(s.dim)
        if trial < 2:
            direction, coord = np.eye(s.dim)[trial * 7], trial * 7
        else:
            direction, coord = rng.standard_normal(s.dim), None
        x, best = s.line_search(origin, direction, coord=coord)
        # the chosen point really has that BLEU ...
        assert s.bleu(origin + x * direction) == pytest.approx(best, abs=1e-9)
        # ... and no point of a fine grid does better
        grid = np.linspace(x - 3.0, x + 3.0, 3001)
        assert brute_force(s, origin, direction, grid).max() <= best + 1e-9


def test_line_search_on_multi30k_coordinates(m30k):
    pool, w0 = m30k
    s = LineSearcher(pool.arrays())
    for d in (2, 7, 8):           # a reordering weight, LM0, WordPenalty0
        x, best = s.line_search(w0, np.eye(s.dim)[d], coord=d)
        assert s.bleu(w0 + x * np.eye(s.dim)[d]) == pytest.approx(best, abs=1e-9)
        grid = np.linspace(w0[d] - 1.5, w0[d] + 1.5, 601) - w0[d]
        assert brute_force(s, w0, np.eye(s.dim)[d], grid).max() <= best + 1e-9
        assert best >= s.bleu(w0) - 1e-9


# -- whole optimisers ---------------------------------------------------------------------------
def test_mert_raises_dev_bleu_checked_by_sacrebleu(m30k):
    pool, w0 = m30k
    before = sacrebleu_of(pool, w0)
    res = mert.optimise(pool.arrays(), [w0], MertOptions(restarts=4, seed=1))
    after = sacrebleu_of(pool, res.weights)
    assert res.initial_bleu == pytest.approx(before, abs=1e-6)
    assert res.bleu == pytest.approx(after, abs=1e-6)
    assert after > before + 1.0
    assert np.abs(res.weights).sum() == pytest.approx(1.0)
    # every start ends at least as good as it began
    searcher = LineSearcher(pool.arrays())
    for r in res.starts:
        assert r.bleu >= searcher.bleu(r.start) - 1e-9
    # reproducible, also with two worker processes
    again = mert.optimise(pool.arrays(), [w0], MertOptions(restarts=4, seed=1, jobs=2))
    assert np.array_equal(again.weights, res.weights)


def test_mira_raises_dev_bleu_checked_by_sacrebleu(m30k):
    pool, w0 = m30k
    before = sacrebleu_of(pool, w0)
    res = mira.optimise(pool.arrays(), w0, mira.MiraOptions(seed=3, epochs=30))
    after = sacrebleu_of(pool, res.weights)
    assert res.bleu == pytest.approx(after, abs=1e-6)
    assert after > before + 0.5
    assert res.bleu == pytest.approx(max(e["bleu"] for e in res.epochs), abs=1e-6)
    assert res.epochs[res.best_epoch - 1]["bleu"] == pytest.approx(res.bleu, abs=1e-6)
    same = mira.optimise(pool.arrays(), w0, mira.MiraOptions(seed=3, epochs=30))
    assert np.array_equal(same.weights, res.weights)


def kbmira_reference(F, stats, offsets, orders, w0, C=0.01, decay=0.999):
    """Straight transcription of Moses kbmira's loop (HopeFearDecoder + MiraWeightVector)."""
    w = w0.copy()
    totals, last = w0.copy(), np.zeros(len(w0))
    n = 0
    bg = np.ones(10)
    avgs = []
    for order in orders:
        for s in order:
            rows = range(offsets[s], offsets[s + 1])
            hope = fear = None
            for i in rows:
                score = float(F[i] @ w)
                b = float(background_bleu(stats[i][None], bg)[0])
                if hope is None or score + b > hs:
                    hs, hope = score + b, i
                if fear is None or score - b > fs:
                    fs, fear = score - b, i
            hb = float(background_bleu(stats[hope][None], bg)[0])
            fb = float(background_bleu(stats[fear][None], bg)[0])
            if hope != fear and hb > fb:
                diff = F[hope] - F[fear]
                loss = hb - fb - float(w @ diff)
                if loss > 0:
                    eta = min(C, loss / float(diff @ diff)) if diff @ diff > 0 else C
                    n += 1
                    for d in range(len(w)):          # MiraWeightVector::update, lazily
                        totals[d] += (n - last[d]) * w[d] + diff[d] * eta
                        w[d] += diff[d] * eta
                        last[d] = n
                bg = bg * decay + stats[hope]
        fixed = totals + (n - last) * w
        avgs.append(fixed / n if n else w.copy())
    return avgs


def test_mira_epoch_matches_a_transcription_of_kbmira(regtest):
    A = regtest.arrays()
    F, stats = A.features, A.stats.astype(np.int64)
    rng = np.random.default_rng(0)
    w0 = rng.uniform(-0.2, 0.2, F.shape[1])
    orders = [rng.permutation(A.num_sentences) for _ in range(3)]
    expected = kbmira_reference(F, stats, A.offsets, orders, w0)
    w, total, bg = w0.copy(), w0.copy(), np.ones(10)
    n = 0
    for order, exp in zip(orders, expected):
        n, _, _ = _mert.mira_epoch(F, A.stats, A.offsets, order.astype(np.int64), w, total, bg,
                                   0.01, 0.999, False, n)
        assert n > 0
        np.testing.assert_allclose(total / n, exp, rtol=1e-9, atol=1e-12)


def test_pro_raises_dev_bleu_checked_by_sacrebleu(m30k):
    pool, w0 = m30k
    before = sacrebleu_of(pool, w0)
    res = pro.optimise(pool.arrays(), w0, pro.ProOptions(seed=2))
    assert res.pairs > 100 * 50
    after = sacrebleu_of(pool, res.weights)
    assert res.bleu == pytest.approx(after, abs=1e-6)
    assert after > before + 0.2


def test_optimise_pool_dispatch_and_previous_best_start(m30k):
    pool, w0 = m30k
    first = optimise_pool(pool.arrays(), "mert", w0, settings=dict(restarts=0, seed=0))
    # the previous best as an extra starting point can only help
    second = optimise_pool(pool.arrays(), "mert", w0, [first.weights],
                           settings=dict(restarts=0, seed=0))
    assert second.bleu >= first.bleu - 1e-9
    with pytest.raises(ValueError):
        optimise_pool(pool.arrays(), "lbfgs", w0)
