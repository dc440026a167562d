"""Finite-difference gradient checks of every architecture x output layer x estimator.

Tiny float64 models (V = 30 Brown words, E = 4, order 3); central differences on a sample of
coordinates of every learned array; relative error < 1e-4.  NCE uses fixed noise samples
so that the objective is deterministic.
"""
from __future__ import annotations

import numpy as np
import pytest

from helpers import brown_vocab
from nlmfeature.core.architecture import ModelSpec, random_model
from nlmfeature.training.estimators import OutputSpec
from nlmfeature.training.objective import Objective, trainable_names
from nlmfeature.training.optim import Gradients
from nlmfeature.training.sampling import ClassNoise, UnigramNoise
from nlmfeature.core.vocab import Vocabulary

ARCHS = {
    "lbl-full": dict(arch="lbl", word_width=4),
    "lbl-diagonal": dict(arch="lbl", word_width=4, diagonal_contexts=True),
    "nplm-2layers": dict(arch="nplm", word_width=4, hidden=6, hidden_layers=[5], activation="tanh"),
    "nplm-relu": dict(arch="nplm", word_width=4, hidden=6, hidden_layers=[5], activation="relu"),
    "lateral-max": dict(arch="lateral", word_width=4, hidden=6, branches=3, combine="max", activation="tanh"),
    "lateral-add": dict(arch="lateral", word_width=4, hidden=6, branches=2, combine="add", activation="sigmoid"),
    "lateral-mul": dict(arch="lateral", word_width=4, hidden=6, branches=3, combine="mul", activation="tanh"),
}
OUTPUTS = {  # name -> (output layer, estimator, noise samples, alpha)
    "unnormalised-nce": ("unnormalised", "nce", 3, 0.0),
    "softmax-ml": ("softmax", "softmax", 0, 0.0),
    "class-ml": ("class", "class-ml", 0, 0.0),
    "class-nce": ("class", "class-nce", 3, 0.0),
    "tree-ml": ("tree", "tree-ml", 0, 0.0),
    "self-normalised": ("unnormalised", "softmax", 0, 0.5),
}


def tiny_vocab():
    vocab, counts = brown_vocab(min_count=2, lines=2000)
    words = vocab.words[:30]
    return Vocabulary(words), counts[:30]


def build(arch: str, out: str, direct: int = 0, seed: int = 1):
    vocab, counts = tiny_vocab()
    output, est, k, alpha = OUTPUTS[out]
    fields = dict(ARCHS[arch], order=3, output=output, classes=5 if output == "class" else 0)
    if direct:
        fields.update(direct_order=direct, hash_space=97)
    spec = ModelSpec(**fields)
    header, arrays = random_model(spec, vocab, counts, seed=seed, scale=0.5)
    params = {n: (a.astype(np.float64) if a.dtype.kind == "f" else a) for n, a in arrays.items()}
    rng = np.random.default_rng(seed)
    for n in trainable_names(header, params):  # non-trivial biases too
        params[n] = params[n] + rng.normal(0, 0.3, params[n].shape)
    N = 7
    ctx = rng.integers(0, len(vocab), size=(N, 2)).astype(np.int32)
    targets = rng.integers(4, len(vocab), size=N).astype(np.int32)
    targets[0] = vocab.eos
    noise, ospec = None, OutputSpec(estimator=est, k=k, alpha=alpha)
    if est == "nce":
        un = UnigramNoise(counts + 1, k)
        noise = un.draw(targets, seed=5, step=0)
        ospec.logq = un.logq
    elif est == "class-nce":
        cn = ClassNoise(counts + 1, params["class.of_word"], params["class.start"], params["class.members"], k)
        noise = cn.draw(targets, seed=5, step=0)
        ospec.logq, ospec.logq_class = cn.logq_word, cn.logq_class
    if direct:
        ospec.direct_order, ospec.hash_space = direct, 97
    return header, params, ospec, ctx, targets, noise


def check(header, params, ospec, ctx, targets, noise, per_array: int = 12, eps: float = 1e-6, mask=None):
    obj = Objective(header, params, ospec)
    names = trainable_names(header, params)
    grads = Gradients(params, names)
    obj.loss_and_grads(ctx, targets, noise, grads, mask)
    analytic = grads.to_dense()
    rng = np.random.default_rng(0)
    checked = 0
    for name in names:
        p = params[name]
        flat = p.reshape(-1)
        g = analytic[name].reshape(-1)
        nz = np.flatnonzero(g)
        # mostly coordinates with a gradient, plus a few that should be exactly zero
        pick = np.concatenate([rng.choice(nz, min(per_array, len(nz)), replace=False) if len(nz) else [],
                               rng.choice(flat.size, min(3, flat.size), replace=False)]).astype(int)
        for i in pick:
            old = flat[i]
            flat[i] = old + eps
            lp = obj.loss(ctx, targets, noise, mask)
            flat[i] = old - eps
            lm = obj.loss(ctx, targets, noise, mask)
            flat[i] = old
            num = (lp - lm) / (2 * eps)
            err = abs(num - g[i]) / max(abs(num), abs(g[i]), 1e-3)
            assert err < 1e-4, f"{name}[{i}]: analytic {g[i]:.8g} numeric {num:.8g} (rel err {err:.2g})"
            checked += 1
    assert checked > 20
    return checked


@pytest.mark.parametrize("out", list(OUTPUTS))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_gradient(arch, out):
    check(*build(arch, out))


@pytest.mark.parametrize("out", ["unnormalised-nce", "softmax-ml", "class-ml", "class-nce", "self-normalised"])
@pytest.mark.parametrize("arch", ["lbl-diagonal", "nplm-2layers"])
def test_gradient_direct_features(arch, out):
    header, params, ospec, ctx, targets, noise = build(arch, out, direct=3)
    assert "direct.weights" in params
    check(header, params, ospec, ctx, targets, noise)


@pytest.mark.parametrize("out", ["unnormalised-nce", "class-ml"])
def test_gradient_with_dropout_mask(out):
    from nlmfeature.training.objective import dropout_mask

    header, params, ospec, ctx, targets, noise = build("nplm-2layers", out)
    mask = dropout_mask((len(ctx), header["output"]["dim"]), 0.4, seed=1, step=0, dtype=np.float64)
    assert 0 < np.count_nonzero(mask) < mask.size
    check(header, params, ospec, ctx, targets, noise, mask=mask)


def test_direct_indices_match_scorer():
    """The trainer's hashing of direct features is the scorer's."""
    from nlmfeature import _train
    from nlmfeature._scorer import direct_feature_indices

    rng = np.random.default_rng(3)
    ctx = rng.integers(0, 500, size=(50, 4)).astype(np.int32)
    targets = rng.integers(0, 500, size=50).astype(np.int32)
    for kind in (0, 1):
        idx = direct_feature_indices(ctx, targets, kind, 3, 1009)
        w = rng.normal(size=1009)
        out = np.zeros((50, 1))
        _train.direct_add(w, ctx, targets[:, None].copy(), kind, 3, 1009, out)
        np.testing.assert_allclose(out[:, 0], w[idx].sum(axis=1))
        keys = _train.direct_keys(ctx, targets, kind, 3)
        np.testing.assert_array_equal(keys % np.uint64(1009), idx)
