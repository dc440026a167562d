"""``nlmfeature ensemble``: several unnormalised models as one model file whose scores are the
weighted sum of the members' scores, through every scoring path (the Cython scorer, the numpy
batch and the float64 reference)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import nlmfeature
from nlmfeature.cli import main as cli_main
from nlmfeature.core.ensemble import merge, write_ensemble
from nlmfeature.errors import NLMFeatureError

from helpers import BROWN_VALID, make_model
from reference import logprob

SENTENCES = [line.split() for line in open(BROWN_VALID, encoding="utf-8")][:40]


def _mixed_sum(models, weights, sentence):
    return sum(a * m.score_sentence(sentence) for m, a in zip(models, weights))


@pytest.mark.parametrize("members,weights", [
    # LBL 5-gram and 3-gram, both with direct features in the same hash space: the mean
    ([dict(order=5, direct_order=2, hash_space=1 << 14), dict(order=3, direct_order=2,
                                                            hash_space=1 << 14)], None),
    # a diagonal and a full-matrix LBL (block-diagonal contexts), one with direct features
    ([dict(order=4, direct_order=2, hash_space=1 << 12), dict(order=4, diagonal_contexts=False,
                                                            word_width=12)], [0.3, 0.7]),
    # NPLM-style one-layer ReLU models of different widths and orders, three members
    ([dict(arch="nplm", order=4, word_width=8, hidden=20, diagonal_contexts=False),
      dict(arch="nplm", order=3, word_width=6, hidden=10, diagonal_contexts=False),
      dict(arch="nplm", order=5, word_width=4, hidden=6, diagonal_contexts=False)], [1, 2, 0.5]),
])
def test_ensemble_scores_the_weighted_sum_of_its_members(tmp_path, members, weights):
    paths = [make_model(tmp_path, name=f"m{i}.nlm", seed=i, **spec)
             for i, spec in enumerate(members)]
    out = str(tmp_path / "ens.nlm")
    write_ensemble(out, paths, weights)
    ens = nlmfeature.load(out)
    models = [nlmfeature.load(p) for p in paths]
    alphas = weights or [1 / len(paths)] * len(paths)
    assert ens.order == max(m.order for m in models)
    assert ens.output_type == "unnormalised" and not ens.header.get("precomputed")
    assert [e["weight"] for e in ens.header["metadata"]["ensemble"]] == alphas
    worst = 0.0
    for s in SENTENCES:
        want = _mixed_sum(models, alphas, s)
        got = ens.score_sentence(s)                      # the Cython scorer (decoders' path)
        worst = max(worst, float(np.abs(got - want).max()))
        ctx, words = ens.sentence_ngrams(s)              # the numpy batch (k-best, perplexity)
        assert np.allclose(ens.score_batch(ctx, words), got, atol=2e-5)
    assert worst < 2e-5
    # the float64 reference model agrees on a few n-grams (an independent implementation)
    ids = [int(i) for i in ens.ids(SENTENCES[0])]
    got = ens.score_sentence(SENTENCES[0])
    for i in range(6):
        assert abs(logprob(ens.header, ens.arrays, [1] + ids[:i], ids[i]) - got[i]) < 1e-4


def test_members_that_cannot_sum_are_refused_naming_the_file(tmp_path):
    a = make_model(tmp_path, name="a.nlm", order=4)
    softmax = make_model(tmp_path, name="softmax.nlm", order=4, output="softmax")
    other_vocab = make_model(tmp_path, name="v.nlm", order=4, min_count=3)
    deep = make_model(tmp_path, name="deep.nlm", arch="nplm", order=4, word_width=8, hidden=10,
                      hidden_layers=[6], diagonal_contexts=False)
    other_hash = make_model(tmp_path, name="h.nlm", order=4, direct_order=2, hash_space=1 << 10)
    hashed = make_model(tmp_path, name="h2.nlm", order=4, direct_order=2, hash_space=1 << 11)
    for bad, why in ((softmax, "softmax"), (other_vocab, "vocabulary"), (deep, "hidden layer")):
        with pytest.raises(NLMFeatureError) as e:
            merge([a, bad])
        assert bad in str(e.value) and why in str(e.value)
    third = make_model(tmp_path, name="h3.nlm", order=4, direct_order=3, hash_space=1 << 10)
    for x, y in ((other_hash, hashed), (other_hash, third)):    # hash space, direct order
        with pytest.raises(NLMFeatureError, match="direct features differ"):
            merge([x, y])
    with pytest.raises(NLMFeatureError, match="at least two"):
        merge(a)                                          # a path, not a list of paths
    with pytest.raises(NLMFeatureError, match="positive"):
        merge([a, a], [1.0, -1.0])
    with pytest.raises(NLMFeatureError, match="one each"):
        merge([a, a], [1.0])


def test_ensemble_command(tmp_path, capsys):
    a = make_model(tmp_path, name="a.nlm", order=4, seed=1)
    b = make_model(tmp_path, name="b.nlm", order=3, seed=2)
    out = tmp_path / "e.nlm"
    assert cli_main(["ensemble", a, b, "-o", str(out), "--weights", "0.25", "0.75"]) == 0
    ens = nlmfeature.load(str(out))
    s = SENTENCES[1]
    want = 0.25 * nlmfeature.load(a).score_sentence(s) + 0.75 * nlmfeature.load(b).score_sentence(s)
    assert np.allclose(ens.score_sentence(s), want, atol=2e-5)
    assert "2 members" in capsys.readouterr().err
    # a bad member: a clear message naming it, nothing written
    softmax = make_model(tmp_path, name="s.nlm", order=4, output="softmax")
    bad_out = tmp_path / "bad.nlm"
    assert cli_main(["ensemble", a, softmax, "-o", str(bad_out)]) != 0
    err = capsys.readouterr().err
    assert softmax in err and "Traceback" not in err and not os.path.exists(bad_out)
