"""The guards every command gets from nlmfeature.cli before it does any work, checked on every
command found in the parsers (nothing hard-coded): every numeric flag at 0, -1, a huge value and
NaN; every output given the path of each input and of each other output.  Each refusal is exit
2, one line naming the flag or the file, no traceback, and nothing read or written.  Then the
errors that came too late or as tracebacks: full disks, impossible training settings, JSON with
NaN, empty perplexity, stale temporary files, cache files that are not cache files."""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from nlmfeature.training.corpusfile import open_corpus

from helpers import (BROWN_TRAIN, BROWN_VALID, CLI_ENV as ENV, DATA, ROOT, make_model, one_line_error,
                     read_lines, run_cli)
from nlmfeature import cli
from nlmfeature.commands import base
from nlmfeature.io.jsonout import dumps_json

KBEST = os.path.join(DATA, "kbest", "moses-multi30k-dev10.100best.gz")
KBEST_REF = os.path.join(DATA, "kbest", "multi30k-dev10.ref.en")

BAD_NUMBERS = ("0", "-1", str(10 ** 30), "nan")


@functools.lru_cache(maxsize=1)
def parser() -> argparse.ArgumentParser:
    """The ``nlmfeature`` parser, built once for the hundreds of command lines tried here (it
    holds no state between parses)."""
    return cli.build_parser()


def in_process(argv, capsys):
    """(exit status, standard error) of ``nlmfeature ARGV`` run in this process (as
    ``cli.main``: the error handler on the whole parser)."""
    capsys.readouterr()
    try:
        status = base.run(parser(), [str(a) for a in argv])
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


def leaves():
    return [(path, sp) for path, _, sp in base.leaves(parser())]


def _flag(a: argparse.Action) -> str:
    return max(a.option_strings, key=len) if a.option_strings else a.dest


def numeric_flags():
    for path, sp in leaves():
        for a in sp._actions:
            if isinstance(a.type, base.Number) or a.type in (int, float):
                yield path, sp, a


def test_every_numeric_flag_has_a_finite_range():
    found = list(numeric_flags())
    assert len(found) > 80
    for path, _, a in found:
        assert isinstance(a.type, base.Number), (path, a.option_strings)
        if a.type.kind is int:
            assert a.type.lo is not None and a.type.hi is not None, (path, a.option_strings)
            assert a.type.hi <= 1 << 62
        if a.dest in ("threads", "jobs"):
            assert a.type.lo == 1 and a.type.hi <= max(256, 4 * os.cpu_count())


@pytest.mark.parametrize("value", BAD_NUMBERS)
def test_every_numeric_flag_refuses_values_outside_its_range(value, capsys):
    """Every command, every numeric flag: a value outside the flag's range is refused while the
    arguments are read (exit 2, one line naming the flag, nothing done); NaN and a huge
    number are outside every range."""
    tried = 0
    for path, sp, a in numeric_flags():
        if a.type.accepts(a.type.kind(value) if value != "nan" else math.nan):
            assert value in ("0", "-1"), (path, _flag(a), value)
            continue
        n = a.nargs if isinstance(a.nargs, int) else 1
        argv = path + ([_flag(a)] if a.option_strings else []) + [value] * n
        status, err = in_process(argv, capsys)
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1, (argv, status, err)
        assert f"argument {_flag(a)}" in lines[0] or f"argument {'/'.join(a.option_strings)}" \
            in lines[0], (argv, lines[0])
        tried += 1
    assert tried > (80 if value in ("nan", str(10 ** 30)) else 20)


@pytest.mark.parametrize("argv, needle", [
    (["train", "--threads", "0"], "--threads"), (["train", "--threads", "-1"], "--threads"),
    (["train", "--threads", "100000"], "--threads"), (["train", "--word-width", "0"], "--word-width"),
    (["train", "--word-width", "-1"], "--word-width"), (["train", "--hidden-layers", "0"], "--hidden-layers"),
    (["train", "--hidden-layers", "-1"], "--hidden-layers"), (["train", "--seed", "-1"], "--seed"),
    (["train", "--step-size", "-1"], "--step-size"), (["train", "--max-updates", "-1"], "--max-updates"),
    (["train", "--max-minutes", "-1"], "--max-minutes"), (["train", "--hash-space", str(1 << 31)], "--hash-space"),
    (["train", "--hash-space", "-1"], "--hash-space"), (["train", "--branches", "0"], "--branches"),
    (["train", "--branches", "-1"], "--branches"), (["train", "--hidden", "-1"], "--hidden"),
    (["train", "--max-vocab", "0"], "--max-vocab"), (["train", "--noise-samples", "100000000"], "--noise-samples"),
    (["tune", "optimise", "--C", "nan"], "--C"), (["tune", "optimise", "--random-range", "nan", "inf"], "--random-range"),
    (["perplexity", "--kenlm-order", "99"], "--kenlm-order"), (["rescore", "-j", "0"], "--jobs"),
    (["cache", "d", "--prune", "99999999999999999999T"], "--prune"),
])
def test_the_reported_flags_are_refused(argv, needle, capsys):
    status, err = in_process(argv, capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1, (argv, err)
    assert ": error: argument " in err and needle in err, (argv, err)      # refused as it is read


def test_random_range_must_be_a_range(tmp_path):
    one_line_error(run_cli("tune", "optimise", "--nbest", KBEST, "--ref", KBEST_REF, "-o",
                           tmp_path / "w", "--random-range", "5", "1"), "LO must be below HI")
    assert not (tmp_path / "w").exists()


# -- outputs that are inputs ------------------------------------------------------------------------
def _is_path_like(a: argparse.Action) -> bool:
    return (a.option_strings or a.dest not in ("command", "tune_command", "querylog_command")) and \
        a.nargs != 0 and a.choices is None and a.type in (None, str) and \
        not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction))


def _base_argv(path, sp, tmp):
    """Arguments that parse: every required flag or positional with a placeholder."""
    argv = list(path)
    for a in sp._actions:
        if not a.required or a.nargs == 0:
            continue
        value = a.choices and sorted(a.choices)[0] or str(tmp / f"placeholder-{a.dest}")
        argv += ([_flag(a)] if a.option_strings else []) + [value]
    return argv


def _with(argv, a, value):
    """``argv`` with action ``a`` set to ``value`` (replacing a placeholder of it)."""
    placeholder = f"placeholder-{a.dest}"
    if any(x.endswith(placeholder) for x in argv):
        return [value if x.endswith(placeholder) else x for x in argv]
    return argv + ([_flag(a)] if a.option_strings else []) + [value]


def output_cases():
    for path, sp in leaves():
        outs = [a for a in sp._actions if _is_path_like(a) and base.is_output(a)]
        others = [a for a in sp._actions if _is_path_like(a) and not base.is_output(a)]
        if any(x.option_strings for x in outs):   # optional positional outputs beside -o: the flag is tried
            outs = [x for x in outs if x.option_strings or x.required]
        for o in outs:
            for i in others:
                yield path, sp, o, i, "input"
            for o2 in outs:
                if o2 is not o and id(o2) > id(o):
                    yield path, sp, o, o2, "output"


def test_every_output_is_refused_when_it_is_an_input_or_another_output(tmp_path, capsys):
    cases = list(output_cases())
    commands = {tuple(c[0]) for c in cases}
    assert {("train",), ("cluster",), ("rescore",), ("tune", "optimise"), ("ensemble",),
            ("convert",), ("prepare",)} <= commands, commands
    victim = tmp_path / "precious.txt"
    link = tmp_path / "link.txt"
    os.symlink(victim, link)
    for path, sp, out, other, kind in cases:
        victim.write_text("the jury said\n", encoding="utf-8")
        argv = _base_argv(path, sp, tmp_path)
        if kind == "input":         # the output names the input through a symbolic link
            argv = _with(_with(argv, other, str(victim)), out, str(link))
            needle = "would overwrite the input"
        else:
            new = str(tmp_path / "new-output")
            argv = _with(_with(argv, other, new), out, new)
            needle = "name the same file"
        status, err = in_process(argv, capsys)
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and needle in lines[0], (argv, status, err)
        assert victim.read_text(encoding="utf-8") == "the jury said\n", argv
        assert not os.path.exists(tmp_path / "new-output")


@pytest.mark.parametrize("args", [
    ["train", "--train", "{T}", "--model-out", "{T}"],
    ["cluster", "--text", "{T}", "--out", "{T}"],
    ["tune", "optimise", "--nbest", "{K}", "--ref", KBEST_REF, "-o", "{K}"],
    ["rescore", "-m", "{M}", "-i", KBEST, "-o", "{M}"],
    ["rescore", "-m", "{M}", "-i", KBEST, "-o", "{O}", "--one-best", "{O}", "--weights", "{W}"],
])
def test_the_reported_commands_keep_their_input(tmp_path, args):
    text = tmp_path / "t.txt"
    text.write_text("\n".join(read_lines(BROWN_VALID, 50)) + "\n", encoding="utf-8")
    kbest = tmp_path / "k.kbest.gz"
    kbest.write_bytes(open(KBEST, "rb").read())
    model = make_model(tmp_path)
    hard = tmp_path / "hard-link-to-model.nlm"      # the same file under another name
    os.link(model, hard)
    weights = tmp_path / "w.txt"
    weights.write_text("LM0= 0.1\n", encoding="utf-8")
    subst = {"{T}": str(text), "{K}": str(kbest), "{M}": str(model), "{O}": str(tmp_path / "o"),
             "{W}": str(weights)}
    argv = [subst.get(a, a) for a in args]
    if "-o" in argv and argv[argv.index("-o") + 1] == str(model):
        argv[argv.index("-o") + 1] = str(hard)
    before = {p: open(p, "rb").read() for p in (text, kbest, model)}
    one_line_error(run_cli(*argv))
    for p, data in before.items():
        assert open(p, "rb").read() == data
    assert not (tmp_path / "o").exists()


# -- errors that came too late or as tracebacks --------------------------------------------------------
def _cli_with_file_limit(argv, limit):
    """``nlmfeature ARGV`` in a subprocess that may write no file larger than ``limit`` bytes
    (set in the child before the package loads; EFBIG instead of SIGXFSZ)."""
    code = ("import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
            "sys.argv[0] = 'nlmfeature'; runpy.run_module('nlmfeature.cli', run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code, *map(str, argv)], capture_output=True, text=True,
                          cwd=ROOT, env=ENV, timeout=300)


def test_a_full_disk_is_one_line_and_the_old_output_survives(tmp_path):
    """Every writer under a file-size limit (what a full disk looks like to a writer: the write
    fails part way): exit 2, one line naming the reason, the previous output intact, no
    temporary file left.  The commands run side by side, each with its own output folder."""
    a = make_model(tmp_path, "a.nlm", seed=1)
    b = make_model(tmp_path, "b.nlm", seed=2)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(read_lines(BROWN_TRAIN, 300)) + "\n", encoding="utf-8")
    corpora = tmp_path / "corpora"
    open_corpus(str(text), str(corpora))     # train's compiled text exists: the model write is what fails
    commands = [
        ["ensemble", a, b, "-o", "{out}"],
        ["convert", a, "{out}", "--float16"],
        ["rescore", "-m", a, "-i", KBEST, "-o", "{out}"],
        ["cluster", "--text", text, "-o", "{out}", "--classes", "5", "--corpus-dir", corpora],
        ["train", "--train", text, "-o", "{out}", "--iterations", "1", "--word-width", "8",
         "--order", "3", "--no-progress", "--corpus-dir", corpora],
        ["tune", "optimise", "--nbest", KBEST, "--ref", KBEST_REF, "-o", tmp_path / "w.txt",
         "--save-pool", "{out}", "--algorithm", "mira", "--epochs", "2",
         "--init", os.path.join(DATA, "kbest", "multi30k-dev.iter2.moses.ini")],
        ["prepare", "-l", "en", "-i", text, "-o", "{out}"],
    ]
    outs = []
    for i in range(len(commands)):
        out = tmp_path / f"out{i}" / "result"
        out.parent.mkdir()
        out.write_bytes(b"old output\n")
        outs.append(out)
    argvs = [[out if a == "{out}" else a for a in argv] for argv, out in zip(commands, outs)]
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        done = list(pool.map(lambda argv: _cli_with_file_limit(argv, 8192), argvs))
    for argv, out, p in zip(argvs, outs, done):
        assert p.returncode == 2 and "Traceback" not in p.stderr, (argv, p.stderr)
        errors = [l for l in p.stderr.splitlines() if ": error: " in l]
        assert len(errors) == 1 and p.stderr.rstrip().endswith(errors[0]), p.stderr
        assert f"{out}: File too large" in errors[0] or f"{out}: No space" in errors[0], errors
        assert out.read_bytes() == b"old output\n", argv
        assert sorted(os.listdir(out.parent)) == ["result"], (argv, os.listdir(out.parent))


def test_standard_output_on_a_full_device(tmp_path):
    model = make_model(tmp_path)
    with open("/dev/full", "w") as full:
        for argv in (["score", "-m", model, "-i", BROWN_VALID],
                     ["eval", "--ref", BROWN_VALID, BROWN_VALID]):
            p = subprocess.run([sys.executable, "-m", "nlmfeature.cli", *argv], stdout=full,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV, timeout=300)
            assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1 and "No space left on device" in lines[0], p.stderr


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    a = make_model(tmp_path, "a.nlm", seed=1)
    b = make_model(tmp_path, "b.nlm", seed=2)
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "60"])
    try:
        stale = tmp_path / f".ens.nlm.{dead.pid}.k2j3.tmp"
        stale.write_bytes(b"x" * 1000)
        ckpt = tmp_path / f".ens.nlm.ckpt.npz.{dead.pid}.ab12.npz"
        ckpt.write_bytes(b"y")
        busy = tmp_path / f".ens.nlm.{live.pid}.zz99.tmp"
        busy.write_bytes(b"z")
        foreign = tmp_path / ".ens.nlm.notes"
        foreign.write_bytes(b"w")
        assert run_cli("ensemble", a, b, "-o", tmp_path / "ens.nlm").returncode == 0
        assert not stale.exists() and busy.exists() and foreign.exists()
        assert ckpt.exists()        # another output's (the checkpoint's writer removes it)
        from nlmfeature.io.atomicfile import atomic_write_bytes

        atomic_write_bytes(str(tmp_path / "ens.nlm.ckpt.npz"), b"new")
        assert not ckpt.exists() and busy.exists()
    finally:
        live.kill()
        live.wait()


def test_impossible_training_settings_are_refused_before_training(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("\n".join(read_lines(BROWN_VALID, 100)) + "\n", encoding="utf-8")
    for extra, needle in ((["--output", "tree"], "direct features"),
                          (["--self-normalise", "0.1", "--noise-samples", "5"], "--self-normalise"),
                          (["--output", "tree", "--noise-samples", "5", "--direct-order", "0"],
                           "--noise-samples 0")):
        p = run_cli("train", "--train", text, "-o", tmp_path / "m.nlm", "--word-width", "8",
                    "--order", "3", *extra, timeout=60)
        one_line_error(p, needle)
        assert "impossible settings" in p.stderr
        assert sorted(os.listdir(tmp_path)) == ["t.txt"]


def test_json_never_holds_nan(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("\n".join(read_lines(BROWN_VALID, 120)) + "\n", encoding="utf-8")
    p = run_cli("train", "--train", text, "-o", tmp_path / "m.nlm", "--word-width", "8",
                "--order", "3", "--iterations", "1", "--no-progress", "--json")
    assert p.returncode == 0, p.stderr

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    doc = json.loads(p.stdout, parse_constant=refuse)
    assert doc["best_perplexity"] is None or math.isfinite(doc["best_perplexity"])
    assert dumps_json({"a": [float("nan"), 1.5, float("-inf")]}) == '{"a": [null, 1.5, null]}'


def test_perplexity_of_an_empty_file_is_an_error(tmp_path):
    model = make_model(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    one_line_error(run_cli("perplexity", "-m", model, "--test", empty, "--json"), "empty")


def test_cache_clear_deletes_only_cache_files(tmp_path):
    from nlmfeature.decoder.pcache import CachedScorer, cache_files

    model = nlmfeature_load(make_model(tmp_path, output="class", classes=20))
    cache = tmp_path / "cache"
    cs = CachedScorer(model, str(cache), policy="always")
    cs.begin(0)
    cs.score_sentence("the jury said")
    cs.end()
    sub = cache / model.checksum
    real = sorted(os.listdir(sub))
    assert any(n.endswith(".nlmc") for n in real)
    impostor = sub / "5.nlmc"
    impostor.write_text("my notes, not a cache file\n")
    verify = run_cli("cache", cache, "--verify")
    assert "5.nlmc: not an nlmfeature cache file" in verify.stdout + verify.stderr
    p = run_cli("cache", cache, "--clear")
    assert p.returncode == 0, p.stderr
    assert impostor.exists() and sorted(os.listdir(sub)) in (["5.nlmc"], [".lock", "5.nlmc"])
    assert [p for _, p in cache_files(str(cache))] == [str(impostor)]


def nlmfeature_load(path):
    import nlmfeature

    return nlmfeature.load(path)


def _workers(pid):
    """Process ids of the multiprocessing workers of process ``pid``."""
    found = []
    try:
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        return found
    for child in children:
        try:
            cmd = open(f"/proc/{child}/cmdline", "rb").read()
        except OSError:
            continue
        if b"spawn_main" in cmd:
            found.append(int(child))
    return found


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs /proc")
def test_a_killed_rescore_worker_is_a_clear_error(tmp_path):
    import gzip
    import time

    model = make_model(tmp_path)
    fifo = tmp_path / "kbest.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    p = subprocess.Popen([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", model, "-i",
                          str(fifo), "-o", str(out), "-j", "2", "--chunk-size", "20"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    lines = gzip.open(KBEST, "rb").read().splitlines(keepends=True)
    try:
        # unbuffered: once the command stops reading, nothing is left to flush at close
        with open(fifo, "wb", buffering=0) as f:
            f.write(b"".join(lines[:300]))
            deadline = time.time() + 120
            while not _workers(p.pid) and time.time() < deadline:
                time.sleep(0.05)
            workers = _workers(p.pid)
            assert workers, "no worker process started"
            os.kill(workers[0], signal.SIGKILL)
            try:
                f.write(b"".join(lines[300:]))
            except BrokenPipeError:
                pass
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 2 and "Traceback" not in err and "BrokenProcessPool" not in err, err
    errors = [l for l in err.splitlines() if ": error: " in l]
    assert len(errors) == 1 and "worker process died" in errors[0], err
    assert out.read_text() == "old\n"
