"""The C library: a C program built against the installed header and library scores a real
text from several threads; its scores equal the Python scorer's.  Persistent cache through
the C API (round trip, concurrent writer processes, corrupt and foreign files, a changed
model) and bad model files (error code + message, no abort)."""
from __future__ import annotations

import math
import os
import resource
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_VALID, cli_in_process, make_model, read_lines
from nlmfeature.commands import config as nlmconfig
from nlmfeature.decoder.pcache import read_sentence

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "c", "test_capi.c")
TEXT_LINES = 120  # sentences of the real Brown validation text used by most tests
# the persistent-cache tests use the cheap unnormalised model, which the automatic policy skips
ALWAYS = dict(os.environ, NLMFEATURE_PERSISTENT_CACHE="always")

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def _config(*flags: str) -> list:
    # the CLI of the package under test (the `nlmfeature` script on PATH may belong to another
    # installation, e.g. an editable install of another checkout)
    out = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "config", *flags], check=True,
                         capture_output=True, text=True, cwd=os.path.dirname(HERE))
    return shlex.split(out.stdout)


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> str:
    """tests/c/test_capi.c compiled with `nlmfeature config --cflags/--libs`."""
    if not os.path.exists(nlmconfig.paths()["library"]):
        pytest.fail("libnlmfeature.so is not built: run python setup.py build_ext --inplace")
    exe = str(tmp_path_factory.mktemp("capi") / "test_capi")
    cmd = ["cc", "-O1", "-Wall", "-Werror", *_config("--cflags"), SOURCE, "-o", exe,
           *_config("--libs"), "-lpthread", "-lm"]
    subprocess.run(cmd, check=True)
    return exe


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("capi_models")
    return {
        "unnormalised": make_model(d, "unnorm.nlm", order=5),
        "class": make_model(d, "class.nlm", order=4, output="class", classes=30, seed=3),
        "other": make_model(d, "other.nlm", order=5, seed=7),
        "direct": make_model(d, "direct.nlm", order=5, direct_order=3, hash_space=997, seed=5),
    }


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("capi_text") / "text.txt"
    path.write_text("\n".join(read_lines(BROWN_VALID, TEXT_LINES)) + "\n", encoding="utf-8")
    return str(path)


def run_score(binary, model, text, *extra, env=None, check=True):
    p = subprocess.run([binary, "score", model, text, *extra], capture_output=True, text=True, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"test_capi failed ({p.returncode}):\n{p.stderr}")
    scores = [[float(x) for x in line.split()] for line in p.stdout.splitlines()]
    stats = []
    for line in p.stderr.splitlines():
        if line.startswith("stats "):
            stats.append({k: int(v) for k, v in (f.split("=") for f in line.split()[1:])})
    return scores, stats, p.stderr


def python_scores(model_path, text):
    m = nlmfeature.load(model_path)
    return [m.score_sentence(line) for line in read_lines(text)]


def assert_same(c_scores, py_scores, tol=1e-6):
    assert len(c_scores) == len(py_scores)
    for i, (a, b) in enumerate(zip(c_scores, py_scores)):
        assert len(a) == len(b), f"sentence {i}: {len(a)} vs {len(b)} tokens"
        np.testing.assert_allclose(a, b, rtol=0, atol=tol, err_msg=f"sentence {i}")


@pytest.mark.parametrize("kind", ["unnormalised", "class"])
def test_four_threads_match_python(binary, models, text, kind):
    c_scores, stats, _ = run_score(binary, models[kind], text, "--threads", "4")
    assert_same(c_scores, python_scores(models[kind], text))
    assert len(stats) == 4
    n_tokens = sum(len(s) for s in c_scores)
    for st in stats:
        assert st["lookups"] == n_tokens and st["sentences"] == TEXT_LINES
        assert st["nlm_ns"] == 0   # timing is off unless asked for


def test_timing_counts_the_time_inside_the_scorer(binary, models, text):
    # NLMFEATURE_TIMING=1: nanoseconds inside the scorer's calls; the scores are unchanged
    env = dict(os.environ, NLMFEATURE_TIMING="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    c_scores, stats, _ = run_score(binary, models["class"], text, "--threads", "1", env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert_same(c_scores, python_scores(models["class"], text))
    n_tokens = sum(len(s) for s in c_scores)
    # a class-factored lookup without caches costs well over a nanosecond and under 10 ms
    assert n_tokens < stats[0]["nlm_ns"] < 10_000_000 * n_tokens
    # and the time inside the scorer is part of the process's CPU time (a sampled clock that
    # over-counted -- a cold system call's cost times the sampling stride -- broke this)
    cpu_ns = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1e9
    assert stats[0]["nlm_ns"] < cpu_ns


def test_plain_c_program_needs_no_setup(binary, models, text):
    """No PYTHONPATH, PYTHONHOME or virtualenv variables: the library finds its own Python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "NLMFEATURE"))}
    env["PATH"] = "/usr/bin:/bin"
    env["HOME"] = "/nonexistent"
    c_scores, _, _ = run_score(binary, models["unnormalised"], text, "--threads", "2", env=env)
    assert_same(c_scores, python_scores(models["unnormalised"], text))


def test_vocabulary_enumeration(binary, models):
    out = subprocess.run([binary, "vocab", models["unnormalised"]], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    m = nlmfeature.load(models["unnormalised"])
    fields = dict(f.split("=") for f in out.stdout.split())
    assert int(fields["vocab"]) == len(m.vocab)
    assert int(fields["order"]) == 5 and int(fields["state"]) == 4
    assert fields["checksum"] == m.checksum
    assert fields["bad"] == "0" and fields["output"] == "0"


def test_partial_contexts_use_null_and_bos_padding(binary, models):
    words = "the jury said it did".split()
    out = subprocess.run([binary, "partial", models["unnormalised"], *words], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = {k: float(v) for k, v in (line.split() for line in out.stdout.splitlines())}
    m = nlmfeature.load(models["unnormalised"])
    null = m.vocab.null
    for i in range(len(words)):
        ctx = words[len(words) - 1 - i:len(words) - 1]
        # i known words, <null> before them
        expect = m.score_ngram(["<null>"] * (m.order - 1 - len(ctx)) + ctx, words[-1]) if len(ctx) < m.order - 1 \
            else m.score_ngram(ctx, words[-1])
        assert got[f"null{i}"] == pytest.approx(expect, abs=1e-6)
        assert got[f"bos{i}"] == pytest.approx(m.score_ngram(["<s>"] + words[:i], words[i]), abs=1e-6)
        assert null == 3
    # a sequence without <s> is scored with <null> padding throughout
    seq = [m.score_ngram(["<null>"] * (m.order - 1 - min(i, m.order - 1)) + words[max(0, i - m.order + 1):i], w)
           for i, w in enumerate(words)]
    for i, v in enumerate(seq):
        assert got[f"seq{i}"] == pytest.approx(v, abs=1e-6)
    assert got["sequence"] == pytest.approx(sum(seq), abs=1e-5)


@pytest.mark.parametrize("kind", ["unnormalised", "class", "direct"])
def test_batched_spans_equal_single_spans(binary, models, kind):
    """nlm_score_spans (a batch of hypothesis expansions in one call) returns, for each span,
    the very double of the per-word calls: with the memo on (the batch's second copy of each
    span answered by the first's entries) and off; invalid spans among them come back NaN with
    NLM_ERR_ARGUMENT while the rest are scored; an empty batch is NLM_OK, a NULL session an
    error.  The exact n-gram cache by default: a class model's always, an unnormalised model
    with direct features' from its first batch (word by word it goes without), a tiny
    unnormalised model's never."""
    words = "<s> the jury said it did find that the election".split()
    out = subprocess.run([binary, "spans", models[kind], *words], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr + out.stdout
    got = dict(kv.split("=") for kv in out.stdout.split())
    assert int(got["bad"]) == 0
    assert int(got["checked"]) > 600
    assert int(got["nan"]) == 2 * 3
    assert int(got["empty"]) == 0 and int(got["null"]) < 0
    single, batched = int(got["ref_ngram_hits"]), int(got["batch_ngram_hits"])
    assert (single > 0, batched > 0) == {"class": (True, True), "direct": (False, True),
                                         "unnormalised": (False, False)}[kind], (single, batched)


@pytest.mark.parametrize("kind", ["unnormalised", "class"])
def test_span_scores_equal_per_word_scores(binary, models, kind):
    """nlm_score_span (one call per hypothesis expansion, memoised per sentence) returns exactly
    the summed per-word scores, on a memo miss, on a hit, with the memo off and after
    nlm_prefetch_span of that span or of another one."""
    words = "<s> the jury said it did find that the election".split()
    out = subprocess.run([binary, "span", models[kind], *words], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr + out.stdout
    got = dict(kv.split("=") for line in out.stdout.splitlines() for kv in line.split())
    assert int(got["bad"]) == 0
    assert int(got["checked"]) > 100
    assert int(got["prefetched"]) == int(got["checked"])
    # the second pass over the same spans is answered by the memo (a direct-mapped cache of 16384
    # slots: a few of the ~350 spans may share a slot; spans longer than the memo key are computed
    # directly and not counted)
    calls, hits = int(got["span_calls"]), int(got["span_hits"])
    assert calls > 100 and 0.45 * calls <= hits <= 0.5 * calls
    assert int(got["hits_after_begin"]) == 0


def test_persistent_cache_round_trip(binary, models, text, tmp_path):
    d = str(tmp_path / "pc")
    first, st1, _ = run_score(binary, models["unnormalised"], text, "--threads", "2", "--pcache", d, env=ALWAYS)
    second, st2, _ = run_score(binary, models["unnormalised"], text, "--threads", "2", "--pcache", d, env=ALWAYS)
    assert first == second  # bit-identical through the files
    assert_same(second, python_scores(models["unnormalised"], text))
    assert sum(s["files_written"] for s in st1) >= TEXT_LINES
    n_tokens = sum(len(s) for s in first)
    m = nlmfeature.load(models["unnormalised"])
    files = sorted(os.listdir(os.path.join(d, m.checksum)))
    cache_files = [f for f in files if f.endswith(".nlmc")]
    # one base per sentence; a thread that began a sentence before the other's base existed
    # adds a delta (the same entries: harmless)
    assert len({f.split(".")[0] for f in cache_files}) == TEXT_LINES
    assert not [f for f in files if f.endswith(".tmp")]
    for st in st2:
        # every lookup of the second run is answered from disk; nothing new to write
        assert st["persistent_hits"] == st["lookups"] == n_tokens
        assert st["files_written"] == 0 and st["files_read"] == len(cache_files)


def _check_files_hold(model_path, d, text):
    """Every sentence's file holds exactly the sentence's n-grams with the model's scores."""
    m = nlmfeature.load(model_path)
    for i, line in enumerate(read_lines(text)):
        cf = read_sentence(os.path.join(d, m.checksum), i)
        ctx, words = m.sentence_ngrams(line)
        want = {tuple(c) + (w,) for c, w in zip(ctx.tolist(), words.tolist())}
        got = {tuple(k): v for k, v in zip(cf.keys.tolist(), cf.scores.tolist())}
        assert set(got) == want, f"sentence {i}"
        exact = dict(zip((tuple(c) + (w,) for c, w in zip(ctx.tolist(), words.tolist())),
                         m.score_sentence(line).tolist()))
        for k, v in got.items():
            assert v == pytest.approx(exact[k], abs=1e-6)


def test_concurrent_writer_processes_merge(binary, models, text, tmp_path):
    """Two processes (2 threads each) write the same directory at once, each scoring half of
    every sentence's n-grams: afterwards every file holds the union, and is valid."""
    d = str(tmp_path / "pc")
    procs = [subprocess.Popen([binary, "score", models["unnormalised"], text, "--threads", "2",
                               "--pcache", d, "--subset", f"{k}/2"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ALWAYS)
             for k in (0, 1)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "warning" not in err
    _check_files_hold(models["unnormalised"], d, text)


def test_corrupt_cache_file_is_ignored_and_rewritten(binary, models, text, tmp_path):
    d = str(tmp_path / "pc")
    run_score(binary, models["unnormalised"], text, "--threads", "1", "--pcache", d, env=ALWAYS)
    m = nlmfeature.load(models["unnormalised"])
    sub = os.path.join(d, m.checksum)
    # flip a byte inside a score, truncate another file, replace a third with garbage
    p3 = os.path.join(sub, "3.nlmc")
    data = bytearray(open(p3, "rb").read())
    data[-12] ^= 0x40
    open(p3, "wb").write(bytes(data))
    p5 = os.path.join(sub, "5.nlmc")
    open(p5, "r+b").truncate(os.path.getsize(p5) - 9)
    open(os.path.join(sub, "7.nlmc"), "wb").write(b"not a cache file at all")
    scores, stats, err = run_score(binary, models["unnormalised"], text, "--threads", "1", "--pcache", d, env=ALWAYS)
    assert_same(scores, python_scores(models["unnormalised"], text))
    assert "3.nlmc: corrupted (checksum mismatch)" in err
    assert "5.nlmc: truncated" in err
    assert "7.nlmc" in err and "not an nlmfeature cache file" in err
    assert stats[0]["files_ignored"] == 3 and stats[0]["files_written"] == 3
    _check_files_hold(models["unnormalised"], d, text)  # rewritten, valid


def test_changed_model_never_reuses_entries(binary, models, text, tmp_path):
    d = str(tmp_path / "pc")
    run_score(binary, models["unnormalised"], text, "--threads", "1", "--pcache", d, env=ALWAYS)
    a = nlmfeature.load(models["unnormalised"])
    b = nlmfeature.load(models["other"])
    assert a.checksum != b.checksum
    # plant model A's files where model B's would be: they must be recognised as foreign
    os.makedirs(os.path.join(d, b.checksum))
    for i in range(3):
        shutil.copy(os.path.join(d, a.checksum, f"{i}.nlmc"), os.path.join(d, b.checksum, f"{i}.nlmc"))
    scores, stats, err = run_score(binary, models["other"], text, "--threads", "1", "--pcache", d, env=ALWAYS)
    assert_same(scores, python_scores(models["other"], text))
    assert stats[0]["persistent_hits"] == 0
    assert stats[0]["files_ignored"] == 3 and "another model" in err
    _check_files_hold(models["other"], d, text)


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def test_bad_model_files_return_errors(binary, models, tmp_path):
    good = open(models["unnormalised"], "rb").read()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 1
    cases = {
        "missing": (str(tmp_path / "nope.nlm"), "cannot open"),
        "directory": (str(tmp_path), ""),
        "empty": (_write(tmp_path / "empty.nlm", b""), "empty"),
        "garbage": (_write(tmp_path / "garbage.nlm", b"hello world, not a model" * 10), "bad magic"),
        "nplm": (_write(tmp_path / "nplm.txt", b"\\config\nversion 1\nngram_size 3\ninput_vocab_size 10\noutput_vocab_size 10\n"), "NPLM"),
        "truncated": (_write(tmp_path / "trunc.nlm", good[: len(good) - 100]), "truncated"),
        "corrupted": (_write(tmp_path / "flip.nlm", bytes(flipped)), "checksum mismatch"),
    }
    for name, (path, needle) in cases.items():
        p = subprocess.run([binary, "load", path], capture_output=True, text=True)
        assert p.returncode == 0, f"{name}: the process died: {p.stderr}"
        fields = p.stdout.split(" message=", 1)
        assert "status=-2" in fields[0] and "model_null=1" in fields[0], f"{name}: {p.stdout}"
        assert needle in fields[1], f"{name}: {fields[1]}"
        if name != "directory":
            assert path in fields[1], f"{name}: the message does not name the file"


def test_library_exports_only_the_api():
    lib = nlmconfig.paths()["library"]
    if shutil.which("nm") is None:
        pytest.skip("nm not available")
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True)
    names = [line.split()[-1] for line in out.stdout.splitlines() if line.split()[1] in "TtDdBbRr"]
    assert names and all(n.startswith("nlm_") for n in names), names
    assert "nlm_model_load" in names and "nlm_score" in names


def test_config_command(capsys):
    def config(*flags):
        status, out, err = cli_in_process(["config", *flags], capsys)
        assert status == 0, err
        return shlex.split(out)

    inc = config("--includedir")[0]
    assert os.path.exists(os.path.join(inc, "nlmfeature.h"))
    libs = config("--libs")
    assert "-lnlmfeature" in libs
    libdir = config("--libdir")[0]
    assert os.path.exists(os.path.join(libdir, "libnlmfeature.so"))
    # several flags print in the order asked, as in a process of their own
    assert config("--libdir", "--includedir") == [libdir, inc] == _config("--libdir", "--includedir")
