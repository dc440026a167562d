"""``nlmfeature demo``: the whole story on bundled real data.

1. train two neural LMs with the ``nlmfeature train`` defaults (the best measured recipe) on
   the English side of a Multi30k German->English Moses system: one reading left to right,
   one right to left (``--reverse``);
2. perplexity of the left-to-right model next to a KenLM 5-gram on the same text;
3. add both as features (NLM0, NLM1) to the system's real dev 100-best list;
4. tune weights on dev (MERT) with and without them;
5. rerank the test 100-best list with both weight sets: BLEU, with the paired-bootstrap
   significance of the difference.

Every step is one of the package's own commands; the demo prints each command line so a user
can rerun it by hand.  Everything is seeded and trained on one thread without time limits,
so every run gives the same figures.  Outputs go to ``--workdir`` (default
``~/.cache/nlmfeature/demo``, never the source tree); ``--update-readme`` writes the figures
into the README between the ``demo:begin``/``demo:end`` markers.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import sys
import time
from typing import Callable, Dict, List

from nlmfeature.errors import NLMFeatureError

from nlmfeature.mt.kbest import head_sentences

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "demo")
#: the README of a source checkout (src/nlmfeature/commands/demo.py -> the checkout's root)
README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))), "README.md")
BEGIN = "<!-- demo:begin: written by `nlmfeature demo --update-readme`; do not edit by hand -->"
END = "<!-- demo:end -->"


def default_workdir() -> str:
    """``$XDG_CACHE_HOME/nlmfeature/demo`` (``~/.cache/nlmfeature/demo``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "nlmfeature", "demo")


class _Tee(io.TextIOBase):
    """Writes to the real stdout and keeps a copy (the figures are parsed from it)."""

    def __init__(self, out) -> None:
        self.out, self.buf = out, io.StringIO()

    def write(self, s: str) -> int:
        self.out.write(s)
        return self.buf.write(s)

    def flush(self) -> None:
        self.out.flush()


class _Steps:
    def __init__(self) -> None:
        self.t0 = time.time()
        self.n = 0

    def run(self, title: str, program: str, fn: Callable[[List[str]], int], argv: List[str],
            echo: bool = True) -> str:
        """Run one step, printing its command line; returns what it printed on stdout."""
        self.n += 1
        print(f"\n== {self.n}. {title}", flush=True)
        print("$ " + " ".join(shlex.quote(a) for a in [program] + argv), flush=True)
        t = time.time()
        tee = _Tee(sys.stdout) if echo else io.StringIO()
        with contextlib.redirect_stdout(tee):
            status = fn(argv)
        if status:
            raise NLMFeatureError(f"step {self.n} ({program}) failed with status {status}")
        print(f"   ({time.time() - t:.1f} s)", flush=True)
        return tee.buf.getvalue() if echo else tee.getvalue()


def _after_bleu(text: str) -> float:
    m = re.search(r"after: BLEU = ([0-9.]+)", text)
    if not m:
        raise NLMFeatureError("could not read the tuned dev BLEU from nlmfeature-tune's output")
    return float(m.group(1))


def run(args: argparse.Namespace) -> int:
    from nlmfeature.commands import eval as eval_command
    from nlmfeature.commands import perplexity, rescore, train, tune
    from nlmfeature.commands.base import command
    from nlmfeature.bench.memory import neural_scores
    from nlmfeature.training.kenlm_baseline import perplexity as ppl_of
    from nlmfeature.training.corpus import read_lines
    from nlmfeature.mt.weights import read_weights, write_weights

    readme = args.update_readme
    if readme is not None:
        if not os.path.isfile(readme):
            raise NLMFeatureError(f"{readme}: no such README (an installed package has none: pass "
                                  "--update-readme PATH of a source checkout's README.md)")
        with open(readme, encoding="utf-8") as f:
            if BEGIN not in f.read():
                raise NLMFeatureError(f"{readme}: has no line {BEGIN!r} to write the figures after")
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    w = lambda name: os.path.join(work, name)  # noqa: E731
    d = lambda name: os.path.join(DATA, name)  # noqa: E731
    dev_kbest, test_kbest = d("dev.100best.gz"), d("test.100best.gz")
    dev_ref, test_ref = d("dev.ref.en.gz"), d("test.ref.en.gz")
    train_text = d("train.en.gz")
    if args.train_sentences:
        train_text = head_sentences(train_text, w("train.en.gz"), args.train_sentences, False)
    if args.sentences:
        dev_kbest = head_sentences(dev_kbest, w("dev.100best.gz"), args.sentences, True)
        test_kbest = head_sentences(test_kbest, w("test.100best.gz"), args.sentences, True)
        dev_ref = head_sentences(dev_ref, w("dev.ref.en.gz"), args.sentences, False)
        test_ref = head_sentences(test_ref, w("test.ref.en.gz"), args.sentences, False)
    steps = _Steps()
    q = ["-q"] if args.quiet else []
    jobs = str(args.jobs)
    models = [w("l2r.nlm")] + ([w("r2l.nlm")] if args.right_to_left else [])
    for model in models:
        rev = model.endswith("r2l.nlm")
        steps.run(f"train a {'right-to-left' if rev else 'left-to-right'} neural LM on the system's "
                  "English text (the train defaults: the best measured recipe)", "nlmfeature", command(train),
                  ["train", "-i", train_text, "--test-set", d("dev.ref.en.gz"), "-o", model,
                   "--iterations", str(args.iterations), "--threads", "1", "--seed", "1", "--no-resume"]
                  + (["--reverse"] if rev else []) + (["--no-progress"] if args.quiet else []))
    out = steps.run("perplexity on test: neural model, KenLM 5-gram, linear interpolation", "nlmfeature",
                    command(perplexity),
                    ["perplexity", "--model", models[0], "--test", test_ref, "--valid", dev_ref,
                     "--kenlm-train", train_text, "--kenlm", w("kenlm5.arpa"), "--no-loglinear",
                     "--json"] + q, echo=False)
    ppl = {r["model"]: r for r in json.loads(out)["rows"]}
    normalised = ppl_of(neural_scores(models[0], read_lines(test_ref)))
    raw = "" if abs(ppl['neural']['perplexity'] - normalised) < 5e-3 else \
        f"; raw scores {ppl['neural']['perplexity']:.2f}"
    print(f"   neural {normalised:.2f} (exactly normalised{raw}), KenLM 5-gram "
          f"{ppl['kenlm']['perplexity']:.2f}, linear interpolation {ppl['linear']['perplexity']:.2f}")
    mflags = [a for m in models for a in ("-m", m)]
    names = [f"NLM{i}" for i in range(len(models))]
    steps.run(f"add the {' and '.join(names)} features to the dev 100-best list", "nlmfeature-rescore",
              rescore.main, mflags + ["-i", dev_kbest, "-o", w("dev.nlm.100best.gz"), "-j", jobs,
                                      "--batch-size", "32768"] + q)
    init = read_weights(d("dev.init.ini"))
    write_weights(w("init.base.weights"), init)
    init_nlm = dict(init)
    for n in names:
        init_nlm[n] = [0.05]
    write_weights(w("init.nlm.weights"), init_nlm)
    dev_bleu: Dict[str, float] = {}
    for name, kbest, start in (("base", dev_kbest, "init.base.weights"),
                               ("nlm", w("dev.nlm.100best.gz"), "init.nlm.weights")):
        label = "without" if name == "base" else "with"
        out = steps.run(f"tune on dev (MERT) {label} the neural features", "nlmfeature-tune", tune.main,
                        ["optimise", "--nbest", kbest, "--ref", dev_ref, "--init", w(start),
                         "--algorithm", "mert", "--restarts", str(args.restarts), "--seed", "1",
                         "--jobs", jobs, "--out", w(f"{name}.weights")] + (["--quiet"] if args.quiet else []))
        dev_bleu[name] = _after_bleu(out)
    for name in ("base", "nlm"):
        note = " (the NLM features have no weight there: the baseline)" if name == "base" else ""
        steps.run(f"translate test: rerank its 100-best with the {name} weights{note}",
                  "nlmfeature-rescore", rescore.main,
                  mflags + ["-i", test_kbest, "--weights", w(f"{name}.weights"),
                            "--one-best", w(f"test.{name}.1best"), "-j", jobs, "--batch-size", "32768"] + q)
    out = steps.run("BLEU on test: baseline vs. + neural LMs (paired bootstrap)", "nlmfeature-eval", eval_command.main,
                    ["--ref", test_ref, "--tokenize", "none", "--bootstrap", str(args.bootstrap), "--json",
                     w("test.base.1best"), w("test.nlm.1best")], echo=False)
    cmp_ = next(c for c in json.loads(out)["comparisons"] if c["metric"] == "bleu")
    lines = [
        f"neural perplexity {normalised:.2f} (exactly normalised{raw}), "
        f"KenLM 5-gram {ppl['kenlm']['perplexity']:.2f}, linear interpolation {ppl['linear']['perplexity']:.2f}",
        f"dev BLEU (MERT): without the NLMs {dev_bleu['base']:.2f}, with {dev_bleu['nlm']:.2f}",
        f"test BLEU: {cmp_['baseline']:.2f} -> {cmp_['system']:.2f} ({cmp_['difference']:+.2f}, "
        f"p = {cmp_['p_value']:.3f})",
    ]
    print("\n== summary")
    for line in lines:
        print("   " + line)
    print(f"\ndemo finished in {time.time() - steps.t0:.0f} s; files in {work}")
    if readme is not None:
        argv = ["nlmfeature", "demo"] + _figure_flags(args)
        update_readme(readme, " ".join(shlex.quote(a) for a in argv), lines)
        print(f"figures written to {readme}")
    return 0


def update_readme(path: str, command: str, lines: List[str]) -> None:
    """Replace the text between the demo markers of ``path`` by the figures (atomically)."""
    from nlmfeature.io.atomicfile import replace_block

    with open(path, encoding="utf-8") as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise NLMFeatureError(f"{path}: the markers {BEGIN!r} and {END!r} are missing")
    replace_block(path, BEGIN, END, "\n    $ " + command + "\n" + "".join("    " + l + "\n" for l in lines))


def _figure_flags(args: argparse.Namespace) -> List[str]:
    """The options that change the figures, as given (for the README's command line)."""
    flags: List[str] = []
    for flag, value, default in (("--sentences", args.sentences, 0), ("--train-sentences", args.train_sentences, 0),
                                 ("--iterations", args.iterations, 20),
                                 ("--restarts", args.restarts, 20), ("--bootstrap", args.bootstrap, 1000)):
        if value != default:
            flags += [flag, str(value)]
    if not args.right_to_left:
        flags.append("--no-right-to-left")
    return flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train, compare with KenLM, rescore, tune and evaluate on bundled data",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=default_workdir(),
                   help="where outputs go (default $XDG_CACHE_HOME/nlmfeature/demo, i.e. "
                        "~/.cache/nlmfeature/demo; never the source tree)")
    p.add_argument("--sentences", type=int, default=0,
                   help="use only the first N dev and test sentences (default: all; for a quick look)")
    p.add_argument("--train-sentences", type=int, default=0,
                   help="train on the first N training sentences only (default: all 29,000; for a quick look)")
    p.add_argument("--iterations", type=int, default=20,
                   help="training epochs at most (default 20; early stopping ends sooner)")
    p.add_argument("--no-right-to-left", dest="right_to_left", action="store_false",
                   help="train and use only the left-to-right model")
    p.add_argument("--restarts", type=int, default=20, help="MERT random restarts (default 20)")
    p.add_argument("--bootstrap", type=int, default=1000, help="paired bootstrap samples (default 1000)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes of rescoring and MERT (default 2)")
    p.add_argument("--update-readme", nargs="?", const=README, default=None, metavar="README",
                   help="write the summary figures between the demo markers of the README "
                        "(default: README.md of the source checkout this package runs from)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
