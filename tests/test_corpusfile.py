"""The compiled corpus: one streaming pass to a checked, memory-mapped id file, and the n-gram
stream training reads from it (same n-grams as the in-memory reader, every one once an epoch,
seeded, resumable), on real text."""
from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from nlmfeature.errors import InputError
from nlmfeature.training import corpusfile as cf
from nlmfeature.training.corpus import build_vocabulary, ngrams, read_corpus

HERE = os.path.dirname(os.path.abspath(__file__))
BROWN_TRAIN = os.path.join(HERE, "data", "brown", "train.2k.txt")
BROWN_VALID = os.path.join(HERE, "data", "brown", "valid.300.txt")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return cf.compile_corpus(BROWN_TRAIN, str(tmp_path_factory.mktemp("c") / "brown.nlmcorpus"))


@pytest.mark.parametrize("reverse", [False, True])
def test_stream_ngrams_equal_the_in_memory_reader(compiled, reverse):
    sents = read_corpus(BROWN_TRAIN)
    vocab, counts = build_vocabulary(sents, 2)
    v2, c2, remap = compiled.vocabulary(2)
    assert v2 == vocab and np.array_equal(c2, counts)
    ref = ngrams([s[::-1] for s in sents] if reverse else sents, vocab, 5)
    stream = cf.NgramStream(compiled, remap, vocab.bos, 5, reverse, window_tokens=5000)
    parts = list(stream.chunks(size=7000))
    assert len(parts) > 1
    assert np.array_equal(np.concatenate([c for c, _ in parts]), ref.contexts)
    assert np.array_equal(np.concatenate([w for _, w in parts]), ref.words)
    assert compiled.tokens == sum(len(s) for s in sents) and compiled.sentences == len(sents)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("order", [1, 2, 5, 9])
def test_a_window_builds_the_contexts_of_any_of_its_ngrams(compiled, reverse, order):
    """A shuffle window holds words and sentence positions only; the contexts gathered from
    them for any n-grams, in any order, are the reader's, at every order (sentences shorter
    and longer than the context)."""
    sents = read_corpus(BROWN_TRAIN)
    vocab, _ = build_vocabulary(sents, 2)
    _, _, remap = compiled.vocabulary(2)
    ref = ngrams([s[::-1] for s in sents] if reverse else sents, vocab, order)
    stream = cf.NgramStream(compiled, remap, vocab.bos, order, reverse)
    blocks = np.arange(len(stream.sizes))
    words, depth = stream.block_words(blocks)
    assert depth.dtype == np.uint8 and words.dtype == np.int32
    assert np.array_equal(words, ref.words)
    assert depth.max() == min(order - 1, max(len(s) for s in sents))
    idx = np.random.default_rng(3).permutation(len(words))[:5000]
    idx[:3] = [0, len(words) - 1, 1]
    ctx, got = stream.gather(words, depth, idx)
    assert ctx.shape == (len(idx), order - 1)
    assert np.array_equal(ctx, ref.contexts[idx]) and np.array_equal(got, ref.words[idx])
    from nlmfeature import _train
    with pytest.raises(ValueError, match="outside the stream"):
        stream.gather(words, depth, np.array([len(words)]))
    if order > 1:
        bad = depth.copy()
        bad[0] = 1                         # a depth reaching before the stream's start
        with pytest.raises(ValueError, match="beyond its start"):
            stream.gather(words, bad, np.array([0]))
    with pytest.raises(ValueError, match="no contexts and no depths"):
        _train.stream_ngrams(compiled.ids, np.array([0], np.int64), np.array([10], np.int64), remap,
                             vocab.bos, False, np.empty((0, order - 1), np.int32), np.empty(10, np.int32))


@pytest.mark.parametrize("min_count,max_vocab", [(1, None), (2, None), (1, 500), (3, 1000), (1, 6)])
def test_vocabulary_of_a_compiled_corpus_equals_the_reader_rules(tmp_path, min_count, max_vocab):
    """The vocabulary chosen from a compiled corpus (looking only at the words that can be
    kept) is the in-memory reader's, with its counts and the full id map."""
    from nlmfeature.core.vocab import Vocabulary

    corpus = cf.compile_corpus(BROWN_TRAIN, str(tmp_path / "t.nlmcorpus"))
    sents = read_corpus(BROWN_TRAIN)
    vocab, counts = build_vocabulary(sents, min_count, max_vocab)
    v2, c2, remap = corpus.vocabulary(min_count, max_vocab)
    assert v2 == vocab and np.array_equal(c2, counts)
    assert np.array_equal(remap, corpus.remap_to(vocab))
    assert isinstance(v2, Vocabulary) and (max_vocab is None or len(vocab) == max_vocab)


def test_an_epoch_serves_every_ngram_once_seeded_and_resumable(compiled):
    vocab, _, remap = compiled.vocabulary(2)
    stream = cf.NgramStream(compiled, remap, vocab.bos, 4, window_tokens=3000)   # many windows
    B = 250
    batches = list(stream.batches(epoch=0, seed=7, batch=B))
    assert len(batches) == stream.batches_per_epoch(B) == -(-len(compiled) // B)
    assert all(len(w) == B for _, w in batches[:-1])
    rows = np.concatenate([np.concatenate([c, w[:, None]], 1) for c, w in batches])
    ref = np.concatenate(list(np.concatenate([c, w[:, None]], 1) for c, w in stream.chunks()))
    assert np.array_equal(np.unique(rows, axis=0, return_counts=True)[1],
                          np.unique(ref, axis=0, return_counts=True)[1])
    again = list(stream.batches(epoch=0, seed=7, batch=B))
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(batches, again))
    other = next(stream.batches(epoch=1, seed=7, batch=B))[1]
    assert not np.array_equal(other, batches[0][1])
    for start in (1, 13, len(batches) - 1):   # a resumed epoch continues exactly
        tail = list(stream.batches(epoch=0, seed=7, batch=B, start=start))
        assert len(tail) == len(batches) - start
        assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                   for a, b in zip(tail, batches[start:]))


def test_compile_reuses_an_up_to_date_file_and_reads_compressed_text(tmp_path):
    gz = tmp_path / "t.txt.gz"
    with open(BROWN_TRAIN, "rb") as f, gzip.open(gz, "wb") as g:
        g.write(f.read())
    out = str(tmp_path / "t.nlmcorpus")
    a = cf.compile_corpus(str(gz), out)
    mtime = os.stat(out).st_mtime_ns
    b = cf.compile_corpus(str(gz), out)
    assert os.stat(out).st_mtime_ns == mtime and b.header == a.header
    plain = cf.compile_corpus(BROWN_TRAIN, str(tmp_path / "p.nlmcorpus"))
    assert np.array_equal(plain.ids, a.ids) and plain.words == a.words


def test_corrupt_truncated_and_foreign_files_are_refused(tmp_path, compiled):
    data = open(compiled.path, "rb").read()
    cases = {"truncated": data[:len(data) // 2], "flipped": bytearray(data), "text": b"hello world\n" * 10,
             "empty": b""}
    cases["flipped"][cf.DATA_OFFSET + 1000] ^= 0x40
    for name, blob in cases.items():
        p = tmp_path / f"{name}.nlmcorpus"
        p.write_bytes(bytes(blob))
        with pytest.raises(InputError) as e:
            cf.CompiledCorpus(str(p))
        assert str(p) in str(e.value)
    # through the command line: one line, exit 2, no traceback
    bad = tmp_path / "flipped.nlmcorpus"
    r = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "train", "--train", str(bad), "-o",
                        str(tmp_path / "m.nlm")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "corrupt" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "corpus", "info", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "checksum" in r.stderr


def test_reserved_tokens_and_empty_text_name_the_file_and_line(tmp_path):
    t = tmp_path / "t.txt"
    t.write_text("a b c\nd </s> e\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        cf.compile_corpus(str(t), str(tmp_path / "t.nlmcorpus"))
    assert "t.txt:2" in str(e.value) and "</s>" in str(e.value)
    assert not os.path.exists(tmp_path / "t.nlmcorpus")
    (tmp_path / "e.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(InputError):
        cf.compile_corpus(str(tmp_path / "e.txt"), str(tmp_path / "e.nlmcorpus"))


def test_repeated_corpus_is_a_valid_longer_corpus(tmp_path, compiled):
    r = cf.write_repeated(compiled, 3, str(tmp_path / "x3.nlmcorpus"))
    assert r.tokens == 3 * compiled.tokens and r.words == compiled.words
    assert np.array_equal(np.asarray(r.ids[:len(compiled.ids)]), np.asarray(compiled.ids))
    assert np.array_equal(np.asarray(r.counts), 3 * np.asarray(compiled.counts))


def test_hash_space_is_sized_from_the_data(tmp_path):
    from nlmfeature.training.trainer import TrainConfig, Trainer

    tr = Trainer(TrainConfig(train=BROWN_TRAIN, model_out=str(tmp_path / "m.nlm"), order=4, word_width=16,
                             progress=False, corpus_dir=str(tmp_path)), lambda m: None)
    hs = tr.header["direct"]["hash_space"]
    # 2,000 sentences: tens of thousands of frequent n-grams, not the 4M-entry fixed default
    assert 1 << 12 <= hs <= 1 << 17 and hs & (hs - 1) == 0
    big = Trainer(TrainConfig(train=BROWN_TRAIN, model_out=str(tmp_path / "m.nlm"), order=4, word_width=16,
                              progress=False, corpus_dir=str(tmp_path), min_ngram_freq=1), lambda m: None)
    assert big.header["direct"]["hash_space"] >= hs   # more n-grams kept, at least as much room


def test_kill_9_and_the_same_command_again_give_the_uninterrupted_model(tmp_path):
    """Checkpoints every few seconds; SIGKILL mid-run; the same command resumes; with one
    thread the model is bit-identical to an uninterrupted run's."""
    import nlmfeature

    def cmd(out):
        return [sys.executable, "-m", "nlmfeature.cli", "train", "--train", BROWN_TRAIN, "-o", str(out),
                "--order", "4", "--word-width", "16", "--iterations", "12", "--evals-per-epoch", "1",
                "--threads", "1", "--checkpoint-minutes", "0.002", "--no-progress", "--corpus-dir", str(tmp_path / out.stem)]
    ref = tmp_path / "ref.nlm"
    # the uninterrupted run goes on beside the killed one (one thread each)
    ref_run = subprocess.Popen(cmd(ref), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = tmp_path / "killed.nlm"
    proc = subprocess.Popen(cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ck = str(out) + ".ckpt.npz"
    deadline = time.time() + 120
    while not os.path.exists(ck) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    if proc.poll() is not None:
        pytest.fail("the run ended before it could be killed")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.exists(ck)
    r = subprocess.run(cmd(out), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "resuming from" in r.stderr
    assert ref_run.wait(timeout=300) == 0, ref_run.stderr.read()
    a, b = nlmfeature.load(str(ref)), nlmfeature.load(str(out))
    for name in ("embeddings", "output.weight", "output.bias", "direct.weights", "branch0.weights"):
        assert np.array_equal(a.arrays[name], b.arrays[name]), name


def test_a_rewritten_text_of_the_same_size_is_compiled_again(tmp_path):
    t = tmp_path / "t.txt"
    t.write_text("a b c\nd e f\n", encoding="utf-8")
    st = os.stat(t)
    first = cf.compile_corpus(str(t), str(tmp_path / "t.nlmcorpus"))
    t.write_text("x y z\nd e f\n", encoding="utf-8")
    os.utime(t, ns=(st.st_atime_ns, st.st_mtime_ns))      # same size, same time stamp
    again = cf.compile_corpus(str(t), str(tmp_path / "t.nlmcorpus"))
    assert "x" in again.words and "a" not in again.words and first.words != again.words
