"""Robustness beyond bytes: threads sharing a model, k-best lists out of order, models that
score NaN, file descriptors and FIFOs given as models, the C API's documented errors, one
tokenisation rule for every reader, and the Python API's argument checks.  The command-line
guards (ranges of numeric flags, outputs that are inputs, full disks) are in
test_cli_guards.py."""
from __future__ import annotations

import gzip
import math
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import nlmfeature
from helpers import (BROWN_VALID, CLI_ENV as ENV, DATA, in_threads, make_model, one_line_error,
                     read_lines, run_cli, run_clis)
from nlmfeature.core import modelfile
from nlmfeature.errors import ModelFileError

HERE = os.path.dirname(os.path.abspath(__file__))
KBEST = os.path.join(DATA, "kbest", "moses-multi30k-dev10.100best.gz")
KBEST_REF = os.path.join(DATA, "kbest", "multi30k-dev10.ref.en")
M30K = os.path.join(DATA, "multi30k")
cli = run_cli


# -- 1. threads sharing one Model ----------------------------------------------------------------
OUTPUTS = {
    "unnormalised": dict(output="unnormalised"),
    "softmax": dict(output="softmax"),
    "class": dict(output="class", classes=20),
    "tree": dict(output="tree"),
    "class-direct": dict(output="class", classes=20, direct_order=3, hash_space=1 << 16),
}


def _in_threads(fn, items, n_threads=8, rounds=3):
    """Every thread scores every item ``rounds`` times (in its own order); returns the
    threads' results, each a list in item order."""
    results = [None] * n_threads
    barrier = threading.Barrier(n_threads)

    def work(t):
        barrier.wait()
        order = list(range(len(items)))[t:] + list(range(len(items)))[:t]
        got = [None] * len(items)
        for _ in range(rounds):
            for i in order:
                got[i] = fn(items[i])
        results[t] = got

    errors = in_threads(work, n_threads)
    assert not errors, errors
    return results


@pytest.mark.parametrize("kind", list(OUTPUTS))
def test_eight_threads_share_one_model(tmp_path, kind):
    model = nlmfeature.load(make_model(tmp_path, order=4, word_width=16, seed=5, **OUTPUTS[kind]))
    lines = read_lines(BROWN_VALID, 60)
    single = [model.sentence_logprob(l) for l in lines]
    for got in _in_threads(model.sentence_logprob, lines):
        assert got == single
    # the word-at-a-time entry points (each thread's own session) and the batch path
    words = [l.split()[:4] for l in lines if len(l.split()) >= 4]
    single_w = [model.score_ngram(w[:3], w[3]) for w in words]
    for got in _in_threads(lambda w: model.score_ngram(w[:3], w[3]), words):
        assert got == single_w
    ngrams = [model.sentence_ngrams(l) for l in lines[:20]]
    single_b = [model.score_batch(c, w).tolist() for c, w in ngrams]
    for got in _in_threads(lambda cw: model.score_batch(*cw).tolist(), ngrams, rounds=1):
        assert got == single_b


def test_eight_threads_share_one_joint_model(tmp_path):
    from nlmfeature.core.architecture import ModelSpec, random_model
    from nlmfeature.core.joint import read_parallel
    from nlmfeature.training.corpus import build_vocabulary

    paths = [os.path.join(M30K, f"test2016.200.{x}") for x in ("de", "en", "align")]
    srcs, tgts, _ = read_parallel(*paths)
    tv, tc = build_vocabulary(tgts, 1)
    sv, sc = build_vocabulary(srcs, 1)
    header, arrays = random_model(ModelSpec(arch="nplm", order=4, word_width=16, hidden=24,
                                            output="class", classes=20, source_window=5),
                                  tv, tc, seed=3, scale=0.3, source_vocab=sv, source_counts=sc)
    path = str(tmp_path / "joint.nlm")
    nlmfeature.save(path, header, arrays)
    model = nlmfeature.load(path)
    triples = list(zip(read_lines(paths[0], 60), read_lines(paths[1], 60), read_lines(paths[2], 60)))
    single = [model.sentence_logprob(*t) for t in triples]
    for got in _in_threads(lambda t: model.sentence_logprob(*t), triples):
        assert got == single


# -- 4. k-best lists are keyed by sentence id ------------------------------------------------------
def _kbest_groups():
    lines = gzip.open(KBEST, "rt", encoding="utf-8").read().splitlines()
    by_id = {}
    for line in lines:
        by_id.setdefault(int(line.split("|||")[0]), []).append(line)
    assert sorted(by_id) == list(range(10))
    return by_id


def _bleu(kbest, ref):
    p = cli("tune", "bleu", "--kbest", kbest, "--ref", ref, "--tokenize", "none")
    return p


def test_tune_bleu_pairs_hypotheses_with_references_by_sentence_id(tmp_path):
    groups = _kbest_groups()
    in_order = tmp_path / "in-order.kbest"
    in_order.write_text("".join(l + "\n" for i in range(10) for l in groups[i]), encoding="utf-8")
    shuffled = tmp_path / "shuffled.kbest"
    order = [2, 0, 1, 9, 5, 3, 8, 4, 7, 6]
    shuffled.write_text("".join(l + "\n" for i in order for l in groups[i]), encoding="utf-8")
    a, b = _bleu(in_order, KBEST_REF), _bleu(shuffled, KBEST_REF)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout and "BLEU" in a.stdout
    assert float(a.stdout.split()[2]) > 20      # a real translation's score, not a mismatch's


def test_every_kbest_reader_refuses_ids_outside_the_reference(tmp_path):
    groups = _kbest_groups()
    ref2 = tmp_path / "ref2.txt"
    ref2.write_text("".join(l + "\n" for l in read_lines(KBEST_REF, 2)), encoding="utf-8")
    far = tmp_path / "far.kbest"          # ids 0 and 10**9 against a 2-line reference
    far.write_text("".join(l + "\n" for l in groups[0]) +
                   "".join(l.replace("1 |||", "1000000000 |||", 1) + "\n" for l in groups[1]),
                   encoding="utf-8")
    one_line_error(_bleu(far, ref2), "sentence id 1000000000 is outside the reference")
    gap = tmp_path / "gap.kbest"          # ids 0 and 2: sentence 1 has no hypothesis
    gap.write_text("".join(l + "\n" for i in (0, 2) for l in groups[i]), encoding="utf-8")
    ref3 = tmp_path / "ref3.txt"
    ref3.write_text("".join(l + "\n" for l in read_lines(KBEST_REF, 3)), encoding="utf-8")
    one_line_error(_bleu(gap, ref3), "first missing id 1")
    # tune optimise reads the same lists the same way
    init = os.path.join(DATA, "kbest", "multi30k-dev.iter2.moses.ini")
    p = cli("tune", "optimise", "--nbest", far, "--ref", ref2, "--init", init,
            "-o", tmp_path / "w.txt", "--tokenize", "none")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "w.txt").exists()


# -- 5. models that score NaN ------------------------------------------------------------------------
def test_ensemble_refuses_weights_that_overflow(tmp_path):
    a = make_model(tmp_path, "a.nlm", seed=1)
    b = make_model(tmp_path, "b.nlm", seed=2)
    out = tmp_path / "ens.nlm"
    p = cli("ensemble", a, b, "-o", out, "--weights", "1e308", "1e308")
    one_line_error(p, "argument --weights")
    assert "RuntimeWarning" not in p.stderr and not out.exists()
    from nlmfeature.core.ensemble import write_ensemble
    from nlmfeature.errors import NLMFeatureError

    with pytest.raises(NLMFeatureError, match="overflow"):
        write_ensemble(str(out), [a, b], [1e308, 1e308])
    assert not out.exists()
    assert cli("ensemble", a, b, "-o", out, "--weights", "0.5", "0.5").returncode == 0
    assert math.isfinite(nlmfeature.load(str(out)).sentence_logprob("the jury said"))


def _poison(path: str, array: str) -> None:
    """Overwrite the first value of ``array`` in a model file with NaN and fix the checksum:
    a consistent file that an old writer (or a bit flip before checksumming) made."""
    import hashlib

    buf = bytearray(open(path, "rb").read())
    hoff, hlen, total, _ = modelfile.read_preamble(path, bytes(buf))
    header = modelfile._parse_header(path, bytes(buf[hoff:hoff + hlen]))
    off = header["arrays"][array]["offset"]
    buf[off:off + 4] = np.array([np.nan], dtype="<f4").tobytes()
    digest = hashlib.blake2b(bytes(buf[modelfile.PREAMBLE_SIZE:total]), digest_size=8).digest()
    fields = list(modelfile.PREAMBLE.unpack_from(bytes(buf), 0))
    fields[6] = digest
    buf[:modelfile.PREAMBLE.size] = modelfile.PREAMBLE.pack(*fields)
    open(path, "wb").write(bytes(buf))


@pytest.mark.parametrize("array,fields", [("output.bias", {}), ("embeddings", {}),
                                          # 16 MB: checked as read from the file in blocks
                                          ("direct.weights", dict(direct_order=3, hash_space=1 << 22))])
def test_a_model_with_nan_weights_is_refused_at_load(tmp_path, array, fields):
    path = make_model(tmp_path, "nan.nlm", tables=False, **fields)
    _poison(path, array)
    with pytest.raises(ModelFileError, match="NaN or infinite"):
        nlmfeature.load(path)
    one_line_error(cli("info", path), "NaN or infinite")
    one_line_error(cli("score", "-m", path, "-i", BROWN_VALID), "NaN or infinite")


def test_a_model_with_nan_weights_is_never_written(tmp_path):
    from nlmfeature.core.architecture import ModelSpec, random_model
    from helpers import brown_vocab

    vocab, counts = brown_vocab()
    header, arrays = random_model(ModelSpec(order=3, word_width=8), vocab, counts)
    arrays["output.weight"][5, 2] = np.inf
    out = tmp_path / "bad.nlm"
    with pytest.raises(ModelFileError, match="'output.weight' holds 1 NaN or infinite"):
        nlmfeature.save(str(out), header, arrays)
    assert not out.exists() and os.listdir(tmp_path) == []
    arrays["output.weight"][5, 2] = 1e6                  # finite as float32, not as float16
    with pytest.raises(ModelFileError, match="float16"):
        nlmfeature.save(str(out), header, arrays, half=True)


# -- 6. file descriptors and FIFOs as models -----------------------------------------------------------
def test_load_of_an_int_refuses_and_leaves_the_descriptor_open(tmp_path):
    path = make_model(tmp_path)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(TypeError, match="not int"):
            nlmfeature.load(fd)
        os.fstat(fd)                 # still open
        with pytest.raises(TypeError):
            nlmfeature.load(True)
    finally:
        os.close(fd)
    os.fstat(1)


def test_a_fifo_given_as_a_model_is_refused_at_once(tmp_path):
    fifo = tmp_path / "model.fifo"
    os.mkfifo(fifo)
    for args in (["info", fifo], ["score", "-m", fifo, "-i", BROWN_VALID]):
        one_line_error(cli(*args, timeout=60), "FIFO")
    p = subprocess.run([sys.executable, "-c", "import sys, nlmfeature; nlmfeature.load(sys.argv[1])",
                        str(fifo)], capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 1 and "ModelFileError" in p.stderr and "FIFO" in p.stderr


# -- 7. the C API's contract -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    from nlmfeature.commands import config as nlmconfig

    exe = str(tmp_path_factory.mktemp("contract") / "test_contract")
    flags = lambda f: subprocess.run([sys.executable, "-m", "nlmfeature.cli", "config", f],  # noqa: E731
                                     check=True, capture_output=True, text=True, env=ENV).stdout.split()
    assert os.path.exists(nlmconfig.paths()["library"])
    subprocess.run(["cc", "-O1", "-Wall", "-Werror", *flags("--cflags"),
                    os.path.join(HERE, "c", "test_contract.c"), "-o", exe, *flags("--libs"), "-lm"],
                   check=True)
    return exe


def run_contract(exe, model, *paths):
    p = subprocess.run([exe, model, *map(str, paths)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = {}
    for line in p.stdout.splitlines():
        name, value, message = line.split("\t")
        rows[name] = (value, message)
    return rows


def test_c_api_errors_are_the_documented_ones(tmp_path, contract):
    rows = run_contract(contract, make_model(tmp_path, order=4))
    for name, function in [("score_null_session", "nlm_score"), ("score_null_context", "nlm_score"),
                           ("score_negative_n", "nlm_score"),
                           ("partial_negative_n", "nlm_score_partial"),
                           ("padded_null_context", "nlm_score_padded"),
                           ("sequence_negative_nctx", "nlm_score_sequence"),
                           ("sequence_negative_n", "nlm_score_sequence"),
                           ("sequence_null_words", "nlm_score_sequence"),
                           ("span_null_session", "nlm_score_span"),
                           ("span_null_hist", "nlm_score_span"),
                           ("span_negative_nhist", "nlm_score_span"),
                           ("span_negative_first", "nlm_score_span"),
                           ("span_negative_count", "nlm_score_span"),
                           ("span_first_past_end", "nlm_score_span"),
                           ("span_count_past_end", "nlm_score_span"),
                           ("joint_span_null_session", "nlm_joint_score_span")]:
        value, message = rows[name]
        assert value == "nan" and message.startswith(function + ":"), (name, value, message)
    assert rows["end_without_begin"][0] == "-6"                   # NLM_ERR_STATE
    assert rows["begin_null_session"][0] == "-1"                  # NLM_ERR_ARGUMENT
    assert rows["begin"][0] == rows["end"][0] == "0"
    # documented: scoring needs no open sentence, and scores as inside one
    assert rows["score_before_begin"][0] != "nan" and rows["before_equals_inside"][0] == "1"
    assert rows["span_equals_sum"][0] == "1"
    assert rows["span_empty"][0] == rows["span_empty_null_hist"][0] == "0"


def test_c_api_refuses_a_fifo_and_a_nan_model(tmp_path, contract):
    fifo = tmp_path / "model.fifo"
    os.mkfifo(fifo)
    bad = make_model(tmp_path, "nan.nlm", tables=False)
    _poison(bad, "output.bias")
    rows = run_contract(contract, make_model(tmp_path, order=4), fifo, bad)
    assert rows[f"load:{fifo}"][0] == "-2" and "FIFO" in rows[f"load:{fifo}"][1]
    assert rows[f"load:{bad}"][0] == "-2" and "NaN or infinite" in rows[f"load:{bad}"][1]
    assert rows[f"load_null_out:{fifo}"][0] == rows[f"load_null_out:{bad}"][0] == "1"


# -- 8. one tokenisation rule ----------------------------------------------------------------------------
def test_a_byte_order_mark_is_not_text(tmp_path):
    model_path = make_model(tmp_path)
    lines = read_lines(BROWN_VALID, 20)
    plain, bom = tmp_path / "plain.txt", tmp_path / "bom.txt"
    plain.write_text("\n".join(lines) + "\n", encoding="utf-8")
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    ref = tmp_path / "ref.txt"
    ref.write_text("\n".join(lines[::-1]) + "\n", encoding="utf-8")
    prepared = [tmp_path / "prepared-plain.txt", tmp_path / "prepared-bom.txt"]
    paths = tmp_path / "paths"
    pairs = [["score", "-m", model_path, "--per-word", "-i"], ["perplexity", "-m", model_path, "--json", "--test"],
             ["eval", "--json", "--ref", ref]]
    done = run_clis(*[args + [f] for args in pairs for f in (plain, bom)],
                    *[["prepare", "-l", "en", "-i", src, "-o", dst] for src, dst in zip((plain, bom), prepared)],
                    ["cluster", "--text", bom, "-o", paths, "--classes", "5"])
    for k in range(len(pairs)):
        a, b = done[2 * k], done[2 * k + 1]
        assert a.returncode == 0 and a.stdout.replace(str(plain), "X") == \
            b.stdout.replace(str(bom), "X"), (b.stderr, a.stdout[:200], b.stdout[:200])
    assert all(p.returncode == 0 for p in done[2 * len(pairs):]), [p.stderr for p in done]
    assert prepared[0].read_bytes() == prepared[1].read_bytes()
    assert "\ufeff" not in paths.read_text(encoding="utf-8")
    assert nlmfeature.load(model_path).perplexity(str(bom)).log_prob == \
        nlmfeature.load(model_path).perplexity(str(plain)).log_prob


def test_tokens_split_on_ascii_white_space_only(tmp_path, contract):
    from nlmfeature.io.textio import split_tokens

    assert split_tokens("a\u00a0b c\u3000d\te\x0bf\x0cg\r") == ["a\u00a0b", "c\u3000d", "e", "f", "g"]
    assert split_tokens("a\x1cb\u2003c") == ["a\x1cb\u2003c"]
    model = nlmfeature.load(make_model(tmp_path))
    line = "the\u00a0jury said\u3000it"
    assert len(model.score_sentence(line)) == 3          # two tokens and </s>, as a decoder sees it
    # the C library scores the line as a decoder's tokens reach it: the same scores
    exe = str(tmp_path / "test_capi")
    flags = lambda f: subprocess.run([sys.executable, "-m", "nlmfeature.cli", "config", f],  # noqa: E731
                                     check=True, capture_output=True, text=True, env=ENV).stdout.split()
    subprocess.run(["cc", "-O1", *flags("--cflags"), os.path.join(HERE, "c", "test_capi.c"), "-o", exe,
                    *flags("--libs"), "-lpthread", "-lm"], check=True)
    text = tmp_path / "text.txt"
    text.write_text(line + "\n" + "a\u00a0man\u00a0runs .\n", encoding="utf-8")
    p = subprocess.run([exe, "score", model.path, str(text)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    c_scores = [[float(x) for x in l.split()] for l in p.stdout.splitlines()]
    for c, l in zip(c_scores, read_lines(str(text))):
        np.testing.assert_allclose(c, model.score_sentence(l), rtol=0, atol=1e-6)


def test_literal_boundary_markers_in_scored_text_are_unknown_words(tmp_path):
    from nlmfeature.mt.rescore import sentence_logprobs

    model = nlmfeature.load(make_model(tmp_path, output="class", classes=20))
    unk = model.score_sentence("the <unk> jury <unk> said <unk>")
    got = model.score_sentence("the <s> jury </s> said <null>")
    np.testing.assert_array_equal(got, unk)
    toks = "the </s> jury said".split()
    assert sentence_logprobs(model, [toks])[0] == pytest.approx(model.sentence_logprob(toks), abs=1e-6)
    ppl = model.perplexity(["the <s> jury"])
    assert ppl.oovs == 1


# -- 9. the Python API's arguments -----------------------------------------------------------------------
def test_python_api_refuses_wrong_arguments(tmp_path, monkeypatch):
    from nlmfeature.decoder.pcache import CachedScorer

    model = nlmfeature.load(make_model(tmp_path))
    ctx, words = model.sentence_ngrams("the jury said")
    big = words.astype(np.int64)
    big[0] = (1 << 32) + 5                       # would be id 5 as int32
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.score_batch(ctx, big)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.score_batch(ctx, -np.ones_like(words))
    s = model.session()
    with pytest.raises(TypeError):
        s.score(None, int(words[0]))
    with pytest.raises(TypeError):
        s.score_padded(None, words)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="directory must be a path"):
        CachedScorer(model, 123)
    assert not (tmp_path / "123").exists()
    for sentence in ({"the": 1, "jury": 2}, {"the", "jury"}, 42):
        with pytest.raises(TypeError):
            model.score_sentence(sentence)
    for flag in ("no", 1, None):
        with pytest.raises(TypeError, match="bos must be True or False"):
            model.score_sentence("the jury", bos=flag)
    with pytest.raises(TypeError, match="eos must be True or False"):
        model.sentence_ngrams("the jury", eos="yes")
    assert model.score_sentence("the jury", bos=np.bool_(True)).shape == (3,)
