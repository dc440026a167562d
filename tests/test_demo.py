"""The README's main job, on a slice of its bundled data."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from nlmfeature.commands import demo
from nlmfeature.cli import main

from helpers import CLI_ENV

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _argv(work, readme=None):
    return ["demo", "--workdir", str(work), "--sentences", "40", "--train-sentences", "1500",
            "--iterations", "1", "--restarts", "1", "--bootstrap", "100", "--quiet"] + \
        (["--update-readme", str(readme)] if readme else [])


def _run(work, readme=None):
    return main(_argv(work, readme))


def test_demo_runs_the_whole_story_and_writes_the_readme_figures(tmp_path, capsys):
    from nlmfeature.training.kenlm_baseline import find_tool

    find_tool("lmplz")  # the demo needs KenLM (tools/setup.sh builds it); raises if missing
    readme = tmp_path / "README.md"
    shutil.copy(os.path.join(REPO, "README.md"), readme)
    work = tmp_path / "demo"
    # a second run, side by side in a process of its own, must give the same figures
    again = subprocess.Popen([sys.executable, "-m", "nlmfeature.cli", *_argv(tmp_path / "again")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                             env=CLI_ENV)
    assert _run(work, readme) == 0
    out = capsys.readouterr().out
    for needle in ("held-out perplexity", "== summary", "test BLEU:", "dev BLEU (MERT)", "exactly normalised"):
        assert needle in out, needle
    for f in ("l2r.nlm", "r2l.nlm", "dev.nlm.100best.gz", "base.weights", "nlm.weights", "test.base.1best",
              "test.nlm.1best"):
        assert os.path.getsize(work / f) > 0, f
    weights = (work / "nlm.weights").read_text()
    assert "NLM0=" in weights and "NLM1=" in weights
    assert len((work / "test.nlm.1best").read_text().splitlines()) == 40
    # the README block holds this run's summary lines and its command line, nothing else changed
    summary = out.split("== summary\n", 1)[1].split("\n\n", 1)[0].splitlines()
    text = readme.read_text()
    block = text.split(demo.BEGIN, 1)[1].split(demo.END, 1)[0]
    assert "$ nlmfeature demo --sentences 40 --train-sentences 1500 --iterations 1 --restarts 1 " \
           "--bootstrap 100" in block
    assert [l.strip() for l in summary] == [l.strip() for l in block.strip().splitlines()[1:]]
    original = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert text.split(demo.BEGIN)[0] == original.split(demo.BEGIN)[0]
    assert text.split(demo.END)[1] == original.split(demo.END)[1]
    # the second run gave the same figures (deterministic)
    again_out, again_err = again.communicate(timeout=600)
    assert again.returncode == 0, again_err[-3000:]
    assert again_out.split("== summary\n", 1)[1].split("\n\n", 1)[0].splitlines() == summary


def test_demo_never_writes_into_the_source_tree(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert demo.default_workdir() == str(tmp_path / "cache" / "nlmfeature" / "demo")
    assert not os.path.abspath(demo.default_workdir()).startswith(REPO + os.sep)
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert demo.default_workdir() == os.path.join(os.path.expanduser("~"), ".cache", "nlmfeature", "demo")
    # --update-readme without markers (or without a README) is refused before any work
    bare = tmp_path / "R.md"
    bare.write_text("# no markers\n")
    assert main(["demo", "--workdir", str(tmp_path / "w"), "--update-readme", str(bare)]) == 2
    assert "demo:begin" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
    assert main(["demo", "--update-readme", str(tmp_path / "missing.md")]) == 2
    assert "no such README" in capsys.readouterr().err
