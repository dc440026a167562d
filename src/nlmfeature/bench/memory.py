"""``nlmfeature bench memory``: perplexity against model size (Baltescu & Blunsom 2015, §7).

Neural models (the decoder recipe, ``nlmfeature train --output unnormalised``: NCE) of
several embedding widths, each also stored as float16 (``nlmfeature convert --float16``), and
with direct n-gram features in hashed stores of several sizes (a smaller store prunes them: more n-grams share a weight); beside
KenLM 5-gram models of the same text and vocabulary: probing, trie, trie with 8-bit
quantisation (``build_binary -q 8 -b 8 trie``) and pruned (``lmplz --prune 0 0 1``: 3-grams and
longer seen once dropped) with trie -q 8 -b 8.

Every model is trained on ``--train``, its early stopping uses ``--valid``, and it is measured
on ``--test``: size of the file a decoder maps (bytes; neural models with their precomputed
first-layer tables), test perplexity (unnormalised neural models are renormalised exactly over
the vocabulary, direct features included), and the perplexity of the linear interpolation
with the full KenLM model (weight tuned on ``--valid``).  A table (or ``--json``) and, with
``--plot``, a PNG of perplexity against size.  BLEU against size is not measured here (each
point would cost a rescoring and tuning run): ``nlmfeature bench mt`` measures BLEU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_SHARED = os.path.normpath(os.path.join(_HERE, "..", "..", "..", "..", "shared", "data", "nbest", "moses-multi30k-de-en"))
if not os.path.isdir(_SHARED):
    _SHARED = "/work/shared/data/nbest/moses-multi30k-de-en"
DEFAULT_TRAIN = os.path.join(_SHARED, "train.tok.lc.en.gz")
DEFAULT_VALID = os.path.join(_SHARED, "dev.ref.en.gz")
DEFAULT_TEST = os.path.join(_SHARED, "test.ref.en.gz")

#: the KenLM variants: name -> (lmplz extra arguments, build_binary arguments before the files)
KENLM_VARIANTS = [
    ("kenlm-probing", (), ["probing"]),
    ("kenlm-trie", (), ["trie"]),
    ("kenlm-trie-q8", (), ["-q", "8", "-b", "8", "trie"]),
    ("kenlm-pruned-trie-q8", ("--prune", "0", "0", "1"), ["-q", "8", "-b", "8", "trie"]),
]


def register(bench_sub: argparse._SubParsersAction) -> None:
    """Add ``nlmfeature bench memory``."""
    p = bench_sub.add_parser("memory", help="perplexity against model size (widths, float16, pruned "
                                            "direct features; KenLM probing/trie/quantised/pruned)",
                             description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", default=DEFAULT_TRAIN,
                   help="training text (default: the English side of the shared Multi30k system)")
    p.add_argument("--valid", default=DEFAULT_VALID, help="held-out text for early stopping and "
                                                          "interpolation weights (default: Multi30k dev)")
    p.add_argument("--test", default=DEFAULT_TEST, help="test text (default: Multi30k test2016)")
    p.add_argument("--widths", default="50,100,200",
                   help="embedding widths of the neural models without direct features (default 50,100,200)")
    p.add_argument("--direct-hash-spaces", default="4194304,524288",
                   help="hashed-store sizes of the width-200 models with direct features of orders 1-3 "
                        "(default 4194304,524288: the train default and a store pruned 8x)")
    p.add_argument("--iterations", type=int, default=20, help="epochs at most per model (default 20)")
    p.add_argument("--threads", type=int, default=1, help="training threads (default 1)")
    p.add_argument("--out", default=None,
                   help="folder for the models (default: a temporary folder, removed afterwards)")
    p.add_argument("--plot", metavar="PNG", default=None,
                   help="also draw perplexity against size into this PNG (needs matplotlib: "
                        "pip install 'nlmfeature[plot]')")
    p.add_argument("--quick", action="store_true",
                   help="tiny models for one epoch on the first 2000 training sentences: checks the "
                        "benchmark runs, the figures mean nothing")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def _ints(text: str, flag: str) -> List[int]:
    from nlmfeature.errors import NLMFeatureError

    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise NLMFeatureError(f"{flag}: expected comma-separated integers, got {text!r}") from None


def _ppl(lp: np.ndarray) -> float:
    return float(math.exp(-float(np.mean(lp))))


def neural_scores(path: str, sentences: List[List[str]]) -> np.ndarray:
    """Exactly normalised per-token natural-log probabilities of a model file (an
    unnormalised model is renormalised by a softmax over its vocabulary)."""
    from nlmfeature.core.model import load
    from nlmfeature.training.corpus import ngrams
    from nlmfeature.training.trainer import heldout_logprob

    m = load(path)
    data = ngrams([s[::-1] for s in sentences] if m.reverse else sentences, m.vocab, m.order)
    return heldout_logprob(m.header, m.arrays, data, "softmax" if m.output_type == "unnormalised" else None)


def run(args: argparse.Namespace) -> int:
    from nlmfeature.errors import NLMFeatureError
    from nlmfeature.training.kenlm_baseline import KenLMScorer, find_tool, interpolate, train_kenlm
    from nlmfeature.core.model import load, save
    from nlmfeature.training.corpus import read_lines
    from nlmfeature.training.trainer import TrainConfig, train

    for f in (args.train, args.valid, args.test):
        if not os.path.exists(f):
            raise NLMFeatureError(f"{f}: no such file (see --train/--valid/--test)")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise NLMFeatureError("--plot needs matplotlib: pip install 'nlmfeature[plot]'") from None
        if os.path.isdir(args.plot) or not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
            raise NLMFeatureError(f"{args.plot}: --plot must be a file in an existing folder")
    widths = _ints(args.widths, "--widths")
    spaces = _ints(args.direct_hash_spaces, "--direct-hash-spaces")
    log = (lambda m: None) if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    tmp = None
    out = args.out
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="nlmfeature-bench-memory.")
        out = tmp.name
    os.makedirs(out, exist_ok=True)
    try:
        train_path, iterations = args.train, args.iterations
        if args.quick:
            from nlmfeature.commands.demo import _subset

            train_path = _subset(args.train, os.path.join(out, "train.quick.txt.gz"), 2000, kbest=False)
            widths, spaces, iterations = [8, 16], [1 << 14], 1
        valid, test = read_lines(args.valid), read_lines(args.test)
        rows: List[Dict[str, Any]] = []
        # -- neural models ---------------------------------------------------------------
        configs = [(f"nlm-d{w}", dict(word_width=w, direct_order=0)) for w in widths]
        wide = 16 if args.quick else 200
        configs += [(f"nlm-d{wide}+direct-2^{int(math.log2(h))}", dict(word_width=wide, hash_space=h))
                    for h in spaces]
        vocab = None
        for name, fields in configs:
            path = os.path.join(out, name + ".nlm")
            t0 = time.time()
            log(f"training {name}")
            # the decoder recipe (NCE, unnormalised output): what a decoder maps
            cfg = TrainConfig(train=train_path, test_set=args.valid, model_out=path, iterations=iterations,
                              threads=args.threads, progress=False, resume=False, output="unnormalised",
                              **fields)
            res = train(cfg, log=lambda m: None)
            minutes = (time.time() - t0) / 60
            vocab = load(path).vocab
            half = os.path.join(out, name + ".f16.nlm")
            m = load(path)
            save(half, m.header, {k: np.asarray(v) for k, v in m.arrays.items()}, half=True)
            for label, p in ((name, path), (name + " float16", half)):
                rows.append({"model": label, "kind": "neural", "bytes": os.path.getsize(p),
                             "test_logprob": neural_scores(p, test), "valid_logprob": neural_scores(p, valid),
                             "epochs": res.epochs, "train_minutes": round(minutes, 2)})
        # -- KenLM --------------------------------------------------------------------------
        base_arpa = None
        for name, lmplz_args, bb_args in KENLM_VARIANTS:
            arpa = os.path.join(out, ("kenlm-pruned" if lmplz_args else "kenlm") + ".arpa")
            if not os.path.exists(arpa):
                log(f"lmplz {' '.join(lmplz_args)}")
                train_kenlm(train_path, arpa, 5, vocab=vocab, extra_args=lmplz_args)
            base_arpa = base_arpa or arpa
            binary = os.path.join(out, name + ".bin")
            proc = subprocess.run([find_tool("build_binary"), *bb_args[:-1], bb_args[-1], arpa, binary],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                raise NLMFeatureError(f"build_binary {' '.join(bb_args)} failed:\n{proc.stderr[-1000:]}")
            sc = KenLMScorer(binary, vocab)
            rows.append({"model": name, "kind": "kenlm", "bytes": os.path.getsize(binary),
                         "test_logprob": sc.token_scores(test)[0].logprob,
                         "valid_logprob": sc.token_scores(valid)[0].logprob})
        # -- figures ------------------------------------------------------------------------
        ref = next(r for r in rows if r["model"] == "kenlm-probing")
        ref_test, ref_valid = ref["test_logprob"], ref["valid_logprob"]
        for r in rows:
            r["test_ppl"] = round(_ppl(r["test_logprob"]), 3)
            r["ratio_to_kenlm"] = round(r["test_ppl"] / _ppl(ref_test), 4)
            if r["kind"] == "neural":
                lin, w = interpolate(r["test_logprob"], ref_test, r["valid_logprob"], ref_valid)
                r["linear_with_kenlm_ppl"] = round(_ppl(lin), 3)
                r["linear_weight"] = round(w, 3)
            r["MB"] = round(r["bytes"] / 1e6, 3)
            del r["test_logprob"], r["valid_logprob"]
        result = {"train": args.train, "valid": args.valid, "test": args.test, "quick": args.quick,
                  "vocab": len(vocab) if vocab is not None else None, "rows": rows}
        if args.plot:
            plot(rows, args.plot, "quick run: figures mean nothing" if args.quick else os.path.basename(args.test))
            result["plot"] = args.plot
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(f"test perplexity against file size ({args.test}; vocabulary {result['vocab']})"
                  + ("  [--quick: figures mean nothing]" if args.quick else ""))
            print(f"{'model':34s} {'MB':>9s} {'test ppl':>9s} {'x KenLM':>8s} {'linear w/ KenLM':>16s}")
            for r in rows:
                lin = f"{r['linear_with_kenlm_ppl']:10.2f} (w {r['linear_weight']:.2f})" if "linear_weight" in r else ""
                print(f"{r['model']:34s} {r['MB']:9.2f} {r['test_ppl']:9.2f} {r['ratio_to_kenlm']:8.3f} {lin:>16s}")
            if args.plot:
                print(f"plot: {args.plot}")
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


def plot(rows: List[Dict[str, Any]], path: str, title: str) -> None:
    """Perplexity against size (log scale), neural and KenLM models, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nlmfeature.io.atomicfile import atomic_open

    fig, ax = plt.subplots(figsize=(8, 5))
    for kind, marker, color in (("neural", "o", "tab:blue"), ("kenlm", "s", "tab:red")):
        rs = [r for r in rows if r["kind"] == kind]
        ax.scatter([r["MB"] for r in rs], [r["test_ppl"] for r in rs], marker=marker, color=color,
                   label="nlmfeature" if kind == "neural" else "KenLM 5-gram")
        for r in rs:
            ax.annotate(r["model"], (r["MB"], r["test_ppl"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("model file size (MB, log scale)")
    ax.set_ylabel("test perplexity")
    ax.set_title(f"perplexity against size ({title})")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_open(path, suffix=".png") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)
