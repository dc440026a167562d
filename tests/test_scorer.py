"""The native scorer against the numpy reference, for every model x output x context type."""
from __future__ import annotations

import gc
import os
import platform
import re
import shutil
import subprocess
import threading

import numpy as np
import pytest

import nlmfeature
from nlmfeature.core import modelfile
from helpers import BROWN_VALID, make_model, read_lines
from reference import logprob, pad

ARCHS = {
    "lbl-full": dict(arch="lbl", word_width=12, diagonal_contexts=False),
    "lbl-diag-sigmoid": dict(arch="lbl", word_width=12, diagonal_contexts=True, activation="sigmoid"),
    "lbl-layers": dict(arch="lbl", word_width=12, activation="tanh", hidden_layers=[10, 8],
                       layer_activation="relu"),
    "nplm": dict(arch="nplm", word_width=10, hidden=24, hidden_layers=[12]),
    "nplm-1layer-hardtanh": dict(arch="nplm", word_width=10, hidden=16, activation="hardtanh"),
    "lateral-max": dict(arch="lateral", word_width=10, hidden=16, branches=2, combine="max"),
    "lateral-add": dict(arch="lateral", word_width=10, hidden=16, branches=3, combine="add"),
    "lateral-mul": dict(arch="lateral", word_width=10, hidden=16, branches=2, combine="mul",
                        hidden_layers=[8]),
}
OUTPUTS = {
    "unnormalised": dict(output="unnormalised"),
    "softmax": dict(output="softmax"),
    "class": dict(output="class", classes=17),
    "tree": dict(output="tree"),
}
DIRECT = dict(direct_order=3, hash_space=997)

SENTENCE = read_lines(BROWN_VALID, 5)[3].split()[:12] + ["qqqzzz-unknown"]


def histories(vocab, order):
    """(kind, history ids) covering every context type the scorer must handle."""
    ids = [int(i) for i in vocab.ids(SENTENCE)]
    bos = vocab.bos
    return [
        ("full", ids[:order - 1]),
        ("longer-than-n-1", ids[:order + 3]),
        ("sentence-start-short", [bos] + ids[:1]),
        ("sentence-start-only", [bos]),
        ("partial-null-padded", ids[4:5]),
        ("empty", []),
        ("with-unknown", ids[-3:]),
    ]


def _check_against_reference(path, reference=None, **load_kw):
    """Load ``path`` and compare its scores of many histories with the reference
    implementation's; returns the model.  ``reference``: a dict the reference scores are
    kept in (and taken from), for another load of the same file."""
    model = nlmfeature.load(path, **load_kw)
    h, a = model.header, model.arrays
    sess = model.session()
    sess.begin_sentence(0)
    words = [int(w) for w in model.ids(SENTENCE[:5])] + [model.vocab.eos, model.vocab.unk]
    reference = {} if reference is None else reference
    for kind, hist in histories(model.vocab, model.order):
        for w in words:
            got = sess.score(np.asarray(hist, dtype=np.int32), w)
            key = (tuple(hist), w)
            if key not in reference:
                reference[key] = logprob(h, a, hist, w)
            assert got == pytest.approx(reference[key], abs=1e-5, rel=1e-5), (kind, hist, w)
    return model


@pytest.mark.parametrize("out", list(OUTPUTS))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_scorer_equals_reference(tmp_path, arch, out):
    path = make_model(tmp_path, min_count=6, order=4, **ARCHS[arch], **OUTPUTS[out])
    reference = {}
    model = _check_against_reference(path, reference)
    # and without the precomputed tables (direct first layer)
    _check_against_reference(path, reference, use_tables=False)
    # the batched matrix path agrees too
    ctx, words = model.sentence_ngrams(SENTENCE)
    one = model.session().score_padded(ctx, words)
    assert np.allclose(model.score_batch(ctx, words), one, atol=1e-5)


def test_a_large_direct_store_equals_reference(tmp_path):
    """The scorer lays the direct weights out by line a piece of 4M entries at a time: a store
    of two pieces (not a whole number of lines), four in five of its weights zero at random,
    scores as the reference does."""
    path = make_model(tmp_path, min_count=6, order=4, **ARCHS["lbl-full"], direct_order=3,
                      hash_space=(2 << 22) - 4099)
    header, arrays, _ = modelfile.read_model(path)
    arrays = {k: np.array(v) for k, v in arrays.items()}
    w = arrays["direct.weights"]
    rng = np.random.default_rng(3)
    w[:] = rng.standard_normal(w.shape[0]).astype(np.float32) * (rng.random(w.shape[0]) < 0.2)
    assert _direct_store_layout(w)[0] > 0          # (by lines, not dense)
    nlmfeature.save(path, header, arrays)
    _check_against_reference(path)


def _direct_store_layout(weights: np.ndarray):
    """``(gshift, spilled, bytes)`` of the scorer's store of these direct weights
    (``direct_store_plan``; gshift 0: dense)."""
    from nlmfeature._scorer import direct_store_plan

    nonzero = np.zeros(-(-weights.shape[0] // 16) * 16, dtype=bool)
    nonzero[:weights.shape[0]] = weights != 0
    gshift, _, _, spilled, lines = direct_store_plan(nonzero.reshape(-1, 16).sum(axis=1, dtype=np.uint8),
                                                     weights.dtype.itemsize)
    if gshift == 0:
        return 0, 0, weights.nbytes
    return gshift, spilled, lines.shape[0] * 64 + spilled * weights.dtype.itemsize


@pytest.mark.parametrize("out", ["unnormalised", "softmax", "class"])
@pytest.mark.parametrize("arch", ["lbl-full", "nplm"])
def test_direct_features_equal_reference(tmp_path, arch, out):
    path = make_model(tmp_path, min_count=6, order=4, **ARCHS[arch], **OUTPUTS[out], **DIRECT)
    model = _check_against_reference(path)
    ctx, words = model.sentence_ngrams(SENTENCE)
    assert np.allclose(model.score_batch(ctx, words), model.score_sentence(SENTENCE), atol=1e-5)


@pytest.mark.parametrize("out", ["softmax", "class", "tree"])
@pytest.mark.parametrize("arch", ["lbl-diag-sigmoid", "nplm", "lateral-mul"])
def test_normalised_outputs_sum_to_one(tmp_path, arch, out):
    extra = DIRECT if out != "tree" else {}
    path = make_model(tmp_path, min_count=4, order=5, **ARCHS[arch], **OUTPUTS[out], **extra)
    model = nlmfeature.load(path)
    V = len(model.vocab)
    sess = model.session()
    lines = read_lines(BROWN_VALID, 40)
    for line in lines[::4]:
        ctx, _ = model.sentence_ngrams(line.split())
        for c in ctx[:: max(1, len(ctx) // 3)]:
            cc = np.ascontiguousarray(np.repeat(c[None], V, axis=0))
            total = np.exp(sess.score_padded(cc, np.arange(V, dtype=np.int32))).sum()
            assert total == pytest.approx(1.0, abs=1e-6)


def test_tables_equal_direct_computation(tmp_path):
    for arch in ARCHS:
        path = make_model(tmp_path, name=f"{arch}.nlm", min_count=3, order=5, **ARCHS[arch])
        with_tables = nlmfeature.load(path)
        direct = nlmfeature.load(path, use_tables=False)
        assert with_tables.native.uses_tables and not direct.native.uses_tables
        for line in read_lines(BROWN_VALID, 30):
            ctx, _ = with_tables.sentence_ngrams(line.split())
            for c in ctx:
                assert np.allclose(with_tables.native.hidden(c), direct.native.hidden(c), atol=1e-5)


def test_null_and_bos_padding_as_specified(tmp_path):
    model = nlmfeature.load(make_model(tmp_path, order=5))
    v = model.vocab
    the, cat = v.id("the"), v.id("man")
    assert list(model.pad([the, cat])) == [v.null, v.null, the, cat]
    assert list(model.pad([v.bos, the])) == [v.bos, v.bos, v.bos, the]
    assert list(model.pad([])) == [v.null] * 4
    assert list(model.pad([the, cat, the, cat, the, cat])) == [the, cat, the, cat][-4:]
    assert list(model.pad([cat, 10 ** 8, -5])) == [v.null, cat, v.unk, v.unk]
    # a sentence is scored with <s>-padded contexts
    ctx, words = model.sentence_ngrams(["the", "man"])
    assert ctx.tolist() == [[v.bos] * 4, [v.bos] * 3 + [the], [v.bos] * 2 + [the, cat]]
    assert words.tolist() == [the, cat, v.eos]
    # pad() of the reference agrees
    for hist in ([the], [v.bos, cat], [], [the] * 7):
        assert list(model.pad(hist)) == pad(model.header, hist)


def test_null_embedding_is_unigram_weighted_average(tmp_path):
    model = nlmfeature.load(make_model(tmp_path))
    a, v = model.arrays, model.vocab
    p = a["unigram"].astype(np.float64).copy()
    p[[v.null, v.bos]] = 0
    want = (p / p.sum()) @ a["embeddings"].astype(np.float64)
    assert np.allclose(a["embeddings"][v.null], want, atol=1e-6)


@pytest.mark.parametrize("out", ["unnormalised", "class", "softmax"])
def test_cache_hits_equal_misses(tmp_path, out):
    path = make_model(tmp_path, arch="nplm", word_width=10, hidden=24, hidden_layers=[12], min_count=4,
                      **OUTPUTS[out])
    model = nlmfeature.load(path)
    lines = [l.split() for l in read_lines(BROWN_VALID, 60)]
    ctxs, words = zip(*(model.sentence_ngrams(l) for l in lines))
    ctx, w = np.concatenate(ctxs), np.concatenate(words)
    # the context/normaliser caches alone (n-gram cache off), then with the n-gram cache
    cached, uncached = model.session(1 << 12, 0), model.session(0)
    first = cached.score_padded(ctx, w)
    again = cached.score_padded(ctx, w)  # now served from the cache
    st = cached.stats()
    assert st["context_hits"] >= len(w) and st["ngram_hits"] == 0
    if out == "class":
        assert st["class_hits"] >= len(w)
    assert np.array_equal(first, again)
    assert np.allclose(first, uncached.score_padded(ctx, w), atol=1e-9)
    ngram = model.session(1 << 12, 1 << 14)
    assert np.array_equal(ngram.score_padded(ctx, w), first)
    assert np.array_equal(ngram.score_padded(ctx, w), first)  # exact repeats: from the n-gram cache
    assert ngram.stats()["ngram_hits"] >= len(w)
    # the automatic choice: on for this model (dense layers), hits equal misses
    auto = model.session(1 << 12)
    assert auto.stats()["ngram_cache_enabled"]
    assert np.array_equal(auto.score_padded(ctx, w), first)
    # tiny caches are cleared (context) or stop growing (n-grams) and stay exact
    tiny = model.session(3, 5)
    assert np.allclose(tiny.score_padded(ctx, w), first, atol=1e-9)
    assert np.allclose(tiny.score_padded(ctx, w), first, atol=1e-9)
    assert tiny.stats()["cache_clears"] > 0
    # a new sentence empties the caches
    for sess in (cached, ngram):
        sess.begin_sentence(1)
        before = sess.stats()["context_misses"]
        sess.score_padded(ctx[:5], w[:5])
        assert sess.stats()["context_misses"] > before


@pytest.mark.parametrize("tables", [True, False])
@pytest.mark.parametrize("out", ["unnormalised", "tree"])
def test_context_memo_keeps_the_bits(tmp_path, out, tables):
    """A diagonal network with unnormalised or tree outputs keeps its recent contexts' hidden
    vectors in a direct-mapped memo (the context cache does not pay for a few vector
    additions): the same bits as computing every one, across evictions (more contexts than
    slots) and in any order; a session without caches has no memo."""
    path = make_model(tmp_path, tables=tables, arch="lbl", order=5, word_width=12, min_count=4,
                      **(DIRECT if out == "unnormalised" else {}), **OUTPUTS[out])
    model = nlmfeature.load(path)
    lines = [l.split() for l in read_lines(BROWN_VALID, 400)]
    ctxs, words = zip(*(model.sentence_ngrams(l) for l in lines))
    ctx, w = np.concatenate(ctxs), np.concatenate(words)
    plain = model.session(0)
    assert plain.stats()["context_memo_slots"] == 0
    want = plain.score_padded(ctx, w)
    memo = model.session(1 << 12, 0)          # (no n-gram cache: every lookup asks the memo)
    st = memo.stats()
    assert st["context_memo_slots"] >= 64 and not st["context_cache_enabled"]
    assert np.array_equal(memo.score_padded(ctx, w), want)
    assert np.array_equal(memo.score_padded(ctx[::-1].copy(), w[::-1].copy()), want[::-1])
    st = memo.stats()
    distinct = len({c.tobytes() for c in ctx})
    assert distinct > st["context_memo_slots"]
    assert st["context_hits"] > 0 and st["context_misses"] >= distinct
    assert st["context_hits"] + st["context_misses"] <= 2 * len(w)
    # a decoder's pattern: many words after one context, each but the first from the memo
    one = np.repeat(ctx[:1], 50, axis=0)
    assert np.array_equal(memo.score_padded(one, w[:50]), plain.score_padded(one, w[:50]))
    assert memo.stats()["context_hits"] - st["context_hits"] >= 49


@pytest.mark.parametrize("out", ["unnormalised", "class"])
def test_threads_give_the_same_scores(tmp_path, out):
    path = make_model(tmp_path, arch="lbl", word_width=16, min_count=4, **OUTPUTS[out])
    model = nlmfeature.load(path)
    lines = [l.split() for l in read_lines(BROWN_VALID, 300)]
    ctxs, words = zip(*(model.sentence_ngrams(l) for l in lines))
    ctx, w = np.concatenate(ctxs), np.concatenate(words)
    want = model.session(0).score_padded(ctx, w)
    results = [None] * 4

    def work(k):
        s = model.session(1 << 10)
        for _ in range(3):
            results[k] = s.score_padded(ctx, w)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        assert np.allclose(r, want, atol=1e-9)


def test_python_api(tmp_path):
    model = nlmfeature.load(make_model(tmp_path, output="class", classes=20))
    assert model.order == 4 and model.normalised
    toks = "the jury said it did find that".split()
    per_word = model.score_sentence(toks)
    assert per_word.shape == (len(toks) + 1,)
    assert model.sentence_logprob(toks) == pytest.approx(per_word.sum())
    assert model.score_ngram(["<s>", "the"], "jury") == pytest.approx(per_word[1], abs=1e-9)
    assert model.score_sentences([toks, " ".join(toks)]) == pytest.approx([per_word.sum()] * 2, abs=1e-5)
    ppl = model.perplexity([" ".join(toks)])
    assert ppl.tokens == len(toks) + 1
    assert ppl.perplexity == pytest.approx(np.exp(-per_word.sum() / (len(toks) + 1)), rel=1e-6)
    ex = model.perplexity([" ".join(toks) + " zzqqunknown"], exclude_oov=True)
    assert ex.oovs == 1 and ex.tokens == len(toks) + 1
    # vocabulary enumeration and lookups
    words = list(model.vocab)
    assert words[:4] == ["<unk>", "<s>", "</s>", "<null>"]
    assert model.vocab.id("zzqqunknown") == model.vocab.unk
    from nlmfeature._scorer import vocab_find
    a = model.arrays
    for w in words[:200] + ["zzqq", "é"]:
        want = model.vocab._index.get(w, -1)
        assert vocab_find(a["vocab.offsets"], a["vocab.bytes"], a["vocab.hash"], w.encode()) == want


def test_default_tables_policy(tmp_path):
    """Full context matrices get tables; diagonal ones keep the direct form (same arithmetic,
    a quarter of the memory)."""
    from nlmfeature.core.architecture import ModelSpec, precompute_tables, random_model
    from helpers import brown_vocab

    vocab, counts = brown_vocab(6)
    for diagonal in (False, True):
        header, arrays = random_model(ModelSpec(arch="lbl", word_width=8, diagonal_contexts=diagonal),
                                      vocab, counts)
        precompute_tables(header, arrays)
        assert header["precomputed"] == (not diagonal)
        assert ("branch0.tables" in arrays) == (not diagonal)
        path = str(tmp_path / f"m{diagonal}.nlm")
        nlmfeature.save(path, header, arrays)
        assert nlmfeature.load(path).native.uses_tables == (not diagonal)


def test_out_of_range_ids_are_rejected_not_read(tmp_path):
    model = nlmfeature.load(make_model(tmp_path))
    V = len(model.vocab)
    sess = model.session()
    bad = np.array([[0, 1, V]], dtype=np.int32)
    with pytest.raises(ValueError, match="outside"):
        sess.score_padded(bad, np.array([5], dtype=np.int32))
    with pytest.raises(ValueError, match="outside"):
        sess.score_stream(bad, np.array([5], dtype=np.int32), np.array([0], dtype=np.int64))
    with pytest.raises(ValueError, match="outside"):
        model.score_batch(bad, np.array([5], dtype=np.int32))
    with pytest.raises(ValueError, match="outside"):
        model.native.hidden(np.array([-1, 0, 0], dtype=np.int32))
    # an out-of-range *word* in score_padded/score is read as <unk>, as are unpadded histories
    ok = np.array([[0, 1, 2]], dtype=np.int32)
    assert sess.score_padded(ok, np.array([V + 3], dtype=np.int32))[0] == pytest.approx(
        sess.score_padded(ok, np.array([model.vocab.unk], dtype=np.int32))[0])
    assert sess.score(np.array([V + 9], dtype=np.int32), 5) == pytest.approx(
        sess.score(np.array([model.vocab.unk], dtype=np.int32), 5))


@pytest.mark.parametrize("direct", [False, True])
def test_scattered_and_singleton_classes(tmp_path, direct):
    """Classes whose members are not consecutive ids (Brown clusters) take the gathered path,
    one-word classes the p(w|c) = 1 shortcut; both equal the reference and sum to one."""
    from helpers import brown_vocab
    from nlmfeature.core.architecture import ModelSpec, random_model

    vocab, counts = brown_vocab(6)
    V = len(vocab)
    rng = np.random.default_rng(5)
    cw = rng.integers(0, 12, size=V).astype(np.int32)
    cw[[5, 9, 40]] = [12, 13, 14]  # three one-word classes
    spec = ModelSpec(arch="lbl", order=4, word_width=16, diagonal_contexts=True, output="class",
                     classes=15, **(DIRECT if direct else {}))
    header, arrays = random_model(spec, vocab, counts, seed=3, class_of_word=cw)
    path = str(tmp_path / "scattered.nlm")
    nlmfeature.save(path, header, arrays)
    model = _check_against_reference(path)
    sess = model.session()
    ctx, _ = model.sentence_ngrams(SENTENCE)
    for c in ctx[::3]:
        cc = np.ascontiguousarray(np.repeat(c[None], V, axis=0))
        scores = sess.score_padded(cc, np.arange(V, dtype=np.int32))
        assert np.exp(scores).sum() == pytest.approx(1.0, abs=1e-6)
        want = [logprob(model.header, model.arrays, [int(x) for x in c], w) for w in (5, 9, 40, 7)]
        assert np.allclose(scores[[5, 9, 40, 7]], want, atol=1e-5)


@pytest.mark.parametrize("terms", [False, True])
@pytest.mark.parametrize("out", ["class", "softmax"])
def test_direct_vectors_cached_per_sentence_are_exact(tmp_path, out, terms):
    """The normalisers' direct-feature values come from a per-sentence cache keyed by the last
    direct_order-1 context ids (and the class): every path -- computed and stored, found
    again, computed without room (tiny caches), all caches off -- gives the same bits, the
    scores equal the reference and sum to one, and a new sentence starts the cache again."""
    from helpers import brown_vocab
    from nlmfeature.core.architecture import ModelSpec, random_model

    vocab, counts = brown_vocab(6)
    V = len(vocab)
    cw = np.random.default_rng(7).integers(0, 11, size=V).astype(np.int32)  # scattered classes
    spec = ModelSpec(arch="lbl", order=4, word_width=16, diagonal_contexts=True, output=out,
                     **(dict(classes=11) if out == "class" else {}), direct_order=3, hash_space=4099)
    header, arrays = random_model(spec, vocab, counts, seed=4,
                                  **(dict(class_of_word=cw) if out == "class" else {}))
    assert np.count_nonzero(arrays["direct.weights"]) > 0
    path = str(tmp_path / f"direct-{out}.nlm")
    nlmfeature.save(path, header, arrays)
    model = _check_against_reference(path)
    lines = [l.split() for l in read_lines(BROWN_VALID, 40)]
    ctxs, words = zip(*(model.sentence_ngrams(l) for l in lines))
    ctx, w = np.concatenate(ctxs), np.concatenate(words)
    cached = model.session(1 << 12, 0, position_terms=terms)
    first = cached.score_padded(ctx, w)
    assert np.array_equal(cached.score_padded(ctx, w), first)
    cached.begin_sentence(1)
    assert np.array_equal(cached.score_padded(ctx, w), first)
    for other in (model.session(0, position_terms=terms), model.session(2, 0, position_terms=terms)):
        assert np.array_equal(other.score_padded(ctx, w), first)
    want = [logprob(model.header, model.arrays, [int(x) for x in c], int(x)) for c, x in zip(ctx[:40], w[:40])]
    assert np.allclose(first[:40], want, atol=1e-5)
    c = np.ascontiguousarray(np.repeat(ctx[7][None], V, axis=0))
    assert np.exp(cached.score_padded(c, np.arange(V, dtype=np.int32))).sum() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("out", ["softmax", "unnormalised"])
def test_batched_softmax_with_direct_features_equals_the_native_scorer(tmp_path, out):
    """A softmax normaliser over direct features in the batched scorer (matrix products, the
    direct values of every word from the native scorer, ``Session.direct_vocab``): the same
    scores as one lookup at a time, for a softmax model and for the exactly normalised view
    of an unnormalised one (``perplexity --exact``), and they sum to one over the vocabulary."""
    from helpers import brown_vocab
    from nlmfeature.core.architecture import ModelSpec, random_model
    from nlmfeature.core.model import exactly_normalised

    vocab, counts = brown_vocab(6)
    V = len(vocab)
    spec = ModelSpec(arch="lbl", order=4, word_width=16, diagonal_contexts=True, output=out,
                     direct_order=3, hash_space=4099)
    header, arrays = random_model(spec, vocab, counts, seed=9)
    path = str(tmp_path / f"direct-{out}.nlm")
    nlmfeature.save(path, header, arrays)
    model = exactly_normalised(nlmfeature.load(path))
    lines = [l.split() for l in read_lines(BROWN_VALID, 60)]
    ctxs, words = zip(*(model.sentence_ngrams(l) for l in lines))
    ctx, w = np.ascontiguousarray(np.concatenate(ctxs)), np.ascontiguousarray(np.concatenate(words))
    native = model.native.session(1 << 12).score_padded(ctx, w)
    batched = model.score_batch(ctx, w)
    assert np.allclose(batched, native, rtol=0, atol=2e-5)
    one = np.ascontiguousarray(np.repeat(ctx[11][None], V, axis=0))
    assert np.exp(model.score_batch(one, np.arange(V, dtype=np.int32))).sum() == pytest.approx(1.0, abs=1e-5)
    d = np.empty((2, V), dtype=np.float32)
    model.native.session(0).direct_vocab(ctx[:2], d)
    assert np.count_nonzero(d) > 0
    with pytest.raises(ValueError, match="shape"):
        model.native.session(0).direct_vocab(ctx[:2], np.empty((2, V - 1), dtype=np.float32))


@pytest.mark.parametrize("case", ["class-diag-direct", "softmax-full-tables-bias", "joint-class",
                                  "class-order1-bias", "class-wide-range"])
def test_linear_outputs_sum_position_terms(tmp_path, case, monkeypatch):
    """Log-bilinear normalised outputs in a decoder's session (``position_terms``) sum each
    context position's term of the logits (per-sentence vectors) instead of multiplying the
    rows by a hidden vector: the scores
    equal the float64 reference more closely than the hidden-vector path does, every cache
    path (stored vectors, none, no room) gives the same bits, and normalisers sum to one."""
    from helpers import brown_vocab
    from nlmfeature.core.architecture import ModelSpec, precompute_tables, random_model

    vocab, counts = brown_vocab(6)
    V = len(vocab)
    fields = dict(arch="lbl", order=4, word_width=16, diagonal_contexts=True, output="class", classes=13)
    extra = {}
    if case == "softmax-full-tables-bias":
        fields.update(output="softmax", diagonal_contexts=False)
        del fields["classes"]
    elif case == "class-order1-bias":
        fields.update(order=1)
    if "direct" in case:
        fields.update(direct_order=3, hash_space=4099)
    if case.startswith("joint"):
        fields.update(source_window=3)
        svocab, scounts = brown_vocab(8)
        extra = dict(source_vocab=svocab, source_counts=scounts)
    header, arrays = random_model(ModelSpec(**fields), vocab, counts, seed=11,
                                  class_of_word=np.random.default_rng(2).integers(0, 13, V).astype(np.int32)
                                  if fields["output"] == "class" else None, **extra)
    if "bias" in case:
        header["branches"][0]["bias"] = True
        arrays["branch0.bias"] = np.random.default_rng(3).normal(0, 0.3, header["branches"][0]["hidden"]).astype(np.float32)
    if "tables" in case:
        precompute_tables(header, arrays)
    if "wide" in case:  # logits spanning more than a float exponential holds: the summed normaliser
        arrays["output.bias"][::7] += 95.0
    path = str(tmp_path / f"{case}.nlm")
    nlmfeature.save(path, header, arrays)
    model = nlmfeature.load(path)
    lines = [l.split() for l in read_lines(BROWN_VALID, 25)]
    if case.startswith("joint"):
        pairs = [(l[::-1], l, " ".join(f"{i}-{i}" for i in range(len(l)))) for l in lines]
        ctx, w = zip(*(model.sentence_ngrams(*p) for p in pairs))
    else:
        ctx, w = zip(*(model.sentence_ngrams(l) for l in lines))
    ctx, w = np.ascontiguousarray(np.concatenate(ctx)), np.ascontiguousarray(np.concatenate(w))
    got = model.session(position_terms=True).score_padded(ctx, w)
    for other in (model.session(0, position_terms=True), model.session(2, 0, position_terms=True),
                  model.session(1 << 12, 0, position_terms=True)):
        assert np.array_equal(other.score_padded(ctx, w), got)
    # sessions that do not ask for position terms (a sentence scored once) take the hidden path
    hid = model.session().score_padded(ctx, w)
    assert np.allclose(got, hid, atol=2e-5) and not np.array_equal(got, hid)
    assert np.array_equal(model.session(0, 0).score_padded(ctx, w), hid)
    if not case.startswith("joint"):
        want = np.array([logprob(model.header, model.arrays, [int(x) for x in c], int(x))
                         for c, x in zip(ctx[:300], w[:300])])
        assert np.abs(got[:300] - want).max() <= np.abs(hid[:300] - want).max() + 1e-7
        # (float logits round in proportion to their size: the wide model's scores reach -100)
        assert np.abs(got[:300] - want).max() < 2e-6 * max(1.0, np.abs(want).max() / 30)
    c = np.ascontiguousarray(np.repeat(ctx[5][None], V, axis=0))
    assert np.exp(model.session(position_terms=True).score_padded(c, np.arange(V, dtype=np.int32))).sum() == \
        pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("case", ["unnormalised-direct", "joint", "class", "class-direct", "softmax",
                                  "full", "width-37"])
def test_float16_rows_are_read_as_stored(tmp_path, case, monkeypatch):
    """A model stored with ``storage: float16`` has its embeddings (source ones too) and output
    rows (and its direct-feature weights) read by the scorer as stored, half the bytes of their
    float32 widening, in every path that reads them (context layer, word logits, softmax and
    class normalisers, position terms, direct values): the same scores, bit for bit, as with ``half_rows=False`` (the widened rows), in
    decoder and one-off sessions with their caches on and off, and within float16's rounding
    of the float32 model's.  A model with a full (not diagonal) context layer reads its
    embeddings widened and its output rows as halves.  A model whose header says float16 but
    whose values are not all halves (built in memory) reads its float32 rows."""
    from helpers import brown_vocab
    from nlmfeature.core.architecture import ModelSpec, random_model

    vocab, counts = brown_vocab(6)
    fields = dict(arch="lbl", order=4, word_width=16, diagonal_contexts=True, output="unnormalised")
    extra = {}
    if "direct" in case:
        fields.update(direct_order=3, hash_space=4099)
    if case.startswith("class"):
        fields.update(output="class", classes=13)
    if case == "class-direct":
        fields.update(direct_order=3, hash_space=4099)
    if case == "softmax":
        fields.update(output="softmax")
    if case == "full":
        fields.update(diagonal_contexts=False, word_width=24)
    if case == "width-37":  # (every kernel's tail)
        fields.update(word_width=37)
    if case == "joint":
        fields.update(source_window=3)
        svocab, scounts = brown_vocab(8)
        extra = dict(source_vocab=svocab, source_counts=scounts)
    header, arrays = random_model(ModelSpec(**fields), vocab, counts, seed=5, **extra)
    full, half = str(tmp_path / "f32.nlm"), str(tmp_path / "f16.nlm")
    nlmfeature.save(full, header, arrays)
    nlmfeature.save(half, header, arrays, half=True)
    lines = [l.split() for l in read_lines(BROWN_VALID, 30)]

    def scores(path, half_rows):
        model = nlmfeature.load(path)
        if not half_rows:      # the same model reading the float32 widening of its rows
            model.native = NativeModel(model.header, model.arrays, True, half_rows=False)
        if case == "joint":
            grams = [model.sentence_ngrams(l[::-1], l, " ".join(f"{i}-{i}" for i in range(len(l)))) for l in lines]
        else:
            grams = [model.sentence_ngrams(l) for l in lines]
        ctx = np.ascontiguousarray(np.concatenate([g[0] for g in grams]))
        w = np.ascontiguousarray(np.concatenate([g[1] for g in grams]))
        out = [model.session(e, n, position_terms=t).score_padded(ctx, w)
               for t in (True, False) for e, n in ((1 << 16, -1), (0, 0), (1 << 16, 0))]
        return model, out

    from nlmfeature._scorer import HALF_ROWS, NativeModel

    model, got = scores(half, True)
    assert model.native.half_rows == HALF_ROWS  # (a build without F16C: float rows)
    # as stored: the rows the scorer reads as halves are not widened anywhere
    assert (model.arrays["output.weight"].dtype == np.float16) and model._float32_arrays is None
    assert "direct" not in case or model.arrays["direct.weights"].dtype == np.float16
    widened, want = scores(half, False)
    assert not widened.native.half_rows
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    _, f32 = scores(full, True)
    assert np.allclose(got[0], f32[0], atol=0.05) and not np.array_equal(got[0], f32[0])
    # float16 in the header, float32 values that are not halves: the float32 rows
    assert not nlmfeature.Model(half, dict(header, storage="float16"), arrays, "0" * 16).native.half_rows


@pytest.mark.parametrize("entries", [1 << 16, 3])
def test_position_terms_outlive_the_sentence(tmp_path, entries):
    """A decoder's session keeps its term and base vectors (functions of the model alone)
    from sentence to sentence, emptied at a sentence's begin once past their bounds (3
    entries: at every begin): each sentence scores the same bits as in a session of its own,
    in any order."""
    model = nlmfeature.load(make_model(tmp_path, output="class", classes=13, direct_order=3, hash_space=4099))
    lines = [l.split() for l in read_lines(BROWN_VALID, 12)]
    grams = [model.sentence_ngrams(l) for l in lines]
    alone = []
    for ctx, w in grams:
        sess = model.session(entries, position_terms=True)
        sess.begin_sentence(0)
        alone.append(sess.score_padded(ctx, w))
    sess = model.session(entries, position_terms=True)
    for k in list(range(len(grams))) + list(range(len(grams)))[::-1]:
        sess.begin_sentence(k)
        assert np.array_equal(sess.score_padded(*grams[k]), alone[k])


@pytest.mark.parametrize("output", ["unnormalised", "class"])
def test_huge_page_copies_score_the_same_bits(tmp_path, monkeypatch, output):
    """The arrays a decoder reads at scattered rows (here the embeddings and output rows,
    2.2 MB each) are copied into huge pages at load, unless ``NLMFEATURE_HUGE_PAGES=0``: the
    same scores, bit for bit, in decoder sessions with their caches on and off.  (The 4 MB of
    direct-feature weights are not: the scorer reads its own copy of them.)"""
    path = make_model(tmp_path, output=output, **(dict(classes=13) if output == "class" else {}),
                      word_width=160, direct_order=3, hash_space=1 << 20)
    lines = [l.split() for l in read_lines(BROWN_VALID, 6)]
    scores = {}
    for huge in ("0", "1"):
        monkeypatch.setenv("NLMFEATURE_HUGE_PAGES", huge)
        model = nlmfeature.load(path)
        assert (model.native.copied_bytes >= 4 << 20) == (huge == "1")
        got = []
        for entries in (1 << 16, 0):
            sess = model.session(entries, position_terms=True)
            for k, line in enumerate(lines):
                sess.begin_sentence(k)
                got.append(sess.score_padded(*model.sentence_ngrams(line)))
        scores[huge] = np.concatenate(got)
    assert np.array_equal(scores["0"], scores["1"])


def _resident_kib_of_mapping(path: str) -> int:
    """KiB of the mappings of the file ``path`` that are resident in this process."""
    real, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps", encoding="utf-8") as f:
        for line in f:
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                inside = line.rstrip("\n").endswith(" " + real)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def _anonymous_kib() -> int:
    """KiB of this process's resident anonymous memory (its own, not a file's pages)."""
    with open("/proc/self/status", encoding="utf-8") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
@pytest.mark.parametrize("storage", ["float32", "float16"])
def test_a_loaded_model_holds_its_arrays_once(tmp_path, monkeypatch, storage):
    """What a decoder process keeps of a model: the arrays it reads at scattered rows in its
    own huge-page copies, and nothing of the mapped file they came from (verified, copied or
    packed, then released: the file stays in the page cache); a float16 model's rows as
    stored, halves copied once and never widened (half the float32 model's bytes).  The same
    scores as reading the mapping (NLMFEATURE_HUGE_PAGES=0), and model.arrays still reads the
    file's values."""
    monkeypatch.setenv("NLMFEATURE_HUGE_PAGES", "1")
    # (wide enough that the halves, too, are past the 2 MB from which arrays are copied)
    path = path32 = make_model(tmp_path, tables=False, word_width=320, direct_order=3, hash_space=1 << 20)
    kept = []
    if storage == "float16":
        header, arrays, _ = modelfile.read_model(path)
        path = str(tmp_path / "half.nlm")
        nlmfeature.save(path, header, {k: np.asarray(v) for k, v in arrays.items()}, half=True)
    size_kib = os.path.getsize(path) // 1024
    model = nlmfeature.load(path)
    emb, out = model.arrays["embeddings"], model.arrays["output.weight"]
    rows = emb.nbytes + out.nbytes
    assert modelfile.file_backed(emb) and emb.dtype == storage
    # the direct weights' store too, from 2 MB up (a random model's 2^20 are all non-zero, so
    # stored dense: counted without reading them, which would map the file's pages again)
    packed = (1 << 20) * emb.itemsize
    if storage == "float32" or model.native.half_rows:  # (else: a build without F16C widens)
        assert model.native.copied_bytes == rows + (packed if packed >= 2 << 20 else 0)
    if storage == "float16" and model.native.half_rows:
        # the process's own memory of a load (models kept: nothing freed is reused): the
        # float16 file's costs half its rows' float32 bytes less than the float32 file's
        grown = {}
        for p in (path, path32, path, path32):
            before = _anonymous_kib()
            kept.append(nlmfeature.load(p))
            grown[p] = _anonymous_kib() - before
        assert grown[path32] - grown[path] > 0.75 * rows / 1024, (grown, rows)
    assert _resident_kib_of_mapping(path) < size_kib // 8, (_resident_kib_of_mapping(path), size_kib)
    lines = [l.split() for l in read_lines(BROWN_VALID, 6)]
    got = np.concatenate([model.score_sentence(l) for l in lines])
    monkeypatch.setenv("NLMFEATURE_HUGE_PAGES", "0")
    mapped = nlmfeature.load(path)
    assert mapped.native.copied_bytes == 0
    assert np.array_equal(got, np.concatenate([mapped.score_sentence(l) for l in lines]))
    header, arrays, _ = modelfile.read_model(path)
    for name in ("embeddings", "output.weight", "direct.weights"):
        assert np.array_equal(model.arrays[name], arrays[name]), name
        assert np.array_equal(model.float32_arrays()[name], arrays[name]), name
    assert model.float32_arrays()["embeddings"].dtype == np.float32


def test_a_models_own_memory_is_reported(tmp_path, monkeypatch):
    """``own_bytes`` (``nlmfeature info``'s memory_bytes): the rows' huge-page copies plus the
    direct weights' store (by lines: the non-zero weights beside their bits); a float16
    file's rows and store take half the bytes or less, and with ``NLMFEATURE_HUGE_PAGES=0``
    the rows are read from the page cache and not counted."""
    monkeypatch.setenv("NLMFEATURE_HUGE_PAGES", "1")
    path = make_model(tmp_path, tables=False, word_width=320, direct_order=3, hash_space=1 << 20)
    header, arrays, _ = modelfile.read_model(path)
    arrays = {k: np.array(v) for k, v in arrays.items()}
    arrays["direct.weights"][np.arange(1 << 20) % 3 != 0] = 0.0     # (one in three kept)
    nlmfeature.save(path, header, arrays)
    half = str(tmp_path / "half.nlm")
    nlmfeature.save(half, header, arrays, half=True)
    rows = arrays["embeddings"].nbytes + arrays["output.weight"].nbytes
    gshift, _, store = _direct_store_layout(arrays["direct.weights"])
    assert gshift > 0 and 2 << 20 <= store < 4 << 20   # (by lines: less than the dense 4 MB)
    full = nlmfeature.load(path).native
    assert full.copied_bytes == rows + store   # (the store on huge pages too)
    assert rows + store <= full.own_bytes < rows + store + (1 << 20)
    from nlmfeature._scorer import HALF_ROWS

    if HALF_ROWS:            # (a build without F16C widens the halves)
        store_h = _direct_store_layout(arrays["direct.weights"].astype(np.float16))[2]
        assert store_h <= store
        halves = nlmfeature.load(half).native
        assert rows // 2 + store_h <= halves.own_bytes < rows // 2 + store_h + (1 << 20)
    monkeypatch.setenv("NLMFEATURE_HUGE_PAGES", "0")
    assert nlmfeature.load(path).native.own_bytes < store + (1 << 20)


def test_only_a_model_files_mapping_is_released(tmp_path):
    """Releasing pages (MADV_DONTNEED) zeroes anonymous memory: a model built over arrays of
    the process's own, on huge pages as a training run's parameters are, keeps every value
    (its direct weights are read for their packed copy as a file's are)."""
    from nlmfeature.core.model import Model
    from nlmfeature.training import arrays as training_arrays

    path = make_model(tmp_path, tables=False, word_width=320, direct_order=3, hash_space=1 << 20)
    header, mapped, checksum = modelfile.read_model(path)
    own = {k: training_arrays.copy(np.asarray(v)) for k, v in mapped.items()}
    assert modelfile.in_huge_buffer(own["direct.weights"]) and not modelfile.file_backed(own["direct.weights"])
    modelfile.release_pages(own["embeddings"])
    for hot in (True, False):
        model = Model(path, header, own, checksum, hot_copies=hot)
        for name in ("embeddings", "output.weight", "direct.weights"):
            assert np.array_equal(own[name], mapped[name]), name
        line = read_lines(BROWN_VALID, 1)[0].split()
        assert np.array_equal(model.score_sentence(line), nlmfeature.load(path).score_sentence(line))


@pytest.mark.skipif(shutil.which("objdump") is None or platform.machine() != "x86_64",
                    reason="needs objdump on x86-64")
def test_span_prefetch_is_compiled_in():
    """The C API's span scoring starts the loads of every word's n-gram cache slot before it
    scores the first (nlm_prefetch_clean).  A prefetch has no effect a test can observe, and
    gcc once compiled that function to a bare ``ret`` (it inferred the helper pure and dropped
    the call whose result was unused: Moses decodes 4-5% slower, same scores).  So look at the
    machine code of the built extension: the function, or one it calls (an unoptimised build,
    as the sanitizers', keeps its helpers out of line), must hold a prefetch instruction."""
    import nlmfeature._scorer as scorer
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", scorer.__file__],
                         capture_output=True, text=True, check=True).stdout
    bodies = dict(re.findall(r"<([^>\n]+)>:\n(.*?)(?:\n\n|\Z)", out, re.S))
    start = "__pyx_f_10nlmfeature_7_scorer_nlm_prefetch_clean"
    assert start in bodies, "nlm_prefetch_clean not found in the extension's symbols"
    seen, todo = set(), [(start, 0)]
    while todo:
        name, depth = todo.pop()
        if name in seen or name not in bodies:
            continue
        seen.add(name)
        if re.search(r"\tprefetch", bodies[name]):
            return
        if depth < 3:
            todo += [(callee, depth + 1) for callee in re.findall(r"\tcall\s+\S+ <([^>+]+)>", bodies[name])]
    pytest.fail(f"no prefetch instruction in {start} or the functions it calls: {sorted(seen)}")


@pytest.mark.parametrize("output", ["unnormalised", "class"])
@pytest.mark.parametrize("kept", [0.02, 0.07, 0.3, 0.9])
def test_direct_weights_read_from_their_store(tmp_path, output, kept):
    """The scorer reads a direct feature's weight from its store: by lines of 16-256 indices
    (each line's non-zero bits, its spill base and as many of its weights as fit, the rest
    spilled after the lines) or, with few weights zero, dense.  With ``kept`` of the weights
    non-zero at random, an empty stretch and a full one (whose lines spill), edges of lines,
    in a hash space that is no multiple of a line, every score equals the reference over the
    whole table, in every session kind."""
    from nlmfeature.core.modelfile import read_model
    extra = dict(classes=13) if output == "class" else {}
    path = make_model(tmp_path, name="dense.nlm", output=output, order=4, direct_order=3,
                      hash_space=50021, **extra)
    header, arrays, _ = read_model(path)
    arrays = dict(arrays)
    rng = np.random.default_rng(7)
    w = 4.0 * rng.standard_normal(50021).astype(np.float32)  # large: a wrong weight shows
    keep = rng.random(50021) < kept
    keep[1024:1536] = False                                      # empty lines
    keep[2304:2336] = True                                       # full lines
    keep[[0, 15, 16, 63, 64, 127, 128, 255, 256, 511, 512, 513, 2047, 2048, 4607, 4608, 50020]] = True
    arrays["direct.weights"] = np.where(keep, w, 0).astype(np.float32)
    gshift, spilled, _ = _direct_store_layout(arrays["direct.weights"])
    assert (gshift == 0) == (kept == 0.9)
    assert (spilled > 0) == (kept != 0.9), (gshift, spilled)
    sparse = str(tmp_path / "sparse.nlm")
    nlmfeature.save(sparse, header, arrays)
    model = _check_against_reference(sparse)
    assert model.native is not None
    lines = [l.split() for l in read_lines(BROWN_VALID, 8)]
    h, a = model.header, model.arrays
    grams = [model.sentence_ngrams(line) for line in lines]
    wants = [[logprob(h, a, [int(i) for i in c], int(x)) for c, x in zip(ctx, words)] for ctx, words in grams]
    for entries, terms in ((1 << 16, True), (0, True), (1 << 16, False), (0, False)):
        sess = model.session(entries, position_terms=terms)
        for k, ((ctx, words), want) in enumerate(zip(grams, wants)):
            sess.begin_sentence(k)
            got = sess.score_padded(ctx, words)
            assert np.allclose(got, want, atol=1e-5, rtol=1e-5), (entries, terms, k)
    # a float16 file's store (its own layout: halves, more to a line) holds the same halves
    half = str(tmp_path / "half.nlm")
    nlmfeature.save(half, header, arrays, half=True)
    halves = nlmfeature.load(half)
    widened = {k: np.asarray(v, dtype=np.float32) if v.dtype == np.float16 else v for k, v in halves.arrays.items()}
    sess = halves.session()
    for k, (ctx, words) in enumerate(grams):
        sess.begin_sentence(k)
        want = [logprob(h, widened, [int(i) for i in c], int(x)) for c, x in zip(ctx, words)]
        assert np.allclose(sess.score_padded(ctx, words), want, atol=1e-3, rtol=0), k  # (a wrong weight: ~4)
