"""Decoder query logs: recorded by the C-API session layer, packed, replayed on other models."""
from __future__ import annotations

import glob
import lzma
import os

import numpy as np
import pytest

import nlmfeature
from nlmfeature.decoder import querylog
from nlmfeature.errors import NLMFeatureError
from nlmfeature.decoder.pcache import CachedScorer

from helpers import BROWN_VALID, make_model, read_lines


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A real recording: a scorer session of the C-API layer with NLMFEATURE_QUERY_LOG set."""
    d = tmp_path_factory.mktemp("qlog")
    model = nlmfeature.load(make_model(d, "rec.nlm", order=4, output="class", classes=20, min_count=3))
    lines = [l.split() for l in read_lines(BROWN_VALID, 12)]
    os.environ["NLMFEATURE_QUERY_LOG"] = str(d / "log")
    try:
        scorer = CachedScorer(model)
    finally:
        del os.environ["NLMFEATURE_QUERY_LOG"]
    for sid, toks in enumerate(lines):
        scorer.begin(100 + sid)
        scorer.score_sentence(toks)
        scorer.end()
    del scorer  # closes the log
    (raw,) = glob.glob(str(d / "log" / "queries.*.bin"))
    return model, lines, raw, d


def test_raw_log_holds_every_lookup_in_order(recorded):
    model, lines, raw, _ = recorded
    log = querylog.read_raw(raw, model.vocab.words)
    assert list(log.sentence_ids) == [100 + i for i in range(len(lines))]
    for i, toks in enumerate(lines):
        ctx, words = model.sentence_ngrams(toks)
        a = log.sentence_starts[i]
        rows = log.ids[a:a + len(words)]
        assert np.array_equal(rows[:, :-1], ctx) and np.array_equal(rows[:, -1], words)
    assert log.lookups == sum(len(model.sentence_ngrams(t)[1]) for t in lines)


def test_pack_and_replay_on_another_model(recorded):
    model, lines, raw, d = recorded
    log = querylog.read_raw(raw, model.vocab.words)
    out = str(d / "rec.qlog.xz")
    querylog.pack(log.head(5), out, note="test")
    back = querylog.read_packed(out)
    assert back.note == "test" and back.lookups == log.head(5).lookups
    assert np.array_equal(back.ids, log.head(5).ids)
    # same model: the same ids, and replaying gives the scores the recorded session gave
    ctx, words, starts = querylog.map_to_model(back, model)
    assert np.array_equal(words, back.ids[:, -1]) and np.array_equal(ctx, back.ids[:, :-1])
    want = np.concatenate([model.score_sentence(t) for t in lines[:5]])
    assert np.allclose(model.session().score_padded(ctx, words), want, atol=1e-6)
    # another vocabulary and a lower order: the same words, the last n-1 context words
    other = nlmfeature.load(make_model(d, "other.nlm", order=3, min_count=6, seed=4))
    ctx3, words3, starts3 = querylog.map_to_model(back, other)
    assert ctx3.shape == (back.lookups, 2) and np.array_equal(starts3, back.sentence_starts)
    rec_words = np.asarray(model.vocab.words, dtype=object)
    oth_words = np.asarray(other.vocab.words, dtype=object)
    want = [w if w in other.vocab else "<unk>" for w in rec_words[back.ids[:, -1]]]
    assert list(oth_words[words3]) == want
    want_ctx = [w if w in other.vocab else "<unk>" for w in rec_words[back.ids[:, 2]]]
    assert list(oth_words[ctx3[:, 1]]) == want_ctx
    s = other.session()
    assert np.isfinite(s.score_stream(ctx3, words3, starts3))
    # a higher order than recorded is refused
    big = nlmfeature.load(make_model(d, "big.nlm", order=5, min_count=6))
    with pytest.raises(NLMFeatureError, match="order"):
        querylog.map_to_model(back, big)


def test_bundled_moses_stream_matches_its_header():
    log = querylog.read_packed(querylog.BUNDLED_MOSES_STREAM)
    assert log.order == 5 and len(log.sentence_starts) == 4
    assert log.lookups == int(log.sentence_lengths().sum()) > 1_000_000
    f = querylog.distinct_fractions(log)
    # a real decoder repeats itself: most lookups are exact repeats within the sentence
    assert 0.05 < f["contexts"] < f["ngrams"] < 0.5


def test_bad_logs_are_clear_errors(recorded, tmp_path):
    model, _, raw, _ = recorded
    data = open(raw, "rb").read()
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"XXXXXXXX" + data[8:])
    with pytest.raises(NLMFeatureError, match=r"bad\.bin: not an nlmfeature query log"):
        querylog.read_raw(str(bad), model.vocab.words)
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[:-3])
    with pytest.raises(NLMFeatureError, match=r"cut\.bin: truncated"):
        querylog.read_raw(str(cut), model.vocab.words)
    with pytest.raises(NLMFeatureError, match="vocabulary of"):
        querylog.read_raw(raw, model.vocab.words[:-1])
    xz = tmp_path / "x.qlog.xz"
    xz.write_bytes(lzma.compress(b"junk")[:-4])
    with pytest.raises(NLMFeatureError, match=r"x\.qlog\.xz: corrupt"):
        querylog.read_packed(str(xz))


def test_replay_tool_runs_a_tuning_loop_through_the_persistent_cache(recorded, tmp_path):
    """benchmarks/replay_querylog.py --persistent-cache: one stream per tuning iteration, each scored
    with and without the cache (carried over), then the last again; the cached scores are the
    uncached ones and the second iteration reads what the first wrote (each cached pass of
    the two repeats on a copy of the directory as the iteration found it)."""
    import importlib.util
    import json
    model, lines, raw, d = recorded
    spec = importlib.util.spec_from_file_location(
        "replay_querylog", os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "replay_querylog.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    log = querylog.read_raw(raw, model.vocab.words)
    first, second = str(tmp_path / "it1.qlog.xz"), str(tmp_path / "it2.qlog.xz")
    querylog.pack(log.head(6), first)
    querylog.pack(log.head(4), second)
    out = str(tmp_path / "loop.json")
    rc = tool.main([model.path, "--persistent-cache", str(tmp_path / "pc"), "--stream", first, "--stream", second,
                    "--repeats", "2", "--json", out])
    assert rc == 0
    rows = json.load(open(out))["rows"]
    assert [r["iteration"] for r in rows] == [1, 2, "unchanged"]
    assert all(r["same_scores"] for r in rows)
    assert rows[0]["disk_bytes"] > 0 and rows[0]["lookups"] == log.head(6).lookups
    # iteration 2 asks only n-grams iteration 1 wrote: nothing new, the directory does not grow
    assert rows[1]["disk_bytes"] == rows[0]["disk_bytes"] == rows[2]["disk_bytes"]
    with pytest.raises(SystemExit):
        tool.main([model.path, "--stream", first, "--stream", second])


def test_bench_query_times_warm_passes_after_an_untimed_first(tmp_path):
    """``bench query``'s rate is the median of the passes after a session's first (which grows
    its tables), at least three of them; the first pass is reported on its own."""
    from nlmfeature.bench.query import _timed
    model = nlmfeature.load(make_model(tmp_path, "q.nlm", order=5, output="class", classes=20, min_count=3))
    ctx, words, starts = querylog.load_stream(None, model, 1)
    ctx, words = ctx[:20000], words[:20000]
    sess = model.session(1 << 16, position_terms=True)
    warm, first = _timed(sess, ctx, words, starts[starts < 20000], 0.0)
    assert warm > 0 and first > 0
    st = sess.stats()
    assert st["lookups"] == 4 * len(words)  # the first pass and three timed ones
    assert st["ngram_hits"] > 0  # a decoder stream repeats itself within a sentence
