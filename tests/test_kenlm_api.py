"""The Python API under KenLM's names means what KenLM's means: ``score(sentence, bos, eos)``
is a sentence's log10 probability, ``full_scores`` yields (log10 prob, n-gram length, oov),
``"word" in model`` asks the vocabulary; the natural-log calls have names of their own
(``logprob``, ``score_ngram``, ``score_sentence``)."""
from __future__ import annotations

import math

import pytest

import nlmfeature
from helpers import BROWN_TRAIN, BROWN_VALID, make_model, read_lines


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return nlmfeature.load(make_model(tmp_path_factory.mktemp("kenlm-api"), output="class",
                                      classes=20))


def kenlm_style_report(model, sentences):
    """Code written for KenLM's Python module: it must run unchanged on our models."""
    out = []
    for s in sentences:
        total = model.score(s, bos=True, eos=True)
        parts = list(model.full_scores(s))
        oovs = [w for w, (_, _, oov) in zip(s.split() + ["</s>"], parts) if oov]
        assert all(w not in model for w in oovs)
        out.append((total, sum(p for p, _, _ in parts), [oov for _, _, oov in parts],
                    model.score(s, bos=False, eos=False)))
    return out


def test_score_is_a_sentence_log10_probability(lm):
    for sent in read_lines(BROWN_VALID, 30):
        natural = float(lm.score_sentence(sent).sum())
        assert lm.score(sent) == pytest.approx(natural / math.log(10), abs=1e-6)
        assert lm.logprob(sent) == pytest.approx(natural, abs=1e-9)
        assert lm.sentence_logprob(sent) == lm.logprob(sent)
        for bos in (True, False):
            for eos in (True, False):
                per_token = lm.score_sentence(sent, bos=bos, eos=eos)
                assert len(per_token) == len(sent.split()) + eos
                assert lm.score(sent, bos=bos, eos=eos) == \
                    pytest.approx(float(per_token.sum()) / math.log(10), abs=1e-6)
                assert lm.sentence_logprob(sent, bos=bos, eos=eos) == \
                    pytest.approx(float(per_token.sum()), abs=1e-9)
    # without <s> the first word is scored after <null> padding, as score_ngram with no context
    first = read_lines(BROWN_VALID, 1)[0].split()[0]
    assert lm.score_sentence(first, bos=False, eos=False)[0] == \
        pytest.approx(lm.score_ngram([], first), abs=1e-6)


def test_full_scores_as_kenlm(lm):
    sent = "the jury said zzzzqq it did </s>-not-a-word"
    parts = list(lm.full_scores(sent))
    assert len(parts) == len(sent.split()) + 1
    assert [oov for _, _, oov in parts] == [False, False, False, True, False, False, True, False]
    assert sum(p for p, _, _ in parts) == pytest.approx(lm.score(sent), abs=1e-6)
    assert [n for _, n, _ in parts] == [min(lm.order, i + 2) for i in range(len(parts))]
    assert [n for _, n, _ in lm.full_scores("a b c d e", bos=False)] == \
        [min(lm.order, i + 1) for i in range(6)]
    assert len(list(lm.full_scores("a b", eos=False))) == 2


def test_contains_asks_the_vocabulary(lm):
    assert "the" in lm and "jury" in lm and "</s>" in lm
    assert "zzzzqq" not in lm and 3 not in lm and b"the" not in lm
    known = [w for w in read_lines(BROWN_TRAIN, 50)[0].split()]
    assert all((w in lm) == (w in lm.vocab) for w in known)


def test_word_level_call_has_its_own_name(lm):
    assert lm.order == 4
    assert lm.score_ngram("<s> the jury", "said") == \
        pytest.approx(float(lm.score_sentence("the jury said")[2]), abs=1e-5)
    # the old word-level spelling is refused with the new name, never read as bos/eos flags
    with pytest.raises(TypeError, match="score_ngram"):
        lm.score("the jury", "said")
    with pytest.raises(TypeError, match="bos must be a bool"):
        lm.logprob("the jury", 1)


def test_kenlm_code_ports_by_changing_the_import(lm, tmp_path):
    """The same function on KenLM's own model and ours: the same kinds of answer and, for a
    KenLM model trained on the neural vocabulary, the same OOV flags."""
    kenlm = pytest.importorskip("kenlm")
    from nlmfeature.errors import NLMFeatureError
    from nlmfeature.training.kenlm_baseline import train_kenlm

    arpa = tmp_path / "brown.arpa"
    try:
        train_kenlm(BROWN_TRAIN, str(arpa), 3, vocab=lm.vocab)
    except NLMFeatureError as exc:
        pytest.skip(str(exc))
    sentences = read_lines(BROWN_VALID, 40)
    ours = kenlm_style_report(lm, sentences)
    theirs = kenlm_style_report(kenlm.Model(str(arpa)), sentences)
    for (t1, s1, oov1, nb1), (t2, s2, oov2, nb2) in zip(ours, theirs):
        assert t1 == pytest.approx(s1, abs=1e-5) and t2 == pytest.approx(s2, abs=1e-4)
        assert oov1 == oov2
        assert t1 < 0 and t2 < 0 and nb1 < 0 and nb2 < 0
    assert any(any(r[2]) for r in ours)        # the OOV flags were put to the test

