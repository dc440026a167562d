"""One command line: every command through the registry, one error handler, one set of flag
conventions, and the README's command table generated from the parsers."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

import pytest

from helpers import BROWN_VALID, DATA, make_model
from nlmfeature import cli
from nlmfeature.commands import base
from nlmfeature.commands import eval as evaluate
from nlmfeature.commands import rescore
from nlmfeature.commands import tune as tune_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
KBEST = os.path.join(DATA, "kbest", "moses-multi30k-dev10.100best.gz")
TOK_REF = os.path.join(DATA, "kbest", "multi30k-dev10.ref.en")
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))   # this checkout, not an installed copy


def run_cli(*args, stdin=None, **kw):
    return subprocess.run([sys.executable, "-m", "nlmfeature.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env=ENV, input=stdin, timeout=300, **kw)


def leaf_parsers():
    return list(base.leaves(cli.build_parser()))


# -- the registry ------------------------------------------------------------------------------
def test_rescore_tune_eval_are_subcommands_and_aliases_share_their_parsers():
    names = {tuple(path) for path, _, _ in leaf_parsers()}
    assert {("rescore",), ("eval",), ("tune", "optimise"), ("tune", "moses"), ("tune", "cdec"),
            ("tune", "bleu"), ("querylog", "pack"), ("querylog", "info")} <= names
    top = cli.build_parser()
    sub = {tuple(p): sp for p, _, sp in base.subparsers(top)}
    for alias_parser, name in ((rescore.build_parser(), "rescore"), (evaluate.build_parser(), "eval")):
        flags = lambda p: sorted(o for a in p._actions for o in a.option_strings)  # noqa: E731
        assert flags(base.finish(alias_parser)) == flags(sub[(name,)])
    alias_tune = {tuple(p) for p, _, _ in base.leaves(tune_cli.build_parser())}
    assert {("tune",) + p for p in alias_tune} == {n for n in names if n[0] == "tune"}


def test_subcommand_and_alias_give_the_same_output(tmp_path, capsys):
    model = make_model(tmp_path, output="class", classes=20)
    a, b = tmp_path / "a.gz", tmp_path / "b.gz"
    assert cli.main(["rescore", "-m", model, "-i", KBEST, "-o", str(a), "-q"]) == 0
    assert cli.rescore_main(["-m", model, "-i", KBEST, "-o", str(b), "-q"]) == 0
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size > 1000
    one = tmp_path / "one.txt"
    from nlmfeature.mt.kbest import group_by_sentence, read_kbest

    one.write_text("".join(g[0].text + "\n" for _, g in group_by_sentence(read_kbest(KBEST))))
    capsys.readouterr()
    assert cli.main(["eval", "--ref", TOK_REF, str(one), "--json"]) == 0
    via_sub = capsys.readouterr().out
    assert cli.eval_main(["--ref", TOK_REF, str(one), "--json"]) == 0
    assert capsys.readouterr().out == via_sub and "tok:none" in via_sub


def test_tune_and_eval_use_the_same_default_tokeniser(tmp_path):
    from nlmfeature.mt.bleu import DEFAULT_TOKENIZE

    top = cli.build_parser()
    eval_args = top.parse_args(["eval", "--ref", "r", "s"])
    tune_args = top.parse_args(["tune", "bleu", "x", "--ref", "r"])
    assert eval_args.tokenize == tune_args.tokenize == DEFAULT_TOKENIZE
    # and the scores agree: tune bleu on a 1-best file = eval's BLEU on it
    from nlmfeature.mt.kbest import group_by_sentence, read_kbest

    one = tmp_path / "one.txt"
    one.write_text("".join(g[0].text + "\n" for _, g in group_by_sentence(read_kbest(KBEST))))
    r1 = run_cli("tune", "bleu", str(one), "--ref", TOK_REF)
    r2 = run_cli("eval", "--ref", TOK_REF, str(one), "--metrics", "bleu")
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr, r2.stderr)
    bleu_tune = float(r1.stdout.split("BLEU = ")[1].split()[0])
    bleu_eval = float(r2.stdout.split("= ")[1].split()[0])
    assert bleu_tune == pytest.approx(bleu_eval, abs=0.01)


# -- flag conventions ----------------------------------------------------------------------------
def test_every_flag_is_explained_and_short_flags_mean_one_thing():
    for path, text, sp in leaf_parsers():
        where = "nlmfeature " + " ".join(path)
        assert text, f"{where}: no help line for the command list"
        opts = sp._option_string_actions
        assert "-q" in opts and "--quiet" in opts, f"{where}: no -q/--quiet"
        for a in sp._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            assert a.help and a.help != argparse.SUPPRESS, f"{where}: {a.option_strings or a.dest} unexplained"
        if "-m" in opts and path != ["eval"]:        # eval -m: sacrebleu's --metrics
            a = opts["-m"]
            assert "out" not in a.dest and "model" in (a.help + a.dest).lower(), \
                f"{where}: -m must be an input model"
        if "-o" in opts:
            a = opts["-o"]
            assert any(w in (a.help or "").lower() for w in ("write", "output")), \
                f"{where}: -o must be an output"
        for a in sp._actions:
            if a.dest in ("model_out", "out", "output"):
                assert "-m" not in a.option_strings, f"{where}: -m names an output"


def test_train_writes_the_model_given_with_o(tmp_path):
    args = cli.build_parser().parse_args(["train", "--train", BROWN_VALID, "-o", str(tmp_path / "m.nlm"), "-q"])
    assert args.model_out == str(tmp_path / "m.nlm") and args.progress is False


# -- the one error handler ----------------------------------------------------------------------
@pytest.mark.parametrize("argv,needle", [
    (["score", "-m", "/nonexistent/model.nlm"], "/nonexistent/model.nlm"),
    (["rescore", "-m", "MODEL", "-i", "/nonexistent/list.gz", "-o", "OUT"], "/nonexistent/list.gz"),
    (["eval", "--ref", "/nonexistent/ref.txt", "SYS"], "/nonexistent/ref.txt"),
    (["tune", "bleu", "/nonexistent/hyp.txt", "--ref", "REF"], "/nonexistent"),
    (["info", "DIR"], "DIR"),
])
def test_user_errors_are_one_line_without_traceback(tmp_path, argv, needle):
    model = make_model(tmp_path)
    argv = [a.replace("MODEL", model).replace("OUT", str(tmp_path / "o.gz"))
             .replace("SYS", BROWN_VALID).replace("REF", TOK_REF).replace("DIR", str(tmp_path))
            for a in argv]
    needle = needle.replace("DIR", str(tmp_path))
    r = run_cli(*argv)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"nlmfeature {argv[0]}") and ": error: " in lines[0], r.stderr
    assert needle in lines[0]


def test_aliases_report_errors_under_their_own_name(tmp_path):
    r = subprocess.run([sys.executable, "-c", "import sys; from nlmfeature.cli import eval_main as main; "
                        "sys.exit(main(['--ref', '/nonexistent/r', '/nonexistent/s']))"],
                       capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("nlmfeature-eval: error: /nonexistent/")
    assert "Traceback" not in r.stderr


def test_interrupt_exits_130_and_leaves_no_output(tmp_path):
    """SIGTERM (as Ctrl-C) during a rescoring run: exit 130, one line, no partial file."""
    model = make_model(tmp_path, output="softmax")
    out = tmp_path / "out.gz"
    big = tmp_path / "big.kbest"
    import gzip

    lines = gzip.open(KBEST, "rt", encoding="utf-8").read().splitlines()
    with open(big, "w", encoding="utf-8") as f:
        for copy in range(300):     # far more than can be scored before the signal
            for line in lines:
                sid, rest = line.split(" |||", 1)
                f.write(f"{int(sid) + 10 * copy} |||{rest}\n")
    p = subprocess.Popen([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", model, "-i",
                          str(big), "-o", str(out), "--skip-bad"], cwd=ROOT, env=ENV,
                         stderr=subprocess.PIPE, text=True)
    import time

    deadline = time.time() + 60          # the signal comes while the output is being written
    while time.time() < deadline and p.poll() is None and \
            not [f for f in os.listdir(tmp_path) if f.startswith(".out") and f.endswith(".tmp")]:
        time.sleep(0.05)
    time.sleep(0.2)
    assert p.poll() is None, "the run ended before the signal"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not out.exists() and not [f for f in os.listdir(tmp_path) if f.startswith(".out")]


def test_closed_stdout_ends_quietly(tmp_path):
    model = make_model(tmp_path)
    p1 = subprocess.Popen([sys.executable, "-m", "nlmfeature.cli", "score", "-m", model, "-i",
                           BROWN_VALID, "--per-word"], cwd=ROOT, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p1.stdout.readline()
    p1.stdout.close()            # as `| head -1`
    err = p1.stderr.read().decode()
    assert p1.wait(timeout=120) == 0 and err == ""


# -- README --------------------------------------------------------------------------------------
def test_readme_command_table_is_current():
    """The README's table is what `python3 -m nlmfeature.cli --readme README.md` writes."""
    assert cli.update_readme(README, check=True), \
        "README.md's command table is stale: run python3 -m nlmfeature.cli --readme README.md"
    text = open(README, encoding="utf-8").read()
    for path, _, _ in leaf_parsers():
        assert f"`nlmfeature {' '.join(path)}" in text
    assert "`nlmfeature querylog pack" in text


def test_readme_table_writer(tmp_path):
    stale = tmp_path / "README.md"
    stale.write_text(f"intro\n\n{cli.README_BEGIN}\n| old |\n{cli.README_END}\n\nrest\n")
    r = run_cli("--readme", str(stale), "--check")
    assert r.returncode == 1
    assert run_cli("--readme", str(stale)).returncode == 0
    text = stale.read_text()
    assert text.startswith("intro\n") and text.endswith("\nrest\n") and "| old |" not in text
    assert cli.command_table() in text
    assert run_cli("--readme", str(stale), "--check").returncode == 0
