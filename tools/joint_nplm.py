#!/usr/bin/env python3
"""Side by side with Moses' BilingualNPLM: write NPLM numberized n-gram files of a parallel
text with exactly the vocabularies and affiliations of an nlmfeature joint model, numbered as
Moses' ``scripts/training/bilingual-lm/extract_training.py`` does (input vocabulary = target
words, then source words offset by the target vocabulary size; each line: w source-window ids,
n-1 target context ids, the target word).  Then train and test with NPLM's own tools
(docs/joint.md gives the commands and the figures).

    python3 tools/joint_nplm.py --model joint.nlm --out DIR \\
        --set train=train.de.gz,train.en.gz,train.align.gz --set test=test.de,test.en,test.align
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
import nlmfeature  # noqa: E402
from nlmfeature.core.joint import joint_ngrams, read_parallel  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the joint model whose vocabularies to use")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--set", action="append", required=True, metavar="NAME=SRC,TGT,ALIGN",
                    help="a parallel text and its i-j alignment; writes OUT/NAME.numberized")
    args = ap.parse_args(argv)
    jm = nlmfeature.load(args.model)
    Vt = len(jm.vocab)
    os.makedirs(args.out, exist_ok=True)
    for spec in args.set:
        name, files = spec.split("=", 1)
        s, t, a = files.split(",")
        srcs, tgts, affs = read_parallel(s, t, a, keep_empty=name != "train")
        d = joint_ngrams(srcs, tgts, affs, jm.vocab, jm.source_vocab, jm.order, jm.window)
        rows = np.concatenate([d.contexts[:, :jm.window] + Vt, d.contexts[:, jm.window:], d.words[:, None]], axis=1)
        np.savetxt(os.path.join(args.out, f"{name}.numberized"), rows, fmt="%d")
        print(f"{name}: {rows.shape[0]} n-grams of {rows.shape[1]} ids")
    print(f"--ngram_size {jm.window + jm.order} --input_vocab_size {Vt + len(jm.source_vocab)} "
          f"--output_vocab_size {Vt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
