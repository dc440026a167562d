"""Token-level mixtures of neural models (`perplexity -m A -m B`), exact renormalisation
(`--exact`), EM mixture weights: two small models really trained on Brown."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_TRAIN, BROWN_VALID, read_lines
from test_kenlm_baseline import _kenlm_ready
from nlmfeature.cli import main
from nlmfeature.io.textio import read_tokens
from nlmfeature.core.model import exactly_normalised
from nlmfeature.training.kenlm_baseline import (linear_logprob, mixture_logprob,
                                                nlm_log_distribution, nlm_ngrams, nlm_token_scores,
                                                tune_linear, tune_mixture)
from nlmfeature.training.trainer import TrainConfig, train


def _train(d, name, **kw):
    cfg = dict(train=BROWN_TRAIN, test_set=str(d / "valid.txt"), model_out=str(d / name), order=3,
               word_width=24, output="unnormalised", noise_samples=10, direct_order=0, iterations=2,
               minibatch_size=128, threads=1, progress=False, seed=1, patience=0, evals_per_epoch=1)
    cfg.update(kw)
    train(TrainConfig(**cfg), lambda msg: None)
    return str(d / name)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixture")
    lines = read_lines(BROWN_VALID)
    (d / "valid.txt").write_text("\n".join(lines[:150]) + "\n", encoding="utf-8")
    (d / "test.txt").write_text("\n".join(lines[150:]) + "\n", encoding="utf-8")
    return d, _train(d, "a.nlm", seed=1), _train(d, "b.nlm", seed=2)


def test_exact_renormalisation_is_a_distribution(trained):
    d, a, _ = trained
    model = nlmfeature.load(a)
    sents = read_tokens(str(d / "test.txt"))[:20]
    ctx, words = nlm_ngrams(model, sents)
    raw = nlm_log_distribution(model, ctx)                  # the NCE model's raw scores
    logz = np.logaddexp.reduce(raw, axis=1)
    assert np.abs(logz).max() > 0.01                        # raw scores are not normalised...
    exact = nlm_token_scores(model, sents, exact=True).logprob
    np.testing.assert_allclose(exact, raw[np.arange(len(words)), words] - logz, atol=1e-4)
    norm = exactly_normalised(model)
    assert norm.normalised and exactly_normalised(norm) is norm
    np.testing.assert_allclose(np.exp(nlm_log_distribution(norm, ctx[:5])).sum(axis=1), 1.0, atol=1e-5)


def test_exact_perplexity_reports_how_far_raw_scores_are_from_normalised(trained, capsys):
    d, a, _ = trained
    test = str(d / "test.txt")

    def rows(*flags):
        assert main(["perplexity", "-m", a, "--test", test, "--json", "--quiet", *flags]) == 0
        return json.loads(capsys.readouterr().out)["rows"]

    raw_row, = rows()
    exact_row, = rows("--exact")
    model = nlmfeature.load(a)
    sents = read_tokens(test)
    raw = nlm_token_scores(model, sents).logprob
    exact = nlm_token_scores(model, sents, exact=True).logprob
    z = raw - exact                                         # log Z of each token's context
    assert "log_z_mean" not in raw_row                      # raw scores alone: nothing to compare
    assert exact_row["raw_perplexity"] == pytest.approx(raw_row["perplexity"], rel=1e-9)
    assert exact_row["log_z_mean"] == pytest.approx(
        (raw_row["log_prob"] - exact_row["log_prob"]) / exact_row["tokens"], rel=1e-9)
    assert exact_row["log_z_sd"] == pytest.approx(float(z.std()), rel=1e-9) and z.std() > 0.01
    assert exact_row["log_z_max"] == pytest.approx(float(z.max()))
    assert exact_row["log_z_p95"] <= exact_row["log_z_max"]
    assert exact_row["log_z_over_1"] == pytest.approx(float((z > 1).mean()))
    # --exclude-oov measures the same statistics over the in-vocabulary tokens only
    ex_row, = rows("--exact", "--exclude-oov")
    keep = ~nlm_token_scores(model, sents).oov
    assert keep.sum() < len(z) and ex_row["log_z_sd"] == pytest.approx(float(z[keep].std()), rel=1e-9)
    assert main(["perplexity", "-m", a, "--test", test, "--exact", "--quiet"]) == 0
    assert "log Z per token (raw - exact): mean" in capsys.readouterr().out


def test_em_weights_are_the_likelihood_optimum(trained):
    d, a, b = trained
    valid = read_tokens(str(d / "valid.txt"))
    A = nlm_token_scores(nlmfeature.load(a), valid, exact=True).logprob
    B = nlm_token_scores(nlmfeature.load(b), valid, exact=True).logprob
    w = tune_mixture(np.stack([A, B]))
    assert w.sum() == pytest.approx(1.0) and w[0] == pytest.approx(tune_linear(A, B))
    # EM's weight is the grid optimum of the concave likelihood, to the grid's step
    grid = np.linspace(0.0, 1.0, 1001)
    ll = [linear_logprob(A, B, g).sum() for g in grid]
    assert abs(w[0] - grid[int(np.argmax(ll))]) <= 1e-3 + 1e-9
    best = mixture_logprob(np.stack([A, B]), w).sum()
    for other in (0.0, 1.0, w[0] - 0.05, w[0] + 0.05):
        assert best >= linear_logprob(A, B, other).sum() - 1e-6
    np.testing.assert_allclose(mixture_logprob(np.stack([A, B]), [1.0, 0.0]), A)
    # a third component (a uniform distribution) can only add likelihood at the optimum
    uni = np.full_like(A, -math.log(len(nlmfeature.load(a).vocab)))
    w3 = tune_mixture(np.stack([A, B, uni]))
    assert mixture_logprob(np.stack([A, B, uni]), w3).sum() >= best - 1e-6


@pytest.mark.skipif(bool(_kenlm_ready()), reason=f"KenLM not built: {_kenlm_ready()}")
def test_perplexity_reports_the_mixture(trained, capsys):
    d, a, b = trained
    assert main(["perplexity", "-m", a, "-m", b, "--exact", "--test", str(d / "test.txt"),
                 "--valid", str(d / "valid.txt"), "--kenlm-train", BROWN_TRAIN, "--kenlm",
                 str(d / "k.arpa"), "--kenlm-order", "3", "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    rows = {r["model"]: r for r in res["rows"]}
    assert list(rows) == ["neural", "neural2", "mixture", "kenlm", "linear"]
    assert len({r["tokens"] for r in rows.values()}) == 1
    test = read_tokens(str(d / "test.txt"))
    ref = nlm_token_scores(nlmfeature.load(a), test, exact=True).logprob
    assert rows["neural"]["perplexity"] == pytest.approx(math.exp(-ref.mean()), rel=1e-9)
    # two seeds of the same recipe, mixed with weights tuned on held-out text, beat each one
    # on other text; adding KenLM to the mixture beats both the mixture and KenLM
    assert rows["mixture"]["perplexity"] < min(rows["neural"]["perplexity"], rows["neural2"]["perplexity"])
    assert rows["linear"]["perplexity"] < min(rows["mixture"]["perplexity"], rows["kenlm"]["perplexity"])
    assert len(rows["mixture"]["weight"]) == 2 and len(rows["linear"]["weight"]) == 3
    assert sum(rows["linear"]["weight"]) == pytest.approx(1.0, abs=1e-3)


def test_mixture_errors_name_the_problem(trained, capsys):
    d, a, _ = trained
    other = _train(d, "mc3.nlm", min_count=3, iterations=1)
    rev = _train(d, "rev.nlm", reverse=True, iterations=1)
    base = ["perplexity", "-m", a, "--test", str(d / "test.txt"), "--valid", str(d / "valid.txt"), "-q"]
    for extra, msg in ((["-m", other], "mc3.nlm: its vocabulary differs"),
                       (["-m", rev], "rev.nlm: a right-to-left model"),
                       (["-m", a, "--weight", "0.5"], "--weight is for one --model")):
        assert main(base + extra) != 0
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err
