"""The README is true: every nlmfeature command line it shows parses with the real parsers,
its Python example runs and does what its comments say, its test command is what CI runs,
and the decoder tests it mentions are marked."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import nlmfeature
from helpers import BROWN_VALID, make_model
from nlmfeature import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
ENV = dict(os.environ, PYTHONPATH=ROOT)


def readme_commands():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    text = text.split("<!-- command table")[0] + text.split("<!-- end of command table -->")[1]
    text = re.sub(r"\\\n\s*", " ", text)                        # continuation lines
    found = re.findall(r"`(nlmfeature [^`]+)`", text)
    found += [l.strip() for l in text.splitlines() if l.strip().startswith("nlmfeature ")]
    out = []
    for cmd in found:
        cmd = cmd.split("  #")[0].split(" # ")[0].strip()
        argv = shlex.split(cmd)[1:]
        if len(argv) > 1 and not argv[-1].startswith("<"):
            out.append(argv)
    return out


def test_readme_shows_the_recipes():
    argvs = readme_commands()
    used = {a[0] for a in argvs}
    assert {"prepare", "train", "rescore", "tune", "eval", "bench"} <= used, used
    assert len(argvs) >= 12


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_readme_command_parses(argv):
    args = cli.build_parser().parse_args(argv)
    assert callable(args.func)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return nlmfeature.load(make_model(tmp_path_factory.mktemp("api"), output="class", classes=20))


# -- every README example runs ---------------------------------------------------------------------
def test_readme_python_example_runs(lm, tmp_path, monkeypatch):
    text = open(README, encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "no python example in README.md"
    shutil.copy(lm.path, tmp_path / "model.nlm")
    shutil.copy(BROWN_VALID, tmp_path / "test.txt")
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        ns: dict = {}
        exec(compile(code, "README.md", "exec"), ns)
    m = ns["lm"]
    # what the comments claim
    assert ns["total"] == pytest.approx(m.sentence_logprob("the jury said"), abs=1e-4)
    assert list(m.vocab)[:4] == ["<unk>", "<s>", "</s>", "<null>"]
    assert m.perplexity("test.txt").tokens == lm.perplexity(BROWN_VALID).tokens


def test_readme_test_command_is_what_ci_runs():
    readme = open(README, encoding="utf-8").read()
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    commands = re.findall(r"^    (bash tools/setup\.sh && python3 -m pytest .*)$", readme, re.M)
    assert len(commands) == 1, commands
    assert commands[0] in ci.splitlines()
    assert "-rs" in commands[0] and "--durations=20" in commands[0]


def test_decoder_tests_are_marked(pytestconfig):
    assert any(m.startswith("decoder:") for m in pytestconfig.getini("markers"))
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "decoder",
                        "tests/test_moses_shim.py", "tests/test_cdec_shim.py", "tests/test_bleu.py",
                        "tests/test_tuning_driver.py"],
                       capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    ids = [l for l in r.stdout.splitlines() if "::" in l]
    assert ids and all("shim" in i or "real_moses" in i or "real_cdec" in i for i in ids), r.stdout
    assert any("moses_shim" in i for i in ids) and any("cdec_shim" in i for i in ids)
    assert {i.split("::")[1] for i in ids if "tuning_driver" in i} == \
        {"test_driver_with_real_moses", "test_driver_with_real_cdec"}


