"""The persistent tuning cache from Python: nlmfeature.decoder.pcache.CachedScorer (exact scores at
every level, round trips, deltas, threads and killed writers sharing a directory, FIFOs and junk,
changed models, the policy, bounded disk use) and `nlmfeature cache`."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import nlmfeature
from nlmfeature.errors import ModelFileError
from helpers import BROWN_VALID, cli_in_process, in_threads, make_model, read_lines
from nlmfeature.errors import NLMFeatureError
from nlmfeature.decoder.pcache import (MAX_DELTA_FILES, CachedScorer, bound_report, cache_files, clear,
                                      directory_stats, prune, read_cache_file, read_sentence,
                                      sentence_files)

LINES = read_lines(BROWN_VALID, 80)
# the command line of this checkout (not whatever `nlmfeature` is first on PATH)
NLM = [sys.executable, "-m", "nlmfeature.cli"]


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


def listing(directory, mtimes=False):
    """name -> (inode, size[, mtime_ns]) of every file under ``directory``."""
    out = {}
    for root, _, files in os.walk(directory):
        for f in files:
            st = os.stat(os.path.join(root, f))
            out[os.path.join(root, f)] = (st.st_ino, st.st_size) + ((st.st_mtime_ns,) if mtimes else ())
    return out


@pytest.mark.parametrize("terms", [False, True])
@pytest.mark.parametrize("kind", ["unnormalised", "class", "softmax"])
def test_scores_equal_the_model_and_survive_a_round_trip(model_paths, tmp_path, kind, terms):
    """(``terms``: a decoder's session, normalisers from position terms)"""
    m = nlmfeature.load(model_paths[kind])
    want = [m.score_sentence(l) for l in LINES]
    first = run_pass(CachedScorer(m, tmp_path, policy="always", position_terms=terms), LINES)
    before = listing(tmp_path)
    s2 = CachedScorer(m, tmp_path, policy="always", position_terms=terms)
    second = run_pass(s2, LINES)
    for a, b, w in zip(first, second, want):
        assert np.array_equal(a, b)
        np.testing.assert_allclose(a, w, atol=1e-6, rtol=0)
    st = s2.stats()
    assert st["persistent_hits"] == st["lookups"] == sum(len(w) for w in want)
    assert st["files_read"] == len(LINES) and st["files_written"] == 0
    assert listing(tmp_path) == before  # nothing new: nothing written (uses only touch the mtime)


@pytest.mark.parametrize("kind", ["class", "softmax"])
def test_context_normalisers_are_reused_for_new_ngrams(model_paths, tmp_path, kind, monkeypatch):
    """A second pass over changed sentences (as after a tuning step): n-grams never scored
    before get their context's normalisers (class: also within-class ones, which are written
    on request) from the files, and every score is still exact."""
    m = nlmfeature.load(model_paths[kind])
    run_pass(CachedScorer(m, tmp_path, class_normalisers=True), LINES)
    changed = [" ".join(reversed(l.split()[:3])) + " " + l for l in LINES]
    s = CachedScorer(m, tmp_path, class_normalisers=True)
    got = run_pass(s, changed)
    for g, line in zip(got, changed):
        np.testing.assert_allclose(g, m.score_sentence(line), atol=1e-6, rtol=0)
    st = s.stats()
    assert st["persistent_context_hits"] > 0 and st["persistent_hits"] > 0
    if kind == "class":
        assert st["persistent_class_hits"] > 0
    assert st["persistent_hits"] < st["lookups"]  # the new n-grams were computed...
    grams = [{tuple(c) + (w,) for c, w in zip(*(a.tolist() for a in m.sentence_ngrams(l)))} for l in LINES]
    new = [i for i, l in enumerate(changed)
           if {tuple(c) + (w,) for c, w in zip(*(a.tolist() for a in m.sentence_ngrams(l)))} - grams[i]]
    assert st["files_written"] == len(new) > len(LINES) // 2  # ...and written as deltas
    for i in range(len(LINES)):
        assert len(sentence_files(s.directory, i)) == (2 if i in new else 1)
    # the third pass finds everything on disk
    s3 = CachedScorer(m, tmp_path, class_normalisers=True)
    run_pass(s3, changed)
    assert s3.stats()["persistent_hits"] == s3.stats()["lookups"] and s3.stats()["files_written"] == 0


@pytest.mark.parametrize("kind", ["class", "softmax"])
def test_files_copied_into_the_table_at_begin_change_nothing(model_paths, tmp_path, kind, monkeypatch, capfd):
    """The n-grams of a sentence's files are copied into its n-gram table at sentence begin
    (no probe of the files at each n-gram's first lookup); probing the files lazily
    (``preload=False``) is the same cache: over a tuning-like loop (passes over
    changed sentences, deltas, a merge) the same scores, counters, per-sentence stats lines
    (n-grams found on disk) and file contents."""
    m = nlmfeature.load(model_paths[kind])
    monkeypatch.setenv("NLMFEATURE_CACHE_STATS", "1")
    passes = [LINES[:30]] + [[" ".join(l.split()[k:] + l.split()[:k]) for l in LINES[:30]] for k in (1, 2, 2)]
    runs = {}
    for preload in ("1", "0"):
        d = tmp_path / preload
        scores, stats = [], []
        for lines in passes:
            s = CachedScorer(m, d, preload=preload == "1")
            scores.append(run_pass(s, lines))
            stats.append(s.stats())
        lines = [l for l in capfd.readouterr().err.splitlines() if l.startswith("nlmfeature: cache sentence")]
        contents = [sorted(zip(map(tuple, f.keys.tolist()), f.scores.tolist()))
                    for f in (read_sentence(s.directory, i) for i in range(30))]
        runs[preload] = scores, stats, lines, contents
    (a, sa, la, ca), (b, sb, lb, cb) = runs["1"], runs["0"]
    for pa, pb in zip(a, b):
        for x, y in zip(pa, pb):
            assert np.array_equal(x, y)
    assert sa == sb
    assert la == lb
    assert ca == cb
    assert sa[-1]["persistent_hits"] == sa[-1]["lookups"] > 0  # the last pass repeats the third
    assert any(" ngrams_on_disk=0 " not in l for l in la[30:])


def test_base_file_unpacks_into_the_session_table(model_paths, tmp_path, monkeypatch):
    """At sentence begin the base file's n-grams are unpacked into the session's n-gram table
    itself (its region has a size the table takes: no hashing, no copy), the deltas' n-grams
    copied in beside them; where the deltas hold more than the base's room (after a MERT
    step), the base's are inserted into a table sized for all.  Every lookup of the
    sentence's n-grams is then a hit with the bits first computed.  Probing the files lazily
    leaves the table empty at begin."""
    m = nlmfeature.load(model_paths["class"])
    line = LINES[5]
    first = run_pass(CachedScorer(m, tmp_path), [line])[0]
    base = os.path.join(str(tmp_path), m.checksum, "0.nlmc")
    _, _, _, slots, count, _ = _regions(base)[0]
    assert 0 < count == len(read_cache_file(base).scores) <= len(first)
    s = CachedScorer(m, tmp_path)
    s.begin(0)
    assert s.ngram_table() == (slots, count)
    assert s.score_sentence(line).tolist() == first.tolist()
    s.end()
    assert s.stats()["persistent_hits"] == s.stats()["lookups"] == len(first)
    # a changed sentence adds a delta: its new n-grams are copied in beside the base's
    longer = line + " and the rest of it"
    s = CachedScorer(m, tmp_path)
    run_pass(s, [longer])
    delta = os.path.join(str(tmp_path), m.checksum, "0.1.nlmc")
    new = _regions(delta)[0][4]
    assert new > 0 and s.stats()["files_written"] == 1
    assert _regions(delta)[0][3] == _writer_slots(0, new, base=False) and slots == _writer_slots(0, count)
    s = CachedScorer(m, tmp_path)
    s.begin(0)
    assert s.ngram_table()[1] == count + new
    got = s.score_sentence(longer)
    s.end()
    assert got.tolist() == run_pass(CachedScorer(m, None), [longer])[0].tolist()
    assert s.stats()["persistent_hits"] == s.stats()["lookups"] and s.stats()["files_written"] == 0
    # deltas holding more n-grams than the base has room for (as after a MERT step): the
    # base's are inserted into the table at a size that holds all of them
    short = "the jury said"
    big = short + " " + " ".join(LINES[10:16])
    run_pass(CachedScorer(m, tmp_path), [short], ids=[7])
    run_pass(CachedScorer(m, tmp_path), [big], ids=[7])
    d = os.path.join(str(tmp_path), m.checksum)
    b7, d7 = _regions(os.path.join(d, "7.nlmc"))[0], _regions(os.path.join(d, "7.1.nlmc"))[0]
    assert 2 * (b7[4] + d7[4]) > b7[3]
    s = CachedScorer(m, tmp_path)
    s.begin(7)
    assert s.ngram_table()[1] == b7[4] + d7[4] and s.ngram_table()[0] >= 2 * (b7[4] + d7[4])
    assert s.score_sentence(big).tolist() == run_pass(CachedScorer(m, None), [big])[0].tolist()
    s.end()
    assert s.stats()["persistent_hits"] == s.stats()["lookups"] and s.stats()["files_written"] == 0
    s = CachedScorer(m, tmp_path, preload=False)
    s.begin(0)
    assert s.ngram_table()[1] == 0
    assert s.score_sentence(longer).tolist() == got.tolist()
    s.end()


def test_without_directory_and_with_caches_off(model_paths):
    m = nlmfeature.load(model_paths["class"])
    want = [m.score_sentence(l) for l in LINES[:20]]
    for kw in ({}, {"ngram_entries": 0}, {"ngram_entries": 0, "cache_entries": 0}, {"ngram_entries": 7}):
        got = run_pass(CachedScorer(m, None, **kw), LINES[:20])
        for a, w in zip(got, want):
            np.testing.assert_allclose(a, w, atol=1e-6, rtol=0)


def test_bounded_ngram_table_still_scores_and_stores_what_fits(model_paths, tmp_path):
    m = nlmfeature.load(model_paths["class"])
    s = CachedScorer(m, tmp_path, ngram_entries=5)
    s.begin(0)
    got = s.score_sentence(LINES[0])
    s.end()
    np.testing.assert_allclose(got, m.score_sentence(LINES[0]), atol=1e-6, rtol=0)
    cf = read_cache_file(os.path.join(s.directory, "0.nlmc"))
    assert len(cf.scores) == 5


def test_file_contents_are_exact(model_paths, tmp_path, monkeypatch):
    m = nlmfeature.load(model_paths["class"])
    s = CachedScorer(m, tmp_path)
    run_pass(s, LINES[:2], ids=[20, 21])
    assert not len(read_cache_file(os.path.join(s.directory, "20.nlmc")).class_keys)  # by default
    s = CachedScorer(m, tmp_path, class_normalisers=True)
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
        # one class normaliser per distinct context, one within-class normaliser per (context, class)
        assert {tuple(c) for c in cf.context_keys.tolist()} == {tuple(c) for c in ctx.tolist()}
        assert np.isfinite(cf.context_norms[:, 1]).all() and np.isnan(cf.context_norms[:, 0]).all()
        classes = m.arrays["class.of_word"][words]
        assert {tuple(k) for k in cf.class_keys.tolist()} == \
            {tuple(c) + (int(k),) for c, k in zip(ctx.tolist(), classes)}


def test_threads_sharing_a_directory_merge(model_paths, tmp_path):
    """Four threads, each with its own scorer, write the same sentences' files at once,
    each scoring a different quarter of the n-grams; every sentence ends up with all of them."""
    m = nlmfeature.load(model_paths["class"])
    sents = [m.sentence_ngrams(l) for l in LINES]

    def work(k):
        s = CachedScorer(m, tmp_path, quiet=True)
        for rep in range(2):
            for i, (ctx, words) in enumerate(sents):
                s.begin(i)
                s.score_padded(np.ascontiguousarray(ctx[k::4]), np.ascontiguousarray(words[k::4]))
                s.end()

    assert not in_threads(work)
    d = os.path.join(str(tmp_path), m.checksum)
    for i, (ctx, words) in enumerate(sents):
        cf = read_sentence(d, i)
        assert {tuple(k) for k in cf.keys.tolist()} == {tuple(c) + (w,) for c, w in zip(ctx.tolist(), words.tolist())}
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")]


def test_threads_sharing_a_bounded_directory(model_paths, tmp_path):
    """Four threads, each with its own scorer, score the sentences in the same order three
    times in a directory bounded below one pass: exact scores, valid files only, and the
    directory within the bound give or take the files the others wrote since a writer last
    looked (each session keeps its own estimate)."""
    m = nlmfeature.load(model_paths["class"])
    run_pass(CachedScorer(m, tmp_path / "probe"), LINES)
    one = max(os.path.getsize(p) for _, p in cache_files(str(tmp_path / "probe")))
    bound = directory_stats(str(tmp_path / "probe")).bytes // 3
    d = tmp_path / "bounded"
    want = [m.score_sentence(line) for line in LINES]

    def work(k):
        for rep in range(3):
            s = CachedScorer(m, d, max_bytes=bound, quiet=True)
            for i in range(k * 7 % len(LINES), len(LINES)):
                s.begin(i)
                np.testing.assert_allclose(s.score_sentence(LINES[i]), want[i], atol=1e-6, rtol=0)
                s.end()

    assert not in_threads(work)
    st = directory_stats(str(d), verify=True)
    assert not st.invalid and st.temporary_files == 0
    assert 0 < st.bytes <= bound + 4 * one


def test_deltas_are_merged_into_the_base(model_paths, tmp_path):
    """Each pass adds new n-grams; after the delta names are used up, the next writer merges
    base + deltas + its entries into one base; the union never loses an entry."""
    m = nlmfeature.load(model_paths["class"])
    seen = set()
    for rep in range(MAX_DELTA_FILES + 3):
        line = " ".join(LINES[0].split()[: 3 + 2 * rep])
        s = CachedScorer(m, tmp_path)
        got = run_pass(s, [line])[0]
        np.testing.assert_allclose(got, m.score_sentence(line), atol=1e-6, rtol=0)
        ctx, words = m.sentence_ngrams(line)
        seen |= {tuple(c) + (w,) for c, w in zip(ctx.tolist(), words.tolist())}
        files = sentence_files(s.directory, 0)
        assert 1 <= len(files) <= MAX_DELTA_FILES + 1
        assert {tuple(k) for k in read_sentence(s.directory, 0).keys.tolist()} == seen
    assert len(sentence_files(s.directory, 0)) < MAX_DELTA_FILES + 1  # a merge happened


def test_corrupt_file_warns_and_is_rewritten(model_paths, tmp_path, capfd):
    m = nlmfeature.load(model_paths["class"])
    run_pass(CachedScorer(m, tmp_path), LINES[:3])
    p = os.path.join(str(tmp_path), m.checksum, "1.nlmc")
    data = bytearray(open(p, "rb").read())
    data[-50] ^= 0xFF
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


def test_file_truncated_or_overwritten_while_in_use_cannot_fault_the_decoder(model_paths, tmp_path):
    """A cache file cut short or scribbled over in place (``truncate``, a disk tool) after a
    sentence began with it: the session reads its files into memory at sentence begin, so
    the lookups keep their exact scores.  (A mapping of the file would raise SIGBUS on the
    pages past the new end and kill the decoder: run in a child process.)"""
    m = nlmfeature.load(model_paths["class"])
    text = " ".join(LINES[:40])  # a file of several pages
    run_pass(CachedScorer(m, tmp_path, policy="always"), [LINES[0], text])
    p = os.path.join(str(tmp_path), m.checksum, "1.nlmc")
    assert os.path.getsize(p) > 16 << 10
    code = f"""
import os, sys, numpy as np, nlmfeature
from nlmfeature.decoder.pcache import CachedScorer
m = nlmfeature.load({model_paths["class"]!r})
s = CachedScorer(m, {str(tmp_path)!r}, policy="always")
s.begin(1)
size = os.path.getsize({p!r})
with open({p!r}, "r+b") as f:
    f.write(b"\\xff" * (size // 2))
os.truncate({p!r}, 0)
got = s.score_sentence({text!r})
s.end()
want = m.score_sentence({text!r})
print(s.stats()["persistent_hits"], len(want), float(np.abs(got - want).max()))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    hits, n, diff = r.stdout.split()
    assert int(hits) == int(n) > 0 and float(diff) <= 1e-6


def _rewrite_header(path, fields):
    """Patch little-endian header fields ({offset: (format, value)}) and re-seal the header
    checksum: a well-formed header that says something else."""
    import struct
    from nlmfeature._pcache import header_checksum
    data = bytearray(open(path, "rb").read())
    for at, (fmt, value) in fields.items():
        struct.pack_into(fmt, data, at, value)
    struct.pack_into("<Q", data, 184, header_checksum(bytes(data[:184])))
    open(path, "wb").write(bytes(data))


def test_ngram_filter_is_checked_and_older_files_are_rewritten(model_paths, tmp_path, capfd):
    """Version 4 files end with a filter of each region's keys (header bytes 144..167: their
    64-byte blocks).  A header whose filter does not fit the file is refused; a version 3
    file (no filter) is ignored with a warning and rewritten; scores stay exact throughout,
    and n-grams in none of a sentence's files are still found in none (new ones computed)."""
    import struct
    m = nlmfeature.load(model_paths["class"])
    run_pass(CachedScorer(m, tmp_path), LINES[:2])
    p = os.path.join(str(tmp_path), m.checksum, "1.nlmc")
    data = open(p, "rb").read()
    blocks, ctx_blocks, class_blocks = struct.unpack_from("<3Q", data, 144)
    f = read_cache_file(p)
    assert blocks == (len(f.scores) * 10 + 511) // 512 and blocks > 0
    assert ctx_blocks == (len(f.context_norms) * 10 + 511) // 512 and ctx_blocks > 0
    assert class_blocks == 0 and len(f.class_norms) == 0  # within-class normalisers: not written
    good = data
    _rewrite_header(p, {144: ("<Q", blocks + 1)})
    with pytest.raises(NLMFeatureError, match="size does not match|inconsistent"):
        read_cache_file(p)
    open(p, "wb").write(good)
    _rewrite_header(p, {8: ("<I", 3)})
    with pytest.raises(NLMFeatureError, match="another cache format version"):
        read_cache_file(p)
    capfd.readouterr()
    s = CachedScorer(m, tmp_path)
    longer = [LINES[0], LINES[1] + " and the rest"]
    got = run_pass(s, longer)
    assert "1.nlmc: written by another cache format version" in capfd.readouterr().err
    for line, g in zip(longer, got):
        np.testing.assert_allclose(g, m.score_sentence(line), atol=1e-6, rtol=0)
    assert s.stats()["files_ignored"] == 1
    # sentence 0 read its file (every n-gram found), sentence 1's was rewritten with all of its
    assert read_cache_file(p).keys.shape[0] == len(got[1])
    again = CachedScorer(m, tmp_path)
    assert [g.tolist() for g in run_pass(again, longer)] == [g.tolist() for g in got]
    assert again.stats()["persistent_hits"] == sum(len(g) for g in got)


_PROBE = """
import os, sys, resource
import nlmfeature
from nlmfeature.decoder.pcache import CachedScorer
def rchar():
    for line in open("/proc/self/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])
m = nlmfeature.load(sys.argv[1])
s = CachedScorer(m, sys.argv[2])
before = rchar()
for sid in (0, 1):
    s.begin(sid)
    s.score_sentence("the jury said")
    s.end()
print("READ", rchar() - before, "IGNORED", s.stats()["files_ignored"])
"""


def test_fifo_and_huge_junk_files_do_not_hang_or_get_read(model_paths, tmp_path):
    """A FIFO named like a cache file must not block ``begin``; a multi-GB
    junk file must be rejected by its header, not read whole."""
    m = nlmfeature.load(model_paths["class"])
    d = tmp_path / "pc" / m.checksum
    d.mkdir(parents=True)
    os.mkfifo(d / "0.nlmc")
    with open(d / "1.nlmc", "wb") as f:  # 3 GB, sparse
        f.write(b"junk" * 16)
        f.truncate(3 << 30)
    p = subprocess.run([sys.executable, "-c", _PROBE, model_paths["class"], str(tmp_path / "pc")],
                       capture_output=True, text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(nlmfeature.__file__)))
    assert p.returncode == 0, p.stderr
    assert "0.nlmc: not a regular file" in p.stderr
    assert "1.nlmc: not an nlmfeature cache file" in p.stderr
    read = int(p.stdout.split()[1])
    assert read < (1 << 20), f"read {read} bytes"
    assert p.stdout.split()[3] == "2"
    # both were replaced by valid files at sentence end (the FIFO by a regular file)
    assert read_cache_file(str(d / "0.nlmc")).sentence_id == 0
    assert os.path.getsize(d / "1.nlmc") < (1 << 20)


def test_model_changed_under_a_running_process_is_never_cached(model_paths, tmp_path, capfd):
    """The cache's half: a model file overwritten in place keeps its old
    checksum in the session: nothing is written or read under it any more, and the user is told."""
    live = tmp_path / "live.nlm"
    shutil.copyfile(model_paths["class"], live)
    other = make_model(tmp_path, "other.nlm", order=3, output="class", classes=20, seed=9)
    assert os.path.getsize(other) == os.path.getsize(live)
    m = nlmfeature.load(str(live))
    s = CachedScorer(m, tmp_path / "pc")
    run_pass(s, LINES[:2])
    assert s.stats()["files_written"] == 2
    time.sleep(0.01)
    with open(other, "rb") as src, open(live, "r+b") as dst:  # cp other.nlm live.nlm
        dst.write(src.read())
    before = listing(tmp_path / "pc", mtimes=True)
    # the core session notices at the sentence start (nlm_model_file_changed) and refuses to
    # go on; the persistent cache reads and writes nothing under the old checksum
    for sid in (5, 0):
        with pytest.raises(ModelFileError, match="changed in place"):
            s.begin(sid)
        assert math.isnan(s.score_padded(np.ones((1, m.order - 1), dtype=np.int32),
                                         np.array([5], dtype=np.int32))[0])
        s.end()
    assert s.stats()["files_written"] == 2 and s.stats()["files_read"] == 0
    assert listing(tmp_path / "pc", mtimes=True) == before  # not even read


def test_policy_skips_models_faster_than_a_probe(model_paths, tmp_path, capfd, monkeypatch):
    u = nlmfeature.load(model_paths["unnormalised"])
    s = CachedScorer(u, tmp_path / "a")
    assert not s.persistent and s.directory is None
    run_pass(s, LINES[:2])
    assert not os.path.exists(tmp_path / "a" / u.checksum)
    err = capfd.readouterr().err
    assert "persistent cache" in err and "not used" in err and "NLMFEATURE_PERSISTENT_CACHE=always" in err
    assert CachedScorer(u, tmp_path / "a", policy="always").persistent
    monkeypatch.setenv("NLMFEATURE_PERSISTENT_CACHE", "always")
    assert CachedScorer(u, tmp_path / "a").persistent
    c = nlmfeature.load(model_paths["class"])
    assert CachedScorer(c, tmp_path / "a").persistent
    monkeypatch.setenv("NLMFEATURE_PERSISTENT_CACHE", "never")
    assert not CachedScorer(c, tmp_path / "a").persistent
    with pytest.raises(ValueError, match="policy"):
        CachedScorer(c, tmp_path / "a", policy="sometimes")


_WRITER = """
import sys
import nlmfeature
from nlmfeature.decoder.pcache import CachedScorer
m = nlmfeature.load(sys.argv[1])
s = CachedScorer(m, sys.argv[2], quiet=True)
lines = open(sys.argv[3]).read().splitlines()
print("ready", flush=True)
rep = 0
while True:
    for i, line in enumerate(lines):
        s.begin(i)
        s.score_sentence(line + " x" * rep)
        s.end()
    rep += 1
"""


def test_kill_9_mid_write_leaves_only_valid_files(model_paths, tmp_path):
    """Writers killed at arbitrary moments (SIGKILL) never leave a partial file under a
    cache name; the next run scores exactly and pruning removes the stale temporary files."""
    text = tmp_path / "text.txt"
    text.write_text("\n".join(LINES[:20]) + "\n")
    d = tmp_path / "pc"
    root = os.path.dirname(os.path.dirname(nlmfeature.__file__))
    for delay in (0.3, 0.5, 0.7, 0.9):
        p = subprocess.Popen([sys.executable, "-c", _WRITER, model_paths["class"], str(d), str(text)],
                             stdout=subprocess.PIPE, cwd=root)
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        p.kill()
        p.wait()
    m = nlmfeature.load(model_paths["class"])
    sub = os.path.join(str(d), m.checksum)
    names = os.listdir(sub)
    assert [n for n in names if n.endswith(".nlmc")]
    for n in names:
        if n.endswith(".nlmc"):
            read_cache_file(os.path.join(sub, n))  # raises if any is partial or corrupt
    s = CachedScorer(m, d)
    got = run_pass(s, LINES[:20])
    for g, line in zip(got, LINES[:20]):
        np.testing.assert_allclose(g, m.score_sentence(line), atol=1e-6, rtol=0)
    assert s.stats()["files_ignored"] == 0
    prune(str(d), 1)
    assert not [n for n in os.listdir(sub) if n.endswith(".tmp")]


def test_disk_use_is_bounded_and_least_recently_used_files_go(model_paths, tmp_path):
    m = nlmfeature.load(model_paths["unnormalised"])
    # find the size of one pass, then bound the directory well below it
    run_pass(CachedScorer(m, tmp_path / "probe", policy="always"), LINES)
    full = directory_stats(str(tmp_path / "probe")).bytes
    bound = full // 3
    d = tmp_path / "bounded"
    s = CachedScorer(m, d, max_bytes=bound, quiet=True, policy="always")
    now = time.time()
    for i, line in enumerate(LINES):
        s.begin(i)
        s.score_sentence(line)
        s.end()
        # age the file as if written two days ago, in order: files unused for a day go
        # least recently used first
        path = os.path.join(s.directory, f"{i}.nlmc")
        if os.path.exists(path):
            os.utime(path, (now - 200000 + i, now - 200000 + i))
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


def test_a_bound_below_one_pass_keeps_the_first_sentences_up_to_date(model_paths, tmp_path):
    """A tuning loop reads its sentences in the same order at every iteration, each iteration a
    new decoder run.  With a bound below one iteration's files, deleting the least recently used
    file deletes the one the loop needs next: no file would survive to the next iteration.  A
    run writes only what fits instead: the first sentences keep their files, the others get
    none, and where new entries do not fit, a sentence's working set replaces its files."""
    m = nlmfeature.load(model_paths["unnormalised"])
    run_pass(CachedScorer(m, tmp_path / "probe", policy="always"), LINES)
    bound = directory_stats(str(tmp_path / "probe")).bytes // 3
    d = tmp_path / "bounded"
    sub = os.path.join(str(d), m.checksum)
    run_pass(CachedScorer(m, d, max_bytes=bound, quiet=True, policy="always"), LINES)
    kept = sorted(int(n.split(".")[0]) for n in os.listdir(sub) if n.endswith(".nlmc"))
    assert directory_stats(str(d)).bytes <= bound
    # the first sentences (and later ones small enough for what room was left)
    assert len(LINES) // 5 <= len(kept) < len(LINES) and set(range(len(kept) * 3 // 4)) <= set(kept)
    # the next iterations: partly the same n-grams, partly new ones (a little fewer in all)
    def mix(a, b):
        a, b = a.split(), b.split()
        return " ".join(a[:len(a) // 2] + b[len(b) // 2:len(b) // 2 + len(a) // 3])
    lines2 = [mix(a, b) for a, b in zip(LINES, LINES[1:] + LINES[:1])]
    hits = []
    for _ in range(2):
        s = CachedScorer(m, d, max_bytes=bound, quiet=True, policy="always")
        got = run_pass(s, lines2)
        st = s.stats()
        assert st["files_read"] >= len(kept)
        hits.append(st["persistent_hits"])
        assert directory_stats(str(d)).bytes <= bound
        for g, line in zip(got, lines2):
            np.testing.assert_allclose(g, m.score_sentence(line), atol=1e-6, rtol=0)
        assert {int(n.split(".")[0]) for n in os.listdir(sub) if n.endswith(".nlmc")} >= set(kept)  # none lost
    # the second run of lines2 finds what the first computed (the files are up to date)
    assert hits[1] > hits[0] > 0


def test_a_tuning_run_is_told_when_the_cache_is_at_its_bound(model_paths, tmp_path):
    """The decoder's line on stderr (a real session's) makes `nlmfeature tune` say how many dev
    sentences have files and what bound would hold them all."""
    m = nlmfeature.load(model_paths["unnormalised"])
    run_pass(CachedScorer(m, tmp_path / "probe", policy="always"), LINES[:40])
    bound = directory_stats(str(tmp_path / "probe")).bytes // 4
    d = tmp_path / "bounded"
    log = tmp_path / "decoder.log"
    code = ("import sys, nlmfeature; from nlmfeature.decoder.pcache import CachedScorer\n"
            "m = nlmfeature.load(sys.argv[1]); s = CachedScorer(m, sys.argv[2], max_bytes=int(sys.argv[3]), "
            "policy='always')\n"
            "for i, line in enumerate(open(sys.argv[4]).read().splitlines()):\n"
            "    s.begin(i); s.score_sentence(line); s.end()\n")
    text = tmp_path / "dev.txt"
    text.write_text("\n".join(LINES[:40]) + "\n")
    root = os.path.dirname(os.path.dirname(nlmfeature.__file__))
    with open(log, "w") as err:
        subprocess.run([sys.executable, "-c", code, model_paths["unnormalised"], str(d), str(bound), str(text)],
                       stderr=err, check=True, cwd=root)
    note = bound_report(str(d), 40, str(log))
    kept = len([n for n in os.listdir(os.path.join(str(d), m.checksum)) if n.endswith(".nlmc")])
    assert note is not None and f"{kept} of 40 dev sentences have files" in note and "--persistent-cache-max" in note
    assert 0 < kept < 40
    log.write_text("nothing about the cache\n")
    assert bound_report(str(d), 40, str(log)) is None


def test_cache_command(model_paths, tmp_path, capsys):
    d = tmp_path / "pc"
    m = nlmfeature.load(model_paths["unnormalised"])
    run_pass(CachedScorer(m, d, policy="always"), LINES[:10])
    other = nlmfeature.load(model_paths["class"])
    run_pass(CachedScorer(other, d), LINES[:4])
    (d / "README.keep").write_text("not ours")
    status, out, err = cli_in_process(["cache", d, "--verify"], capsys)
    assert status == 0, err
    assert "files            14" in out and m.checksum in out and other.checksum in out
    bad = os.path.join(str(d), m.checksum, "2.nlmc")
    open(bad, "ab").write(b"x")
    status, out, _ = cli_in_process(["cache", d, "--verify"], capsys)
    assert status == 1 and "2.nlmc" in out
    status, out, _ = cli_in_process(["cache", d, "--clear", "--model", model_paths["class"]], capsys)
    assert status == 0 and "deleted 4 cache files" in out
    assert not os.path.exists(os.path.join(str(d), other.checksum))
    status, out, _ = cli_in_process(["cache", d, "--clear"], capsys)
    assert "deleted 10 cache files" in out
    assert sorted(os.listdir(d)) == ["README.keep"]
    assert directory_stats(str(d)).files == 0
    status, _, err = cli_in_process(["cache", tmp_path / "missing"], capsys)
    assert status == 2 and "no such cache directory" in err


def test_unwritable_directory_is_an_error(model_paths, tmp_path):
    m = nlmfeature.load(model_paths["class"])
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(OSError, match="cannot create the persistent cache directory"):
        CachedScorer(m, f / "sub")


def test_clear_of_a_missing_directory_deletes_nothing():
    assert clear(os.devnull + "-nonexistent-dir") == 0


def _regions(path):
    """(key length, bytes per id, doubles, slots, entries, longest probe) of each region."""
    import struct
    data = open(path, "rb").read(192)
    return [struct.unpack_from("<HHIQQQ", data, 40 + 32 * i) for i in range(3)]


def _writer_slots(region, count, base=True):
    """Slots the writer gives a region of ``count`` entries (readers refuse other sizes): a
    base file's n-gram region the least power of two >= 4 x count (a size the session's table
    takes), other regions and delta files' count / 0.7 + 1."""
    if not count:
        return 0
    if region == 0 and base:
        return 1 << (4 * count - 1).bit_length()
    return (count * 100 + 69) // 70 + 1


def test_files_are_packed_and_read_back_exact(model_paths, tmp_path):
    """Format 5: a region is its slot map, then the live slots' keys (2 bytes per id where every
    id is below 65536) and values.  A file holds its entries in under half the bytes of the
    table layout they unpack into (version 4 wrote that layout itself), and a second pass reads
    every n-gram back with the same bits."""
    m = nlmfeature.load(model_paths["class"])
    lines = [" ".join(LINES[:30]), LINES[30]]
    first = run_pass(CachedScorer(m, tmp_path), lines)
    p = os.path.join(str(tmp_path), m.checksum, "0.nlmc")
    regions = _regions(p)
    assert [r[1] for r in regions[:2]] == [2, 2]
    table_bytes = 192 + sum((r[3] * (1 + r[0] + 2 * r[2]) * 4 + 63) // 64 * 64 for r in regions)
    entries = sum(r[4] for r in regions)
    assert entries > 1000
    assert os.path.getsize(p) < 0.5 * table_bytes
    f = read_cache_file(p)
    assert len(f.scores) == regions[0][4] and len(f.context_norms) == regions[1][4]
    np.testing.assert_array_equal(f.keys[:, -1] >= 0, True)
    again = CachedScorer(m, tmp_path)
    assert [g.tolist() for g in run_pass(again, lines)] == [g.tolist() for g in first]
    assert again.stats()["persistent_hits"] == sum(len(g) for g in first)


def test_ids_above_65535_are_written_four_bytes_wide(tmp_path):
    """A vocabulary of more than 65,536 words: a sentence whose keys hold a word id above 65535
    gets 4-byte ids in that region (never truncated ids), one whose ids all fit gets 2-byte
    ids; both read back exact."""
    from nlmfeature.core.architecture import ModelSpec, random_model
    from nlmfeature.core.vocab import Vocabulary
    from helpers import brown_vocab
    base, _ = brown_vocab()
    words = list(base) + [f"w{i}" for i in range(70000 - len(base))]
    vocab = Vocabulary(words)
    header, arrays = random_model(ModelSpec(arch="lbl", order=3, word_width=4, diagonal_contexts=True,
                                            output="unnormalised"), vocab, seed=3)
    path = str(tmp_path / "wide.nlm")
    nlmfeature.save(path, header, arrays)
    m = nlmfeature.load(path)
    lines = ["the jury said w66000 w65000 of the", "the jury said it"]
    first = run_pass(CachedScorer(m, tmp_path / "pc", policy="always"), lines)
    d = os.path.join(str(tmp_path / "pc"), m.checksum)
    assert _regions(os.path.join(d, "0.nlmc"))[0][1] == 4
    assert _regions(os.path.join(d, "1.nlmc"))[0][1] == 2
    assert int(read_cache_file(os.path.join(d, "0.nlmc")).keys.max()) == vocab.id("w66000") > 65535
    again = CachedScorer(m, tmp_path / "pc", policy="always")
    assert [g.tolist() for g in run_pass(again, lines)] == [g.tolist() for g in first]
    assert again.stats()["persistent_hits"] == sum(len(g) for g in first)


def test_a_slot_map_that_disagrees_with_the_header_is_refused(model_paths, tmp_path, capfd):
    """A file whose checksums are right but whose slot map marks one slot more (or fewer) than
    the header's entry count, or whose header claims other slots than the writer gives its
    entries (it could unpack into a table far larger than the file): ignored with the
    reason, rewritten, and the scores stay exact; found while its n-grams are unpacked into
    a session's table, that table is left empty."""
    import struct
    from nlmfeature._pcache import data_checksum
    m = nlmfeature.load(model_paths["class"])
    first = run_pass(CachedScorer(m, tmp_path), LINES[:2])
    p = os.path.join(str(tmp_path), m.checksum, "1.nlmc")
    good = open(p, "rb").read()
    _, _, _, slots, count, _ = _regions(p)[0]
    words = (slots + 63) // 64
    bitmap = np.frombuffer(good, "<u8", count=words, offset=192).copy()
    assert sum(bin(int(w)).count("1") for w in bitmap) == count

    def sealed(data):
        data = bytearray(data)
        struct.pack_into("<Q", data, 136, data_checksum(bytes(data[192:])))
        open(p, "wb").write(bytes(data))
        _rewrite_header(p, {})

    live = [i for i in range(slots) if int(bitmap[i // 64]) >> (i % 64) & 1]
    empty = next(i for i in range(slots) if i not in set(live))
    for slot, why in ((empty, "more entries than the header"), (live[0], "fewer entries than the header")):
        data = bytearray(good)
        struct.pack_into("<Q", data, 192 + 8 * (slot // 64), int(bitmap[slot // 64]) ^ (1 << (slot % 64)))
        sealed(data)
        with pytest.raises(NLMFeatureError, match=why):
            read_cache_file(p)
        # found while unpacking into a session's n-gram table: the table is left empty
        capfd.readouterr()
        s = CachedScorer(m, tmp_path)
        s.begin(1)
        assert s.ngram_table()[1] == 0
        assert s.score_sentence(LINES[1]).tolist() == first[1].tolist()
        s.end()
        assert why in capfd.readouterr().err and s.stats()["persistent_hits"] == 0
    open(p, "wb").write(good)
    _rewrite_header(p, {48: ("<Q", 4 * count + 65), 56: ("<Q", count)})
    with pytest.raises(NLMFeatureError, match="inconsistent"):
        read_cache_file(p)
    capfd.readouterr()
    s = CachedScorer(m, tmp_path)
    got = run_pass(s, LINES[:2])
    assert "1.nlmc: region sizes are inconsistent" in capfd.readouterr().err
    assert [g.tolist() for g in got] == [g.tolist() for g in first]
    assert s.stats()["files_ignored"] == 1
    assert read_cache_file(p).keys.shape[0] == len(first[1])


def test_entries_written_twice_by_concurrent_sessions_merge_into_an_exact_base(model_paths, tmp_path):
    """Six sessions decode the same sentence at once (as two decoder processes given the same
    input would) and end one after another: the first writes the base, the next four write
    deltas holding the same entries again, the sixth merges them all.  The merged base holds
    each entry once, its regions sized for what it holds (the writer sizes them again after
    dropping the duplicates; readers refuse other sizes), and reads back exact."""
    import struct
    m = nlmfeature.load(model_paths["class"])
    sessions = [CachedScorer(m, tmp_path) for _ in range(MAX_DELTA_FILES + 2)]
    want = None
    for s in sessions:
        s.begin(0)
        want = s.score_sentence(LINES[3])
    d = os.path.join(str(tmp_path), m.checksum)
    for k, s in enumerate(sessions):
        s.end()
        assert len(sentence_files(d, 0)) == (k + 1 if k <= MAX_DELTA_FILES else 1)
    p = os.path.join(d, "0.nlmc")
    f = read_cache_file(p)
    assert len(f.scores) == len(np.unique(f.keys, axis=0)) == len(want)
    for i, (klen, width, nd, slots, count, _) in enumerate(_regions(p)):
        assert slots == _writer_slots(i, count)
    again = CachedScorer(m, tmp_path)
    got = run_pass(again, [LINES[3]])[0]
    assert got.tolist() == want.tolist()
    assert again.stats()["persistent_hits"] == len(want)
