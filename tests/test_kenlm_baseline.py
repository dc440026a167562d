"""KenLM baseline: lmplz training, same-convention scoring, interpolation, `perplexity`."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_TRAIN, BROWN_VALID, make_model, read_lines
from nlmfeature.cli import main
from nlmfeature.errors import NLMFeatureError
from nlmfeature.training.kenlm_baseline import (LN10, UNK_TOKEN, ArpaDistribution, KenLMScorer, LogLinear,
                                       find_tool, interpolate, linear_logprob, map_oov,
                                       nlm_log_distribution, nlm_ngrams, nlm_token_scores,
                                       perplexity, train_kenlm)
from nlmfeature.io.textio import read_tokens as read_sentences


def _kenlm_ready() -> str:
    try:
        find_tool("lmplz")
        find_tool("query")
        import kenlm  # noqa: F401
    except (NLMFeatureError, ImportError) as exc:
        return str(exc)
    return ""


pytestmark = pytest.mark.skipif(bool(_kenlm_ready()),
                                reason=f"KenLM not built (tools/build_kenlm.sh): {_kenlm_ready()}")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("kenlm")
    model = nlmfeature.load(make_model(str(d), output="softmax", order=4))
    arpa = train_kenlm(BROWN_TRAIN, str(d / "brown.arpa"), 5, vocab=model.vocab)
    return d, model, arpa


def test_lmplz_model_uses_the_neural_vocabulary(setup):
    d, model, arpa = setup
    text = open(arpa, encoding="utf-8").read()
    assert "ngram 5=" in text and f"\t{UNK_TOKEN}\t" in text
    unigrams = text[text.index("\\1-grams:"):text.index("\\2-grams:")].splitlines()[1:]
    words = {l.split("\t")[1] for l in unigrams if l.strip()}
    assert words == (set(model.vocab) - {"<unk>", "<null>"}) | {UNK_TOKEN, "<unk>"}


def test_kenlm_scores_agree_with_query_binary(setup):
    d, model, arpa = setup
    scorer = KenLMScorer(arpa, model.vocab)
    sents = read_sentences(BROWN_VALID)
    scores, kenlm_oov = scorer.token_scores(sents)
    assert kenlm_oov == 0                           # every OOV went to the trained unknown token
    assert len(scores.logprob) == sum(len(s) + 1 for s in sents)
    assert scores.oov.sum() == sum(t not in model.vocab for s in sents for t in s) > 100
    # KenLM's own `query` on the same mapped text reports the same perplexity
    mapped = "\n".join(" ".join(map_oov(s, model.vocab)) for s in sents) + "\n"
    out = subprocess.run([find_tool("query"), "-v", "summary", arpa], input=mapped, text=True,
                         capture_output=True, check=True).stdout
    ppl = float(re.search(r"Perplexity including OOVs:\s*([0-9.]+)", out).group(1))
    assert perplexity(scores.logprob) == pytest.approx(ppl, rel=1e-4)


def test_neural_token_scores_match_model_perplexity(setup):
    d, model, arpa = setup
    sents = read_sentences(BROWN_VALID)
    scores = nlm_token_scores(model, sents)
    for exclude in (False, True):
        ref = model.perplexity([" ".join(s) for s in sents], exclude_oov=exclude)
        total, n = scores.total(exclude)
        assert n == ref.tokens and total == pytest.approx(ref.log_prob, rel=1e-9)
    assert scores.oov.sum() == ref.oovs


@pytest.mark.parametrize("output", ["softmax", "class", "tree", "unnormalised"])
def test_whole_vocabulary_distribution(tmp_path, output):
    extra = {"classes": 25} if output == "class" else {}
    model = nlmfeature.load(make_model(str(tmp_path), output=output, order=3, **extra))
    ctx, words = nlm_ngrams(model, read_sentences(BROWN_VALID)[:15])
    dist = nlm_log_distribution(model, ctx)
    assert dist.shape == (len(words), len(model.vocab))
    np.testing.assert_allclose(dist[np.arange(len(words)), words], model.score_batch(ctx, words),
                               atol=2e-5)
    if output != "unnormalised":
        np.testing.assert_allclose(np.exp(dist).sum(axis=1), 1.0, atol=1e-5)


def test_arpa_distribution_reproduces_kenlm(setup):
    d, model, arpa = setup
    scorer = KenLMScorer(arpa, model.vocab)
    sents = read_sentences(BROWN_VALID)[:120]
    hist = scorer.histories(sents)
    scores, _ = scorer.token_scores(sents)
    dist = ArpaDistribution(arpa, model.vocab, hist, scorer.unk_token)
    rows = dist.log10_rows(hist).astype(np.float64) * LN10
    targets = np.concatenate([model.ids(s + ["</s>"]) for s in sents])
    np.testing.assert_allclose(rows[np.arange(len(targets)), targets], scores.logprob, atol=1e-5)
    pred = np.ones(len(model.vocab), dtype=bool)
    pred[[model.vocab.bos, model.vocab.null]] = False
    mass = np.exp(rows[:, pred]).sum(axis=1)
    assert np.all(mass > 0.999) and np.all(mass <= 1.0 + 1e-5)   # all but KenLM's own <unk>


def test_linear_interpolation_tuning(setup):
    d, model, arpa = setup
    sents = read_sentences(BROWN_VALID)
    nlm = nlm_token_scores(model, sents).logprob
    kn = KenLMScorer(arpa, model.vocab).token_scores(sents)[0].logprob
    # two complementary "models": KenLM on alternate tokens, uniform on the others
    uni = np.full(len(kn), -np.log(len(model.vocab)))
    even = np.arange(len(kn)) % 2 == 0
    a, b = np.where(even, kn, uni), np.where(even, uni, kn)
    lp, w = interpolate(a, b)
    assert abs(w - 0.5) < 0.05
    for other in (0.0, 1.0, w - 0.05, w + 0.05):
        assert lp.sum() >= linear_logprob(a, b, other).sum() - 1e-9
    # the weight tuned on validation scores is applied to the test scores
    lp_test, w2 = interpolate(nlm[:100], kn[:100], valid_nlm=a, valid_kenlm=b)
    assert w2 == w
    np.testing.assert_allclose(lp_test, linear_logprob(nlm[:100], kn[:100], w))
    np.testing.assert_allclose(linear_logprob(nlm, kn, 1.0), nlm)
    np.testing.assert_allclose(linear_logprob(nlm, kn, 0.0), kn)


def test_loglinear_is_normalised_exactly(setup):
    d, model, arpa = setup
    scorer = KenLMScorer(arpa, model.vocab)
    sents = read_sentences(BROWN_VALID)[:60]
    ll = LogLinear(model, arpa, scorer, [sents])
    ctx, words = nlm_ngrams(model, sents)
    hist = scorer.histories(sents)
    nlm = nlm_token_scores(model, sents).logprob
    kn = scorer.token_scores(sents)[0].logprob
    w = 0.3
    lp = ll.logprob(ctx, hist, nlm, kn, w)
    # brute force for some tokens: the renormalised product summed over the vocabulary is 1
    pred = ll.predictable
    A = nlm_log_distribution(model, ctx[:20])
    B = ll.dist.log10_rows(hist[:20]).astype(np.float64) * LN10
    X = w * A + (1 - w) * B
    logz = np.log(np.exp(X[:, pred]).sum(axis=1))
    np.testing.assert_allclose(lp[:20], X[np.arange(20), words[:20]] - logz, atol=1e-4)
    # weight 0 is KenLM renormalised over the vocabulary (it lacks only KenLM's <unk> mass)
    lp0 = ll.logprob(ctx, hist, nlm, kn, 0.0)
    assert np.all(lp0 >= kn - 1e-5) and np.all(lp0 - kn < 1e-3)
    # weight 1 is the neural model renormalised without <s> and <null>
    lp1 = ll.logprob(ctx, hist, nlm, kn, 1.0)
    dist = np.exp(nlm_log_distribution(model, ctx))
    rest = 1.0 - dist[:, [model.vocab.bos, model.vocab.null]].sum(axis=1)
    np.testing.assert_allclose(lp1, nlm - np.log(rest), atol=1e-4)


def test_perplexity_command(setup, capsys):
    d, model, arpa = setup
    assert main(["perplexity", "--model", model.path, "--test", BROWN_VALID, "--kenlm", arpa,
                 "--valid", BROWN_VALID, "--tune-tokens", "600", "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    rows = {r["model"]: r for r in res["rows"]}
    assert set(rows) == {"neural", "kenlm", "linear", "log-linear"}
    ref = model.perplexity(read_lines(BROWN_VALID))
    assert rows["neural"]["perplexity"] == pytest.approx(ref.perplexity, rel=1e-9)
    assert {r["tokens"] for r in rows.values()} == {ref.tokens}
    assert {r["oovs"] for r in rows.values()} == {ref.oovs}
    # a random neural model is useless: interpolation leans on KenLM and cannot lose to it much
    assert rows["linear"]["weight"] < 0.2
    assert rows["linear"]["perplexity"] <= rows["kenlm"]["perplexity"] * 1.01
    assert rows["log-linear"]["perplexity"] <= rows["kenlm"]["perplexity"] * 1.01
    assert rows["log-linear"]["tuned_on_tokens"] == 600
    # OOVs excluded: the same tokens are skipped for every model
    assert main(["perplexity", "--model", model.path, "--test", BROWN_VALID, "--kenlm", arpa,
                 "--exclude-oov", "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["tokens"] for r in res["rows"]] == [ref.tokens - ref.oovs] * 2
    assert res["rows"][0]["perplexity"] == pytest.approx(
        model.perplexity(read_lines(BROWN_VALID), exclude_oov=True).perplexity, rel=1e-9)


def test_perplexity_command_trains_kenlm(tmp_path, capsys):
    path = make_model(str(tmp_path), output="class", classes=20, order=3)
    out = tmp_path / "k3.arpa"
    text = tmp_path / "train.txt"
    text.write_text("\n".join(read_lines(BROWN_TRAIN)[:500]) + "\n", encoding="utf-8")
    assert main(["perplexity", "--model", path, "--test", BROWN_VALID, "--kenlm-train", str(text),
                 "--kenlm-order", "3", "--kenlm", str(out), "--weight", "0.5", "--quiet"]) == 0
    table = capsys.readouterr().out
    assert out.exists() and "ngram 3=" in out.read_text(encoding="utf-8")
    lines = {l.split()[0]: l.split() for l in table.splitlines() if l and not l.startswith("#")}
    assert set(lines) == {"model", "neural", "kenlm", "linear", "log-linear"}
    assert lines["linear"][-1] == "0.5" and float(lines["kenlm"][1]) > 1


def test_binary_kenlm_model(setup, tmp_path, capsys):
    d, model, arpa = setup
    text = tmp_path / "train.txt"
    text.write_text("\n".join(read_lines(BROWN_TRAIN)[:400]) + "\n", encoding="utf-8")
    small_arpa, binary = tmp_path / "s.arpa", tmp_path / "s.bin"
    train_kenlm(str(text), str(small_arpa), 4, vocab=model.vocab, binary=str(binary))
    sents = read_sentences(BROWN_VALID)
    a = KenLMScorer(str(small_arpa), model.vocab).token_scores(sents)[0].logprob
    b = KenLMScorer(str(binary), model.vocab).token_scores(sents)[0].logprob
    np.testing.assert_allclose(a, b, atol=1e-4)
    assert main(["perplexity", "--model", model.path, "--test", BROWN_VALID, "--kenlm",
                 str(binary), "--weight", "0.2", "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in res["rows"]] == ["neural", "kenlm", "linear"]
    assert any("needs the ARPA file" in n for n in res["notes"])


def test_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("a b\nx <s> y\n", encoding="utf-8")
    with pytest.raises(NLMFeatureError, match=r"bad.txt:2: .*'<s>'"):
        train_kenlm(str(bad), str(tmp_path / "x.arpa"))
    with pytest.raises(NLMFeatureError, match="no such KenLM model"):
        KenLMScorer(str(tmp_path / "missing.arpa"))


def test_missing_lmplz_says_how_to_get_it_with_or_without_the_source_tree(tmp_path):
    """A pip user has no tools/ folder: the message points to KenLM's own build there, and to
    the checkout's build script in a source checkout."""
    import shutil
    import subprocess
    import sys

    import nlmfeature

    pkg = os.path.dirname(nlmfeature.__file__)
    site = tmp_path / "site-packages"
    shutil.copytree(pkg, site / "nlmfeature", ignore=shutil.ignore_patterns("data", "__pycache__"))
    probe = ("from nlmfeature.training.kenlm_baseline import find_tool\n"
             "from nlmfeature.errors import NLMFeatureError\n"
             "try:\n    find_tool('lmplz')\nexcept NLMFeatureError as e:\n    print(e)\n")
    env = dict(os.environ, PYTHONPATH=str(site), PATH="/nonexistent",
               NLMFEATURE_KENLM_BIN=str(tmp_path / "no-bin"), HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "KenLM's lmplz was not found" in out.stdout
    assert "tools/build_kenlm.sh" not in out.stdout and "github.com/kpu/kenlm" in out.stdout
    # the same search from the source checkout names its build script
    env["PYTHONPATH"] = os.path.dirname(pkg)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path), timeout=120)
    assert "tools/build_kenlm.sh" in out.stdout and "github" not in out.stdout
