"""One flag convention across the commands (sacrebleu's and Moses' habits): -i input, -o
output, -r reference, -m model, one --threads default, --version; the older spellings still
work as aliases and mean the same thing."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from helpers import DATA
from nlmfeature.commands import base
from nlmfeature import __version__, cli
from nlmfeature.commands import DEFAULT_THREADS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
HYP_A = os.path.join(DATA, "kbest", "wmt21-de-en.200.hyp.Facebook-AI.en")
HYP_B = os.path.join(DATA, "kbest", "wmt21-de-en.200.hyp.UEdin.en")
REF = os.path.join(DATA, "kbest", "wmt21-de-en.200.ref.A.en")


def leaf_parsers():
    return list(base.leaves(cli.build_parser()))


def test_threads_has_one_default_everywhere():
    # (a benchmark's --threads LIST of thread counts to time is a sweep, not a default)
    defaults = {" ".join(path): sp._option_string_actions["--threads"].default
                for path, _, sp in leaf_parsers() if "--threads" in sp._option_string_actions
                and sp._option_string_actions["--threads"].type in (int, base.THREADS)}
    assert len(defaults) >= 6, defaults
    assert set(defaults.values()) == {DEFAULT_THREADS}, defaults


def test_references_inputs_and_outputs_have_their_short_flags():
    for path, _, sp in leaf_parsers():
        opts = sp._option_string_actions
        where = " ".join(path)
        if "--ref" in opts:
            assert opts["-r"] is opts["--ref"], where
        if "--input" in opts:
            assert opts["-i"] is opts["--input"], where
        for old in ("--out", "--model-out"):
            if old in opts:
                assert opts["-o"] is opts[old], where
        if "--out" in opts:
            assert opts["--output"] is opts["--out"], where


@pytest.mark.parametrize("argv,old", [
    (["train", "-i", "t.txt", "-o", "m.nlm", "--output-layer", "class"],
     ["train", "--train", "t.txt", "--model-out", "m.nlm", "--output", "class"]),
    (["cluster", "-i", "t.txt", "-o", "p.txt"], ["cluster", "--text", "t.txt", "--out", "p.txt"]),
    (["perplexity", "-m", "m.nlm", "-i", "t.txt"], ["perplexity", "-m", "m.nlm", "--test", "t.txt"]),
    (["tune", "optimise", "--nbest", "k.gz", "-r", "ref", "-o", "w", "--one-best", "b"],
     ["tune", "optimise", "--nbest", "k.gz", "--ref", "ref", "--out", "w", "--output-1best", "b"]),
    (["tune", "bleu", "hyp", "-r", "ref"], ["tune", "bleu", "hyp", "--ref", "ref"]),
    (["querylog", "pack", "raw", "-m", "m", "--output", "o"], ["querylog", "pack", "raw", "-m", "m", "--out", "o"]),
    (["eval", "-i", "a", "-r", "ref", "-m", "bleu", "chrf", "-tok", "13a", "-lc"],
     ["eval", "a", "--ref", "ref", "--metrics", "bleu", "chrf", "--tokenize", "13a", "--lowercase"]),
])
def test_old_spellings_are_aliases(argv, old):
    p = cli.build_parser()
    new, before = vars(p.parse_args(argv)), vars(p.parse_args(old))
    new.pop("func"), before.pop("func")
    if argv[0] == "eval":
        new["systems"] = new.pop("systems") + new.pop("input")
        before["systems"] = before.pop("systems") + before.pop("input")
    assert new == before


def test_train_output_layer_is_not_the_output_file():
    a = cli.build_parser().parse_args(["train", "-i", "t.txt", "-o", "m.nlm", "--output-layer", "softmax"])
    assert a.model_out == "m.nlm" and a.output == "softmax"
    a = cli.build_parser().parse_args(["train", "-i", "t.txt", "-o", "m.nlm", "--output", "tree"])
    assert a.model_out == "m.nlm" and a.output == "tree"


@pytest.mark.parametrize("prog", [["-m", "nlmfeature.cli"], ["-c", "from nlmfeature.cli import eval_main as main; main()"],
                                  ["-c", "from nlmfeature.cli import rescore_main; rescore_main()"],
                                  ["-c", "from nlmfeature.cli import tune_main; tune_main()"]])
def test_version(prog):
    r = subprocess.run([sys.executable, *prog, "--version"], capture_output=True, text=True,
                       env=ENV, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith(__version__), r


def test_eval_takes_sacrebleus_flags_and_says_its_tokeniser(tmp_path):
    def run(*argv):
        r = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "eval", *argv],
                           capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout

    sacre = run("-i", HYP_A, HYP_B, "-r", REF, "-m", "bleu", "chrf", "--bootstrap", "100")
    ours = run(HYP_A, HYP_B, "--ref", REF, "--metrics", "bleu,chrf", "--bootstrap", "100")
    assert sacre == ours
    assert "BLEU tokenizer: none (the default" in sacre and "chrF2" in sacre
    assert sacre.count("p = ") == 2
    tok = run("-i", HYP_A, "-r", REF, "-m", "bleu", "-tok", "13a")
    assert "tok:13a" in tok and "BLEU tokenizer: none" not in tok and "chrF" not in tok
    # a metric name is never read as a system file
    r = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "eval", HYP_A, "-r", REF, "-m",
                        "bleu", "ter"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and "unknown metric 'ter'" in r.stderr and "Traceback" not in r.stderr


def test_convert_takes_i_and_o(tmp_path):
    from helpers import make_model

    model = make_model(tmp_path)
    assert cli.main(["convert", "-i", model, "-o", str(tmp_path / "a.nlm"), "-q"]) == 0
    assert cli.main(["convert", model, str(tmp_path / "b.nlm"), "-q"]) == 0
    assert (tmp_path / "a.nlm").read_bytes() == (tmp_path / "b.nlm").read_bytes()
    assert cli.main(["convert", model, "-q"]) == 2
