"""The persistent tuning cache from Python: nlmfeature.pcache.CachedScorer (exact scores,
round trips, threads sharing a directory, bounded disk use) and `nlmfeature cache`."""
from __future__ import annotations

import os
import subprocess
import threading
import time

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_VALID, make_model, read_lines
from nlmfeature.errors import NLMFeatureError
from nlmfeature.pcache import (CachedScorer, clear, directory_stats, parse_size, prune,
                               read_cache_file)

LINES = read_lines(BROWN_VALID, 80)


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("pcache_models")
    return {
        "unnormalised": make_model(d, "u.nlm", order=4),
        "class": make_model(d, "c.nlm", order=3, output="class", classes=20, seed=2),
        "softmax": make_model(d, "s.nlm", order=3, output="softmax", seed=4),
    }


def run_pass(scorer, lines, ids=None):
    out = []
    for i, line in enumerate(lines):
        scorer.begin(i if ids is None else ids[i])
        out.append(scorer.score_sentence(line))
        scorer.end()
    return out


@pytest.mark.parametrize("kind", ["unnormalised", "class", "softmax"])
def test_scores_equal_the_model_and_survive_a_round_trip(model_paths, tmp_path, kind):
    m = nlmfeature.load(model_paths[kind])
    want = [m.score_sentence(l) for l in LINES]
    first = run_pass(CachedScorer(m, tmp_path), LINES)
    s2 = CachedScorer(m, tmp_path)
    second = run_pass(s2, LINES)
    for a, b, w in zip(first, second, want):
        assert np.array_equal(a, b)
        np.testing.assert_allclose(a, w, atol=1e-6, rtol=0)
    st = s2.stats()
    assert st["persistent_hits"] == st["lookups"] == sum(len(w) for w in want)
    assert st["files_read"] == len(LINES) and st["files_written"] == 0


def test_without_directory_and_with_caches_off(model_paths):
    m = nlmfeature.load(model_paths["class"])
    want = [m.score_sentence(l) for l in LINES[:20]]
    for kw in ({}, {"ngram_entries": 0}, {"ngram_entries": 0, "cache_entries": 0}, {"ngram_entries": 7}):
        got = run_pass(CachedScorer(m, None, **kw), LINES[:20])
        for a, w in zip(got, want):
            np.testing.assert_allclose(a, w, atol=1e-6, rtol=0)


def test_bounded_ngram_table_still_scores_and_stores_what_fits(model_paths, tmp_path):
    m = nlmfeature.load(model_paths["unnormalised"])
    s = CachedScorer(m, tmp_path, ngram_entries=5)
    s.begin(0)
    got = s.score_sentence(LINES[0])
    s.end()
    np.testing.assert_allclose(got, m.score_sentence(LINES[0]), atol=1e-6, rtol=0)
    cf = read_cache_file(os.path.join(s.directory, "0.nlmc"))
    assert len(cf.scores) == 5


def test_file_contents_are_exact_ngrams(model_paths, tmp_path):
    m = nlmfeature.load(model_paths["unnormalised"])
    s = CachedScorer(m, tmp_path)
    run_pass(s, LINES[:5], ids=[10, 11, 12, 13, 14])
    for i, line in enumerate(LINES[:5]):
        cf = read_cache_file(os.path.join(str(tmp_path), m.checksum, f"{10 + i}.nlmc"))
        assert cf.sentence_id == 10 + i and cf.model_checksum == m.checksum and cf.key_len == m.order
        ctx, words = m.sentence_ngrams(line)
        exact = {tuple(c) + (w,): v for c, w, v in zip(ctx.tolist(), words.tolist(), m.score_sentence(line))}
        got = dict(zip(map(tuple, cf.keys.tolist()), cf.scores.tolist()))
        assert got.keys() == exact.keys()
        for k in got:
            assert got[k] == pytest.approx(exact[k], abs=1e-6)


def test_threads_sharing_a_directory_merge(model_paths, tmp_path):
    """Four threads, each with its own scorer, write the same sentences' files at once,
    each scoring a different quarter of the n-grams; every file ends up with all of them."""
    m = nlmfeature.load(model_paths["unnormalised"])
    sents = [m.sentence_ngrams(l) for l in LINES]
    errors = []

    def work(k):
        try:
            s = CachedScorer(m, tmp_path, quiet=True)
            for rep in range(2):
                for i, (ctx, words) in enumerate(sents):
                    s.begin(i)
                    s.score_padded(np.ascontiguousarray(ctx[k::4]), np.ascontiguousarray(words[k::4]))
                    s.end()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, (ctx, words) in enumerate(sents):
        cf = read_cache_file(os.path.join(str(tmp_path), m.checksum, f"{i}.nlmc"))
        assert {tuple(k) for k in cf.keys.tolist()} == {tuple(c) + (w,) for c, w in zip(ctx.tolist(), words.tolist())}
    assert not [f for f in os.listdir(os.path.join(str(tmp_path), m.checksum)) if f.endswith(".tmp")]


def test_corrupt_file_warns_and_is_rewritten(model_paths, tmp_path, capfd):
    m = nlmfeature.load(model_paths["unnormalised"])
    run_pass(CachedScorer(m, tmp_path), LINES[:3])
    p = os.path.join(str(tmp_path), m.checksum, "1.nlmc")
    data = bytearray(open(p, "rb").read())
    data[50] ^= 0xFF
    open(p, "wb").write(bytes(data))
    with pytest.raises(NLMFeatureError, match="checksum mismatch"):
        read_cache_file(p)
    s = CachedScorer(m, tmp_path)
    got = run_pass(s, LINES[:3])
    err = capfd.readouterr().err
    assert "1.nlmc: corrupted (checksum mismatch)" in err and "rewritten" in err
    np.testing.assert_allclose(got[1], m.score_sentence(LINES[1]), atol=1e-6, rtol=0)
    assert s.stats()["files_ignored"] == 1
    assert len(read_cache_file(p).scores) == len(got[1])


def test_disk_use_is_bounded_and_least_recently_used_files_go(model_paths, tmp_path):
    m = nlmfeature.load(model_paths["unnormalised"])
    # find the size of one pass, then bound the directory well below it
    run_pass(CachedScorer(m, tmp_path / "probe"), LINES)
    full = directory_stats(str(tmp_path / "probe")).bytes
    bound = full // 3
    d = tmp_path / "bounded"
    s = CachedScorer(m, d, max_bytes=bound, quiet=True)
    now = time.time()
    for i, line in enumerate(LINES):
        s.begin(i)
        s.score_sentence(line)
        s.end()
        # age the file as if written long ago, in order (mtime has 1 s resolution for LRU)
        path = os.path.join(s.directory, f"{i}.nlmc")
        if os.path.exists(path):
            os.utime(path, (now - 10000 + i, now - 10000 + i))
        # keep sentence 0 in use: loading it makes it the most recent
        s.begin(0)
        s.end()
    st = directory_stats(str(d))
    assert st.bytes <= bound
    assert s.stats()["files_pruned"] > 0
    assert os.path.exists(os.path.join(str(d), m.checksum, "0.nlmc"))      # recently used
    assert not os.path.exists(os.path.join(str(d), m.checksum, "1.nlmc"))  # old, unused
    left, removed = prune(str(d), st.bytes // 2)
    assert removed > 0 and left <= st.bytes // 2 * 0.8 + 1


def test_cache_command(model_paths, tmp_path):
    d = tmp_path / "pc"
    m = nlmfeature.load(model_paths["unnormalised"])
    run_pass(CachedScorer(m, d), LINES[:10])
    other = nlmfeature.load(model_paths["class"])
    run_pass(CachedScorer(other, d), LINES[:4])
    (d / "README.keep").write_text("not ours")
    out = subprocess.run(["nlmfeature", "cache", str(d), "--verify"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "files            14" in out.stdout and m.checksum in out.stdout and other.checksum in out.stdout
    bad = os.path.join(str(d), m.checksum, "2.nlmc")
    open(bad, "ab").write(b"x")
    out = subprocess.run(["nlmfeature", "cache", str(d), "--verify"], capture_output=True, text=True)
    assert out.returncode == 1 and "2.nlmc" in out.stdout
    out = subprocess.run(["nlmfeature", "cache", str(d), "--clear", "--model", model_paths["class"]],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "deleted 4 cache files" in out.stdout
    assert not os.path.exists(os.path.join(str(d), other.checksum))
    out = subprocess.run(["nlmfeature", "cache", str(d), "--clear"], capture_output=True, text=True)
    assert "deleted 10 cache files" in out.stdout
    assert sorted(os.listdir(d)) == ["README.keep"]
    assert directory_stats(str(d)).files == 0
    out = subprocess.run(["nlmfeature", "cache", str(tmp_path / "missing")], capture_output=True, text=True)
    assert out.returncode == 2 and "no such cache directory" in out.stderr


def test_unwritable_directory_is_an_error(model_paths, tmp_path):
    m = nlmfeature.load(model_paths["unnormalised"])
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OSError, match="cannot create the persistent cache directory"):
        CachedScorer(m, f / "sub")


def test_parse_size():
    assert parse_size("500M") == 500 << 20
    assert parse_size("2G") == 2 << 30
    assert parse_size("1024") == 1024
    assert parse_size("1.5KiB") == 1536
    with pytest.raises(NLMFeatureError):
        parse_size("lots")
    assert clear(os.devnull + "-nonexistent-dir") == 0
