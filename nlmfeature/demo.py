"""``nlmfeature demo``: the whole story on bundled real data, in a few minutes.

1. train a class-factored log-bilinear model (class NCE) on the English side of a Multi30k
   German->English Moses system;
2. its perplexity next to a KenLM 5-gram on the same text, and their interpolations;
3. rescore the system's real dev and test 100-best lists with the neural feature;
4. tune weights on dev (MERT) with and without the neural feature;
5. BLEU of both on test, with the paired-bootstrap significance of the difference.

Every step is one of the package's own commands; the demo prints each command line so a
user can rerun it by hand.  Outputs go to ``--workdir``.
"""
from __future__ import annotations

import argparse
import os
import shlex
import time
from typing import Callable, List

from .atomicfile import open_output
from .kbest import sentence_id
from .textio import iter_lines

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "demo")


def _subset(src: str, dst: str, sentences: int, kbest: bool) -> str:
    """The first ``sentences`` sentences of a k-best list (by id) or a reference file."""
    with open_output(dst) as out:
        for lineno, line in iter_lines(src):
            if kbest:
                if sentence_id(line, src, lineno) >= sentences:
                    break
            elif lineno > sentences:
                break
            out.write(line + "\n")
    return dst


class _Steps:
    def __init__(self) -> None:
        self.t0 = time.time()
        self.n = 0

    def run(self, title: str, program: str, fn: Callable[[List[str]], int], argv: List[str]) -> None:
        self.n += 1
        print(f"\n== {self.n}. {title}", flush=True)
        print("$ " + " ".join(shlex.quote(a) for a in [program] + argv), flush=True)
        t = time.time()
        status = fn(argv)
        if status:
            raise SystemExit(f"step {self.n} ({program}) failed with status {status}")
        print(f"   ({time.time() - t:.1f} s)", flush=True)


def run(args: argparse.Namespace) -> int:
    from . import cli, evaluate, rescore
    from .tuning import cli as tune_cli
    from .weights import read_weights, write_weights

    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    w = lambda name: os.path.join(work, name)  # noqa: E731
    d = lambda name: os.path.join(DATA, name)  # noqa: E731
    dev_kbest, test_kbest = d("dev.100best.gz"), d("test.100best.gz")
    dev_ref, test_ref = d("dev.ref.en.gz"), d("test.ref.en.gz")
    if args.sentences:
        dev_kbest = _subset(dev_kbest, w("dev.100best.gz"), args.sentences, True)
        test_kbest = _subset(test_kbest, w("test.100best.gz"), args.sentences, True)
        dev_ref = _subset(dev_ref, w("dev.ref.en.gz"), args.sentences, False)
        test_ref = _subset(test_ref, w("test.ref.en.gz"), args.sentences, False)
    steps = _Steps()
    q = ["-q"] if args.quiet else []
    model = w("demo.nlm")
    jobs = str(args.jobs)
    main = cli.main
    steps.run("train a class-factored log-bilinear model (class NCE) on the system's English text",
              "nlmfeature", main,
              ["train", "--train", d("train.en.gz"), "--test-set", d("dev.ref.en.gz"), "--model-out", model,
               "--arch", "lbl", "--order", "5", "--word-width", str(args.word_width), "--diagonal-contexts",
               "--output", "class", "--classes", "100", "--noise-samples", "10",
               "--iterations", str(args.iterations), "--max-minutes", str(args.max_minutes),
               "--seed", "1", "--no-resume"] + (["--no-progress"] if args.quiet else []))
    ppl = ["perplexity", "--model", model, "--test", test_ref, "--valid", dev_ref,
           "--kenlm-train", d("train.en.gz"), "--kenlm", w("kenlm5.arpa"), "--tune-tokens", "2000"]
    steps.run("perplexity on test: neural model, KenLM 5-gram, interpolations", "nlmfeature", main, ppl + q)
    steps.run("add the NLM0 feature to the dev 100-best list", "nlmfeature-rescore", rescore.main,
              ["-m", model, "-i", dev_kbest, "-o", w("dev.nlm.100best.gz"), "-j", jobs,
               "--batch-size", "32768"] + q)
    init = read_weights(d("dev.init.ini"))
    write_weights(w("init.base.weights"), init)
    init_nlm = dict(init)
    init_nlm["NLM0"] = [0.05]
    write_weights(w("init.nlm.weights"), init_nlm)
    for name, kbest, start in (("base", dev_kbest, "init.base.weights"),
                               ("nlm", w("dev.nlm.100best.gz"), "init.nlm.weights")):
        label = "without" if name == "base" else "with"
        steps.run(f"tune on dev (MERT) {label} the neural feature", "nlmfeature-tune", tune_cli.main,
                  ["optimise", "--nbest", kbest, "--ref", dev_ref, "--init", w(start),
                   "--algorithm", "mert", "--restarts", str(args.restarts), "--seed", "1",
                   "--jobs", jobs, "--out", w(f"{name}.weights")] + (["--quiet"] if args.quiet else []))
    for name in ("base", "nlm"):
        note = " (NLM0 has no weight there: the baseline)" if name == "base" else ""
        steps.run(f"translate test: rerank its 100-best with the {name} weights{note}",
                  "nlmfeature-rescore", rescore.main,
                  ["-m", model, "-i", test_kbest, "--weights", w(f"{name}.weights"),
                   "--one-best", w(f"test.{name}.1best"), "-j", jobs, "--batch-size", "32768"] + q)
    steps.run("BLEU on test: baseline vs. + neural LM (paired bootstrap)", "nlmfeature-eval", evaluate.main,
              ["--ref", test_ref, "--tokenize", "none", "--bootstrap", str(args.bootstrap),
               w("test.base.1best"), w("test.nlm.1best")])
    print(f"\ndemo finished in {time.time() - steps.t0:.0f} s; files in {work}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train, compare with KenLM, rescore, tune and evaluate on bundled data",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="nlmfeature-demo", help="where outputs go (default ./nlmfeature-demo)")
    p.add_argument("--sentences", type=int, default=0,
                   help="use only the first N dev and test sentences (default: all; for a quick look)")
    p.add_argument("--word-width", type=int, default=100, help="embedding size of the demo model (default 100)")
    p.add_argument("--iterations", type=int, default=4, help="training epochs at most (default 4)")
    p.add_argument("--max-minutes", type=float, default=2.0, help="training time cap (default 2)")
    p.add_argument("--restarts", type=int, default=5, help="MERT random restarts (default 5)")
    p.add_argument("--bootstrap", type=int, default=1000, help="paired bootstrap samples (default 1000)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
