"""The Python API's inputs: a string is split on white space where tokens are expected,
anything that is not tokens is refused, perplexity takes a path, lines or a file, and
state scoring adds up to the sentence's log-probability as KenLM's does."""
from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_VALID, make_model, read_lines
from nlmfeature.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return nlmfeature.load(make_model(tmp_path_factory.mktemp("api"), output="class", classes=20))


# -- strings where tokens are expected --------------------------------------------------------------
def test_score_splits_a_string_context_on_white_space(lm):
    s = lm.score_ngram("the jury", "said")
    assert s == lm.score_ngram(["the", "jury"], "said") == lm.score_ngram(("the", "jury"), "said")
    # not the characters of the string (what it used to score)
    assert s != pytest.approx(lm.score_ngram(list("the jury"), "said"), abs=1e-6)
    assert lm.score_ngram("", "said") == lm.score_ngram([], "said")
    assert np.array_equal(lm.ids("the jury"), lm.ids(["the", "jury"]))
    assert np.array_equal(lm.vocab.ids("the jury"), lm.ids(["the", "jury"]))


@pytest.mark.parametrize("context,word,error", [
    ("the jury", "said it", ValueError),       # a word is one token
    ("the jury", ["said"], TypeError),
    (5, "said", TypeError),
    (b"the jury", "said", TypeError),
    (["the", 3], "said", TypeError),
])
def test_score_refuses_what_is_not_tokens(lm, context, word, error):
    with pytest.raises(error):
        lm.score_ngram(context, word)


def test_perplexity_takes_a_path_lines_or_a_file(lm, tmp_path):
    by_path = lm.perplexity(BROWN_VALID)
    lines = read_lines(BROWN_VALID)
    assert by_path.sentences == len(lines) and by_path.tokens == sum(len(l.split()) + 1 for l in lines)
    with open(BROWN_VALID, encoding="utf-8") as f:
        by_file = lm.perplexity(f)
    by_lines = lm.perplexity(lines)
    by_tokens = lm.perplexity([l.split() for l in lines])
    import pathlib

    by_pathlib = lm.perplexity(pathlib.Path(BROWN_VALID))
    gz = tmp_path / "valid.txt.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    by_gz = lm.perplexity(str(gz))
    for other in (by_file, by_lines, by_tokens, by_pathlib, by_gz):
        assert other.tokens == by_path.tokens and other.oovs == by_path.oovs
        assert other.perplexity == pytest.approx(by_path.perplexity, rel=1e-12)
    # the file name is not scored as a sentence any more: a missing file is an error naming it
    with pytest.raises(InputError, match="no-such-file.txt"):
        lm.perplexity(str(tmp_path / "no-such-file.txt"))
    with pytest.raises(TypeError):
        lm.perplexity(42)


def test_score_batch_refuses_words_and_takes_sentence_ngrams(lm):
    ctx, words = lm.sentence_ngrams("the jury said")
    np.testing.assert_allclose(lm.score_batch(ctx, words), lm.score_sentence("the jury said"),
                               atol=1e-5)
    with pytest.raises(TypeError, match="sentence_ngrams"):
        lm.score_batch([["the", "jury", "said"]], ["it"])
    with pytest.raises(TypeError):
        lm.score_batch(ctx.astype(np.float32), words)
    with pytest.raises(TypeError):
        lm.score_sentences("the jury said")


def test_a_model_that_scored_a_batch_is_freed_when_dropped(tmp_path):
    """No reference cycle keeps a model's arrays alive: a training run builds an in-memory
    model at each held-out evaluation, and each must go as soon as it is dropped."""
    import gc
    import weakref

    m = nlmfeature.load(make_model(tmp_path))
    ctx, words = m.sentence_ngrams("the jury said")
    m.score_batch(ctx, words)
    m.hidden(ctx)
    gone = weakref.ref(m)
    gc.disable()
    try:
        del m
        assert gone() is None
    finally:
        gc.enable()


def test_state_scoring_as_kenlm(lm):
    """KenLM's shape: BeginSentenceWrite + BaseScore(in_state, word, out_state)."""
    for sent in read_lines(BROWN_VALID, 20):
        state = lm.begin_sentence()
        total = 0.0
        for w in sent.split() + ["</s>"]:
            s, state = lm.score_word(state, w)
            total += s
        assert total == pytest.approx(lm.sentence_logprob(sent), abs=1e-4)
    # no history: <null> padding, as score() with a short context
    s, st = lm.score_word(lm.null_context(), "jury")
    assert s == pytest.approx(lm.score_ngram([], "jury"), abs=1e-6)
    s2, _ = lm.score_word(st, "said")
    assert s2 == pytest.approx(lm.score_ngram(["jury"], "said"), abs=1e-6)
    assert lm.begin_sentence() == lm.begin_sentence() and hash(st)
    with pytest.raises(TypeError):
        lm.score_word(("the",), "jury")




def test_a_loaded_vocabulary_is_decoded_on_its_first_lookup(tmp_path):
    """A loaded model's words become Python strings only when a word is looked up (a decoder
    looks them up in the file's table through the C library and scores by id): scoring by id
    and the specials need none; the first lookup decodes them all, once, and the vocabulary
    then equals the file's, in every thread."""
    import threading

    from nlmfeature.core.vocab import Vocabulary

    path = make_model(str(tmp_path), direct_order=0)
    lm = nlmfeature.load(path)
    v = lm.vocab
    assert "_words" not in v.__dict__
    ctx = np.ascontiguousarray(lm.pad([v.bos])[None], dtype=np.int32)   # </s> after <s>, by id
    assert np.isfinite(lm.session().score_padded(ctx, np.array([v.eos], dtype=np.int32))).all()
    assert (v.unk, v.bos, v.eos, v.null) == (0, 1, 2, 3) and len(v) == lm.header["vocab_size"]
    assert "_words" not in v.__dict__
    found = []
    threads = [threading.Thread(target=lambda: found.append(v.id("the"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "_words" in v.__dict__ and len(set(found)) == 1 and found[0] != v.unk
    eager = Vocabulary.from_arrays(lm.arrays["vocab.offsets"], lm.arrays["vocab.bytes"])
    assert v == eager and v.words == eager.words and v[found[0]] == "the"
