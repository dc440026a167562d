"""The fused native training steps (diagonal LBL + NCE): one minibatch of each step (noise
per word with direct features; noise shared by the minibatch) against a float64 reference, results that do not depend on the thread count, and a
shared-noise run on real text that learns a good, nearly self-normalised model."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from helpers import BROWN_TRAIN, BROWN_VALID, run_cli
from nlmfeature import NLMFeatureError, _train
from nlmfeature.training.trainer import TrainConfig, Trainer, heldout_logprob


def _params(rng, V, VR, E, c):
    f = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)
    return dict(R=f(VR, E), W=f(c, E), bias=f(E), Q=f(V, E), qb=f(V))


def _reference_shared(p, acc, ctx, target, noise, logq, lr, l2, eps):
    """float64 numpy: gradients of the shared-noise NCE loss, then AdaGrad on touched rows."""
    P = {k: v.astype(np.float64) for k, v in p.items()}
    S = len(noise)
    H = P["bias"] + (P["W"][None, :, :] * P["R"][ctx]).sum(axis=1)            # (N, E)
    x_t = (P["Q"][target] * H).sum(1) + P["qb"][target] - logq[target] - math.log(S)
    x_n = H @ P["Q"][noise].T + P["qb"][noise] - logq[noise] - math.log(S)    # (N, S)
    sig = lambda z: 1 / (1 + np.exp(-z))
    loss = np.logaddexp(0, -x_t).sum() + np.logaddexp(0, x_n).sum()
    g_t, g_n = sig(x_t) - 1, sig(x_n)
    gQ, gqb = np.zeros_like(P["Q"]), np.zeros_like(P["qb"])
    np.add.at(gQ, target, g_t[:, None] * H)
    np.add.at(gqb, target, g_t)
    np.add.at(gQ, noise, g_n.T @ H)
    np.add.at(gqb, noise, g_n.sum(0))
    dH = g_t[:, None] * P["Q"][target] + g_n @ P["Q"][noise]
    gR = np.zeros_like(P["R"])
    for j in range(ctx.shape[1]):
        np.add.at(gR, ctx[:, j], dH * P["W"][j])
    gW = np.stack([(dH * P["R"][ctx[:, j]]).sum(0) for j in range(ctx.shape[1])])
    gbias = dH.sum(0)
    touched = np.unique(np.concatenate([target, noise]))
    return loss, _adagrad(P, acc, (("Q", gQ, l2, touched), ("qb", gqb, 0.0, touched), ("R", gR, l2, np.unique(ctx)),
                                   ("W", gW, l2, None), ("bias", gbias, 0.0, None)), lr, eps)


def _adagrad(P, acc, steps, lr, eps):
    """float64 AdaGrad on the rows ``rows`` (None: all) of each (name, gradient, L2, rows); a
    matrix whose sums have one column takes row-wise AdaGrad (the row's mean squared gradient)."""
    out = {}
    for name, g, decay, rows in steps:
        new, a = P[name].copy(), acc[name].astype(np.float64).copy()
        sel = slice(None) if rows is None else rows
        gd = g[sel] + decay * new[sel]
        rowwise = gd.ndim == 2 and a.shape[1] == 1 and gd.shape[1] > 1
        a[sel] += (gd * gd).mean(axis=1, keepdims=True) if rowwise else gd * gd
        new[sel] -= lr * gd / (np.sqrt(a[sel]) + eps)
        out[name] = new
    return out


def test_shared_noise_step_matches_a_float64_reference():
    rng = np.random.default_rng(5)
    V, VR, E, c, N, S = 300, 300, 40, 3, 97, 23     # widths that are not multiples of the blocks
    p = _params(rng, V, VR, E, c)
    acc = {k: (rng.random(v.shape) * 0.5).astype(np.float32) for k, v in p.items()}
    ctx = rng.integers(0, VR, (N, c)).astype(np.int32)
    target = rng.integers(0, V, N).astype(np.int32)
    noise = rng.integers(0, V, S).astype(np.int32)
    noise[:3] = target[:3]                          # a noise word that is also a data word
    noise[5] = noise[4]                             # drawn twice
    logq = np.log(rng.dirichlet(np.ones(V)))
    lr, l2, eps = 0.05, 1e-3, 1e-8
    want_loss, want = _reference_shared(p, acc, ctx, target, noise, logq, lr, l2, eps)
    got = {k: v.copy() for k, v in p.items()}
    a = {k: v.copy() for k, v in acc.items()}
    loss = _train.nce_lbl_shared_step(got["R"], got["W"], got["bias"], got["Q"], got["qb"],
                                      a["R"], a["W"], a["bias"], a["Q"], a["qb"],
                                      ctx, target, noise, logq, lr, l2, eps, 1)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-4, atol=2e-5, err_msg=k)


def _reference_per_word(p, acc, ctx, cand, logq, buckets, allowed, lr, l2, eps):
    """float64 numpy: gradients of the per-word NCE loss (candidate 0 the data word, the
    others noise) with direct features in the hashed buckets, then AdaGrad on touched rows."""
    P = {k: v.astype(np.float64) for k, v in p.items()}
    N, K = cand.shape
    H = P["bias"] + (P["W"][None, :, :] * P["R"][ctx]).sum(axis=1)                   # (N, E)
    x = ((P["Q"][cand] * H[:, None, :]).sum(2) + P["qb"][cand] + (P["D"][buckets] * allowed[buckets]).sum(2)
         - logq[cand] - math.log(K - 1))                                              # (N, K)
    sig = lambda z: 1 / (1 + np.exp(-z))
    loss = np.logaddexp(0, -x[:, 0]).sum() + np.logaddexp(0, x[:, 1:]).sum()
    g = sig(x)
    g[:, 0] -= 1
    gQ, gqb, gD = np.zeros_like(P["Q"]), np.zeros_like(P["qb"]), np.zeros_like(P["D"])
    np.add.at(gQ, cand.ravel(), (g[:, :, None] * H[:, None, :]).reshape(-1, H.shape[1]))
    np.add.at(gqb, cand.ravel(), g.ravel())
    keep = allowed[buckets]
    np.add.at(gD, buckets[keep], np.broadcast_to(g[:, :, None], buckets.shape)[keep])
    dH = (g[:, :, None] * P["Q"][cand]).sum(1)
    gR = np.zeros_like(P["R"])
    for j in range(ctx.shape[1]):
        np.add.at(gR, ctx[:, j], dH * P["W"][j])
    gW = np.stack([(dH * P["R"][ctx[:, j]]).sum(0) for j in range(ctx.shape[1])])
    return loss, _adagrad(P, acc, (("Q", gQ, l2, np.unique(cand)), ("qb", gqb, 0.0, np.unique(cand)),
                                   ("D", gD, 0.0, np.unique(buckets[keep])), ("R", gR, l2, np.unique(ctx)),
                                   ("W", gW, l2, None), ("bias", dH.sum(0), 0.0, None)), lr, eps)


@pytest.mark.parametrize("threads,rowwise", [(1, False), (2, False), (3, False), (1, True), (2, True)])
def test_per_word_noise_step_with_direct_features_matches_a_float64_reference(threads, rowwise):
    """The default recipe's step: more examples than one block of the W gradient, noise words
    drawn twice and equal to data words, buckets the allowed mask keeps out of training (and
    out of the scores: their weights here are not zero, so reading them would show); with
    ``rowwise``, one AdaGrad sum per embedding and output row (--row-adagrad)."""
    rng = np.random.default_rng(11)
    V, VR, E, c, N, k, DO, HS = 40, 45, 24, 4, 101, 5, 3, 211
    p = _params(rng, V, VR, E, c)
    p["D"] = (rng.standard_normal(HS) * 0.1).astype(np.float32)
    acc = {n: np.full(v.shape[:1] + (1,) if rowwise and n in ("R", "Q") else v.shape, 0.1, dtype=np.float32)
           for n, v in p.items()}
    ctx = rng.integers(0, VR, (N, c)).astype(np.int32)
    target = rng.integers(0, V, N).astype(np.int32)
    noise = rng.integers(0, V, (N, k)).astype(np.int32)
    noise[:4, 0] = target[:4]
    noise[7, 1] = noise[7, 2]
    cand = np.concatenate([target[:, None], noise], axis=1)
    buckets = np.stack([(_train.direct_keys(ctx, np.ascontiguousarray(cand[:, j]), 0, DO) % np.uint64(HS))
                        .astype(np.int64) for j in range(k + 1)], axis=1)                 # (N, K, DO)
    allowed = (rng.random(HS) < 0.8).astype(np.uint8)
    logq = np.log(rng.dirichlet(np.ones(V)))
    lr, l2, eps = 0.05, 1e-3, 1e-8
    want_loss, want = _reference_per_word(p, acc, ctx, cand, logq, buckets, allowed.astype(bool), lr, l2, eps)
    got = {n: v.copy() for n, v in p.items()}
    a = {n: v.copy() for n, v in acc.items()}
    loss = _train.nce_lbl_step(got["R"], got["W"], got["bias"], got["Q"], got["qb"], got["D"],
                               a["R"], a["W"], a["bias"], a["Q"], a["qb"], a["D"],
                               ctx, target, noise, logq, DO, HS, np.packbits(allowed, bitorder="little"),
                               lr, l2, eps, threads)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for n in want:
        np.testing.assert_allclose(got[n], want[n], rtol=2e-4, atol=2e-5, err_msg=n)
    untouched = np.setdiff1d(np.arange(HS), buckets[allowed[buckets].astype(bool)])
    np.testing.assert_array_equal(got["D"][untouched], p["D"][untouched])


def _run(tmp_path, name, threads, **kw):
    base = dict(train=BROWN_TRAIN, test_set=BROWN_VALID, model_out=str(tmp_path / name), order=5,
                word_width=32, output="unnormalised", iterations=1, minibatch_size=200, threads=threads,
                progress=False, seed=4, max_updates=60, evals_per_epoch=1, patience=0)
    base.update(kw)
    tr = Trainer(TrainConfig(**base), lambda m: None)
    assert tr._fused
    tr.run()
    return tr


@pytest.mark.parametrize("kw", [dict(noise_samples=10, direct_order=3),
                                dict(shared_noise=True, noise_samples=64, direct_order=0),
                                dict(noise_samples=10, direct_order=3, row_adagrad=True)],
                         ids=["per-word-noise+direct", "shared-noise", "row-adagrad"])
def test_fused_steps_do_not_depend_on_the_thread_count(tmp_path, kw):
    one = _run(tmp_path, "one.nlm", 1, **kw)
    two = _run(tmp_path, "two.nlm", 2, hogwild=False, **kw)
    assert two.kernel_threads == 2 and two.hogwild_threads == 1
    for k in one.params:
        np.testing.assert_array_equal(one.params[k], two.params[k], err_msg=k)


@pytest.mark.parametrize("kw", [dict(noise_samples=10, direct_order=3), dict(noise_samples=10, direct_order=0)],
                         ids=["direct", "no-direct"])
def test_hogwild_threads_train_as_well_and_count_every_minibatch_once(tmp_path, kw):
    """--threads 2 (Hogwild, the default): two minibatches at a time, one per thread; every
    minibatch counted once, evaluations where the synchronous run has them, and the model as good as the synchronous run's."""
    kw = dict(kw, max_updates=0, iterations=2, evals_per_epoch=2, patience=0)
    sync = _run(tmp_path, "sync.nlm", 2, hogwild=False, **kw)
    hog = _run(tmp_path, "hog.nlm", 2, **kw)
    assert hog.hogwild_threads == 2 and sync.hogwild_threads == 1
    assert hog.step == sync.step == 2 * sync.batches_per_epoch and hog.trained_words == sync.trained_words
    assert [h["epoch"] for h in hog.history] == [h["epoch"] for h in sync.history]
    assert any(not np.array_equal(hog.params[k], sync.params[k]) for k in hog.params)   # another run
    print(f"held-out perplexity: synchronous {sync.best:.2f}, Hogwild {hog.best:.2f}")
    assert hog.best < 1.03 * sync.best
    shared = Trainer(TrainConfig(train=BROWN_TRAIN, model_out=str(tmp_path / "s.nlm"), threads=2, shared_noise=True,
                                 direct_order=0, progress=False), lambda m: None)
    assert shared.hogwild_threads == 1          # shared noise: the threads share each minibatch


def test_hogwild_round_of_one_minibatch_is_the_fused_step():
    """nce_lbl_rounds with one minibatch, drawing its own noise, is nce_lbl_step on the noise
    UnigramNoise.draw gives that minibatch, bit for bit; bad arguments are refused."""
    from nlmfeature.training.sampling import UnigramNoise

    rng = np.random.default_rng(5)
    V, E, c, N, k, HS, DO, seed, step = 50, 8, 3, 40, 4, 256, 2, 7, 11

    def params():
        r = np.random.default_rng(1)
        P = dict(R=r.normal(0, .1, (V, E)), W=r.normal(1, .1, (c, E)), bias=np.zeros(E), Q=r.normal(0, .1, (V, E)),
                 qb=np.zeros(V), D=np.zeros(HS))
        P = {n: a.astype(np.float32) for n, a in P.items()}
        A = {n: np.full_like(a, 0.1) for n, a in P.items()}
        return P, A
    ctx = rng.integers(0, V, (N, c)).astype(np.int32)
    tg = rng.integers(0, V, N).astype(np.int32)
    sampler = UnigramNoise(rng.integers(1, 100, V).astype(np.float64), k)
    noise = sampler.draw(tg, seed, step).words
    logq = sampler.logq
    allowed = np.packbits(np.arange(HS) % 3 != 0, bitorder="little")   # a bit per bucket
    order = ["R", "W", "bias", "Q", "qb", "D"]
    P1, A1 = params()
    l1 = _train.nce_lbl_step(*[P1[n] for n in order], *[A1[n] for n in order], ctx, tg, noise, logq, DO, HS, allowed, 0.05, 1e-4, 1e-8, 1)
    P2, A2 = params()
    l2 = _train.nce_lbl_rounds(*[P2[n] for n in order], *[A2[n] for n in order], ctx, tg,
                               np.array([0, N], np.int64), *sampler.kernel_args(seed, [step]), logq, DO, HS,
                               allowed, 0.05, 1e-4, 1e-8)
    assert l2.tolist() == [l1]
    for n in order:
        np.testing.assert_array_equal(P1[n], P2[n], err_msg=n)
        np.testing.assert_array_equal(A1[n], A2[n], err_msg=n)
    args = [*[P2[n] for n in order], *[A2[n] for n in order]]
    accept, alias, values, kk, s64, steps = sampler.kernel_args(seed, [step, step + 1])
    for bounds, table, msg in (([0, 10], values, "do not cover"), ([0, 30, 20, N], values, "decrease"),
                               ([0, 10, 20, N], values, "fewer noise steps"), ([0, N], values + V, "noise word out of range")):
        with pytest.raises(ValueError, match=msg):
            _train.nce_lbl_rounds(*args, ctx, tg, np.array(bounds, np.int64), accept, alias, table, kk,
                                  s64, steps, logq, DO, HS, allowed, 0.05, 1e-4, 1e-8)
    # an alias table pointing outside itself: the draws that take an alias are refused, not read
    with pytest.raises(ValueError, match="noise word out of range"):
        _train.nce_lbl_rounds(*args, ctx, tg, np.array([0, N], np.int64), accept, alias + len(alias),
                              values, kk, s64, steps, logq, DO, HS, allowed, 0.05, 1e-4, 1e-8)


def test_hogwild_rounds_stop_at_the_update_limit_and_resume(tmp_path):
    part = _run(tmp_path, "h.nlm", 2, max_updates=25)     # rounds of 2, the last of 1
    assert part.step == 25
    rest = _run(tmp_path, "h.nlm", 2, max_updates=10)
    assert rest.resumed_from and rest.step == 35


def test_dense_models_give_the_threads_to_blas(tmp_path):
    """Sparse models (the fused step, the class-factored output) run the native kernels on
    --threads threads; models of dense products (hidden layers) give them to BLAS, and the
    package's short spin before idle threads sleep is in the environment libgomp read."""
    import os

    assert os.environ["OMP_WAIT_POLICY"].lower() == "passive" and int(os.environ["GOMP_SPINCOUNT"]) > 0
    base = dict(train=BROWN_TRAIN, model_out=str(tmp_path / "m.nlm"), order=4, word_width=16, threads=2,
                progress=False, iterations=1)
    assert Trainer(TrainConfig(**base, output="class", classes=20), lambda m: None).kernel_threads == 2
    nplm = Trainer(TrainConfig(**base, arch="nplm", hidden=32, hidden_layers=[16]), lambda m: None)
    assert nplm.kernel_threads == 1 and not nplm._fused


def test_shared_noise_learns_a_nearly_self_normalised_model(tmp_path):
    tr = _run(tmp_path, "s.nlm", 1, shared_noise=True, direct_order=0, max_updates=0, iterations=2)
    assert tr.cfg.noise_samples == 200                   # the shared default
    h, a = tr.model_arrays()
    raw = heldout_logprob(h, a, tr.heldout)
    exact = heldout_logprob(h, a, tr.heldout, exact=True)
    unigram = tr.counts / tr.counts.sum()
    ppl, ppl_unigram = math.exp(-exact.mean()), math.exp(-np.log(unigram[tr.heldout.words]).mean())
    logz = raw - exact
    print(f"shared-noise NCE: perplexity {ppl:.1f} (unigram {ppl_unigram:.1f}); log Z mean "
          f"{logz.mean():.3f} sd {logz.std():.3f}")
    assert ppl < 0.6 * ppl_unigram
    assert abs(logz.mean()) < 0.3 and logz.std() < 0.6


def test_shared_noise_is_refused_where_it_does_not_apply(tmp_path):
    with pytest.raises(NLMFeatureError, match="--direct-order 0"):
        _run(tmp_path, "x.nlm", 1, shared_noise=True, direct_order=3)
    for flags in (["--shared-noise"], ["--row-adagrad", "--arch", "nplm", "--hidden", "16"]):
        p = run_cli("train", "-i", BROWN_TRAIN, "-o", tmp_path / "z.nlm", "--word-width", "8", "-q", *flags)
        assert p.returncode == 2 and "error:" in p.stderr and "Traceback" not in p.stderr, p.stderr
    with pytest.raises(ValueError, match="--noise-samples K > 0"):
        TrainConfig(train=BROWN_TRAIN, model_out=str(tmp_path / "y.nlm"), shared_noise=True,
                    noise_samples=0, output="softmax").estimator()


def test_row_adagrad_keeps_a_sum_per_row_resumes_exactly_and_needs_the_fused_step(tmp_path):
    """--row-adagrad: (rows, 1) sums for the embeddings and output rows, a run resumed from its
    checkpoint ends with the uninterrupted run's model, and other models are refused."""
    from nlmfeature.training.trainer import checkpoint_path

    full = _run(tmp_path, "full.nlm", 1, row_adagrad=True)
    assert full.opt.state["embeddings"].shape == (full.params["embeddings"].shape[0], 1)
    assert full.opt.state["output.weight"].shape == (full.params["output.weight"].shape[0], 1)
    assert full.opt.state["branch0.weights"].shape == full.params["branch0.weights"].shape
    part = _run(tmp_path, "part.nlm", 1, row_adagrad=True, max_updates=25)
    assert os.path.exists(checkpoint_path(str(tmp_path / "part.nlm")))
    rest = _run(tmp_path, "part.nlm", 1, row_adagrad=True, max_updates=35)
    assert rest.resumed_from and rest.step == full.step
    for k in full.params:
        np.testing.assert_array_equal(full.params[k], rest.params[k], err_msg=k)
        np.testing.assert_array_equal(full.opt.state[k], rest.opt.state[k], err_msg=k)
    with pytest.raises(NLMFeatureError, match="--row-adagrad applies to the fused step"):
        Trainer(TrainConfig(train=BROWN_TRAIN, model_out=str(tmp_path / "n.nlm"), arch="nplm", hidden=16,
                            word_width=8, order=3, row_adagrad=True, progress=False), lambda m: None)
