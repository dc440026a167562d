"""Brown clustering, paths files, class files for vocabularies, average mutual information."""
from __future__ import annotations

import itertools
import os
from collections import Counter

import numpy as np
import pytest

from helpers import BROWN_TRAIN, DATA
from nlmfeature.training import clusters
from nlmfeature.training.clusters import (PathEntry, average_mutual_information, bigram_counts,
                                 brown_clusters, brown_clusters_corpus, class_of_word,
                                 classes_of_paths, frequency_binning_ami,
                                 frequency_binning_ami_corpus, load_class_of_word, paths_ami,
                                 read_paths, stream_bigram_counts, write_paths)
from nlmfeature.io.textio import read_tokens
from nlmfeature.cli import main
from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.core.outputs import class_arrays
from nlmfeature.core.vocab import Vocabulary

LIANG_C50 = os.path.join(DATA, "clusters", "liang-wcluster-train2k-c50.paths")


@pytest.fixture(scope="module")
def brown_lines():
    return read_tokens(BROWN_TRAIN)


def test_brown_raises_ami_over_frequency_binning(brown_lines):
    lines = brown_lines[:800]
    result = brown_clusters(lines, 20)
    brown = paths_ami(result.entries, lines)
    freq = frequency_binning_ami(lines, 20)
    assert result.n_classes == 20
    assert brown > 3 * freq > 0
    # the AMI the kernel tracked is the AMI of the clustering it wrote
    assert brown == pytest.approx(result.ami_bits, rel=1e-9)


def _reference_merges(lines, C, min_count):
    """Slow, obviously correct windowed Brown clustering: every loss from scratch."""
    counts = Counter(t for l in lines for t in l)
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    ids = clusters._stream_ids(lines, {w: i for i, w in enumerate(words)})
    left, right, cnt = bigram_counts(ids, len(words))
    P = np.zeros((len(words), len(words)))
    P[left, right] = cnt / cnt.sum()
    pl, pr = P.sum(1), P.sum(0)

    def ami(cl):
        # the clusters' bigram probabilities Q[a, b] = sum of P over a x b, as A^T P A with A
        # the word -> cluster indicator; their marginals from every word's (unclustered too)
        A = np.zeros((len(words), len(cl)))
        for k, c in enumerate(cl):
            A[c, k] = 1.0
        Q, ql, qr = A.T @ P @ A, A.T @ pl, A.T @ pr
        m = Q > 0
        return float((Q[m] * np.log(Q[m] / np.outer(ql, qr)[m])).sum())

    cl, losses = [], []
    for w in range(len(words)):
        cl.append([w])
        if len(cl) > C:
            base = ami(cl)
            best = None
            for i, j in itertools.combinations(range(len(cl)), 2):
                merged = [c for k, c in enumerate(cl) if k not in (i, j)] + [cl[i] + cl[j]]
                loss = base - ami(merged)
                if best is None or loss < best[0]:
                    best = (loss, i, j)
            losses.append(best[0])
            cl = [c for k, c in enumerate(cl) if k not in best[1:]] + [cl[best[1]] + cl[best[2]]]
    return np.array(losses), ami(cl) / np.log(2), {words[w]: k for k, c in enumerate(cl) for w in c}


def test_kernel_matches_brute_force(brown_lines):
    lines = brown_lines[:150]
    ref_losses, ref_ami, ref_part = _reference_merges(lines, 6, 3)
    result = brown_clusters(lines, 6, min_count=3)
    n1 = len(ref_losses)
    assert n1 > 100
    np.testing.assert_allclose(result.merge_losses[:n1], ref_losses, rtol=0, atol=1e-12)
    assert result.ami_bits == pytest.approx(ref_ami, abs=1e-12)
    # same partition (cluster labels aside)
    _, ours = classes_of_paths(result.entries)
    pairs = {(ref_part[w], ours[w]) for w in ours}
    assert len(pairs) == 6 == len({p[0] for p in pairs}) == len({p[1] for p in pairs})


def test_incremental_losses_equal_full_recomputation(brown_lines):
    result = brown_clusters(brown_lines, 40, check=True)
    assert result.words > 8000
    assert result.check_error < 1e-11
    assert np.all(result.merge_losses > -1e-12)


def test_threads_give_the_same_clustering(brown_lines):
    lines = brown_lines[:800]
    one = brown_clusters(lines, 150, threads=1)
    two = brown_clusters(lines, 150, threads=2)
    assert [(e.bits, e.word) for e in one.entries] == [(e.bits, e.word) for e in two.entries]
    np.testing.assert_allclose(one.merge_losses, two.merge_losses, rtol=0, atol=1e-13)


def test_paths_form_a_binary_hierarchy(brown_lines, tmp_path):
    result = brown_clusters(brown_lines[:600], 25, min_count=2)
    counts = Counter(t for l in brown_lines[:600] for t in l)
    bits = sorted({e.bits for e in result.entries})
    assert len(bits) == 25
    # leaves of one binary tree: prefix-free, and Kraft's sum is exactly 1
    assert not any(b.startswith(a) for a, b in itertools.combinations(bits, 2))
    assert sum(2.0 ** -len(b) for b in bits) == pytest.approx(1.0)
    assert {e.word for e in result.entries} == {w for w, c in counts.items() if c >= 2}
    assert all(e.count == counts[e.word] for e in result.entries)
    out = tmp_path / "c.paths"
    write_paths(str(out), result.entries)
    assert read_paths(str(out)) == result.entries
    first = out.read_text(encoding="utf-8").splitlines()[0].split("\t")
    assert len(first) == 3 and set(first[0]) <= {"0", "1"} and int(first[2]) > 0


def test_comparable_to_liang_wcluster(brown_lines):
    liang = read_paths(LIANG_C50)
    assert len({e.bits for e in liang}) == 50
    ours = brown_clusters(brown_lines, 50)
    a_liang, a_ours = paths_ami(liang, brown_lines), paths_ami(ours.entries, brown_lines)
    assert a_ours > 0.98 * a_liang
    assert a_liang > 5 * frequency_binning_ami(brown_lines, 50)


@pytest.mark.parametrize("line, message", [
    ("0101\tword", None),
    ("0101 word 3", "found 1 tab-separated"),
    ("01a1\tword\t3", "0s and 1s"),
    ("0101\tword\tthree", "not a non-negative integer"),
    ("0101\tword\t-2", "not a non-negative integer"),
    ("0101\ttwo words\t3", "white space"),
    ("0101\tthe\t3", "listed twice (first on line 1)"),
])
def test_read_paths_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.paths"
    path.write_text(f"0100\tthe\t10\n{line}\n", encoding="utf-8")
    if message is None:
        assert read_paths(str(path))[1] == PathEntry("0101", "word", 0)
        return
    with pytest.raises(InputError) as err:
        read_paths(str(path))
    assert f"{path}:2:" in str(err.value) and message in str(err.value)


def test_class_of_word_fallbacks():
    entries = [PathEntry("00", "the", 100), PathEntry("00", "a", 80), PathEntry("01", "cat", 5),
               PathEntry("1", "sat", 2), PathEntry("1", "notinvocab", 1)]
    vocab = Vocabulary(["<unk>", "<s>", "</s>", "<null>", "the", "cat", "sat", "a", "dog", "mat"])
    counts = [30, 0, 90, 0, 100, 5, 2, 80, 4, 1]
    cw = class_of_word(entries, vocab, counts)
    assert cw.dtype == np.int32
    assert list(cw[4:8]) == [0, 1, 2, 0]            # sorted bitstrings 00, 01, 1
    # nearest file count: dog (4) -> cat (5); mat (1) -> sat (2); </s> (90) -> a (80);
    # <unk> (30): 5 and 80 are 25 and 50 away -> cat; <s>, <null> (0) -> sat, the rarest
    assert cw[8] == 1 and cw[9] == 2 and cw[2] == 0 and cw[0] == 1 and cw[1] == cw[3] == 2
    class_arrays(cw)                                 # every class non-empty
    own = class_of_word(entries, vocab, counts, unknown="own")
    assert set(own[[0, 1, 2, 3, 8, 9]]) == {3} and list(own[4:8]) == [0, 1, 2, 0]
    with pytest.raises(NLMFeatureError, match="6 vocabulary words have no class"):
        class_of_word(entries, vocab, counts, unknown="error")
    # classes with no vocabulary word are dropped and the rest renumbered
    small = Vocabulary(["<unk>", "<s>", "</s>", "<null>", "sat", "the"])
    assert sorted(set(class_of_word(entries, small, unknown="own"))) == [0, 1, 2]


def test_class_file_for_a_vocabulary(brown_lines, tmp_path):
    path = tmp_path / "brown.paths"
    assert main(["cluster", "--text", BROWN_TRAIN, "--classes", "30", "--min-count", "2",
                 "--out", str(path), "--quiet", "--corpus-dir", str(tmp_path)]) == 0
    counts = Counter(t for l in brown_lines for t in l)
    vocab = Vocabulary.from_counts(counts, min_count=1)
    ids_counts = [counts.get(w, 0) for w in vocab]
    cw = load_class_of_word(str(path), vocab, ids_counts)
    assert cw.max() == 29
    arrays = class_arrays(cw)
    assert arrays["class.start"][-1] == len(vocab)
    # singletons were not clustered: they join classes whose clustered words are rare
    entries = read_paths(str(path))
    bits, word_class = classes_of_paths(entries)
    min_count_of_class = {}
    for e in entries:
        c = word_class[e.word]
        min_count_of_class[c] = min(min_count_of_class.get(c, 10 ** 9), e.count)
    singles = [i for i, w in enumerate(vocab) if counts.get(w) == 1]
    assert singles and all(min_count_of_class[cw[i]] == 2 for i in singles)


def test_a_compiled_corpus_clusters_as_its_text(brown_lines, tmp_path):
    """Clustering a compiled corpus (one pass over its id stream, memory of the vocabulary and
    the bigrams) gives the clustering of its text: the same paths, AMI and counts."""
    from nlmfeature.training.corpusfile import compile_corpus

    lines = brown_lines[:3000]
    text = tmp_path / "t.txt"
    text.write_text("\n".join(" ".join(l) for l in lines) + "\n", encoding="utf-8")
    corpus = compile_corpus(str(text), str(tmp_path / "t.nlmcorpus"))
    a = brown_clusters(lines, 30, min_count=2)
    b = brown_clusters_corpus(corpus, 30, min_count=2)
    assert a.entries == b.entries
    assert (a.words, a.tokens, a.bigrams) == (b.words, b.tokens, b.bigrams)
    assert a.ami_bits == pytest.approx(b.ami_bits, abs=1e-9)
    assert frequency_binning_ami(lines, 30, 2) == pytest.approx(
        frequency_binning_ami_corpus(corpus, 30, 2), abs=1e-12)
    # a stream in chunks: the bigrams across the chunk borders are counted
    ids = np.asarray([0, 1, 2, -1, 1, 2, 2, 0, 1, 3, 3], dtype=np.int64)
    whole = bigram_counts(ids, 4)
    for cut in ([1, 5], [3, 4, 10], [0, 11]):
        parts = np.split(ids, cut)
        got = stream_bigram_counts(parts, 4)
        assert all(np.array_equal(x, y) for x, y in zip(got[:3], whole)) and got[3] == ids.size


def test_cluster_command_default_classes(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("\n".join(" ".join(l) for l in read_tokens(BROWN_TRAIN)[:300]) + "\n",
                    encoding="utf-8")
    out = tmp_path / "o.paths"
    assert main(["cluster", "--text", str(text), "--out", str(out), "--json", "--quiet",
                 "--compare-frequency-binning", "--corpus-dir", str(tmp_path)]) == 0
    import json
    summary = json.loads(capsys.readouterr().out)
    assert summary["classes"] == round(summary["words"] ** 0.5)
    assert len({e.bits for e in read_paths(str(out))}) == summary["classes"]
    assert summary["ami_bits"] > summary["frequency_binning_ami_bits"]


def test_bad_input_errors(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"good line\ncaf\xe9 au lait\n")
    with pytest.raises(InputError, match=r"latin1.txt:2: not valid UTF-8"):
        read_tokens(str(bad))
    assert main(["cluster", "--text", str(tmp_path / "missing.txt"), "--out",
                 str(tmp_path / "x"), "--quiet"]) == 2
    with pytest.raises(NLMFeatureError, match="no word occurs at least 5 times"):
        brown_clusters([["a", "b"]], 2, min_count=5)


def test_ami_definition():
    # two classes that alternate: 99 bigrams, 50 (x, y) and 49 (y, x)
    lines = [["x", "y"] * 50]
    expected = 50 / 99 * np.log2(99 / 50) + 49 / 99 * np.log2(99 / 49)
    assert average_mutual_information(lines, {"x": 0, "y": 1}) == pytest.approx(expected, abs=1e-12)
    assert average_mutual_information(lines, {"x": 0, "y": 0}) == 0.0
    # words without a class drop out with their bigrams
    # (only the 30 (x, y) bigrams remain: one event, no information)
    assert average_mutual_information([["x", "y", "z"] * 30], {"x": 0, "y": 1}) == 0.0
    assert average_mutual_information([["x", "y", "z"] * 30], {"x": 0, "y": 1, "z": 2}) == \
        pytest.approx(np.log2(3), abs=1e-3)


def test_ctrl_c_stops_a_long_clustering_at_once(tmp_path):
    """Ctrl-C in the middle of the clustering kernel (a run of hours at scale; here about a
    minute) exits 130 within seconds and leaves no paths file, also without a progress bar
    (whose updates used to be the only place a signal was seen)."""
    import signal
    import subprocess
    import sys
    import time

    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(20000)])
    ids = np.minimum(rng.zipf(1.1, 400_000), 20000) - 1
    text = tmp_path / "zipf.txt"
    text.write_text("\n".join(" ".join(words[ids[i:i + 20]]) for i in range(0, ids.size, 20)) + "\n",
                    encoding="utf-8")
    out, cdir = tmp_path / "z.paths", tmp_path / "corpora"
    p = subprocess.Popen([sys.executable, "-m", "nlmfeature.cli", "cluster", "-i", str(text), "-o",
                          str(out), "--classes", "600", "--threads", "1", "--corpus-dir", str(cdir), "-q"],
                         stderr=subprocess.PIPE, text=True,
                         # a test runner's worker may ignore SIGINT, and its children inherit that
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not list(cdir.glob("*.nlmcorpus")) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(3)                          # the bigrams are counted, the kernel runs
    assert p.poll() is None
    t = time.time()
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read()
    assert p.wait(timeout=120) == 130, rest
    assert time.time() - t < 15 and "interrupted" in rest and "Traceback" not in rest
    assert not out.exists()
