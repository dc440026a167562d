#!/usr/bin/env python3
"""Side by side with Moses' BilingualNPLM: write NPLM numberized n-gram files of a parallel
text with exactly the vocabularies and affiliations of an nlmfeature joint model, numbered as
Moses' ``scripts/training/bilingual-lm/extract_training.py`` does (input vocabulary = target
words, then source words offset by the target vocabulary size; each line: w source-window ids,
n-1 target context ids, the target word).  Then train and test with NPLM's own tools
(docs/joint.md gives the commands and the figures).  Also writes the two vocabulary files
Moses' ``BilingualNPLM`` line takes (``target_vocab``: the target words in id order;
``source_vocab``: the source words, numbered after them).

    python3 tools/joint_nplm.py --model joint.nlm --out DIR \\
        --set train=train.de.gz,train.en.gz,train.align.gz --set test=test.de,test.en,test.align

``--identity-layer IN OUT`` rewrites a trained one-hidden-layer NPLM model (``num_hidden 0``,
the setting of Moses' ``train_nplm.py`` for bilingual models) as an equivalent two-layer one
whose second layer is the identity (``relu(I relu(z)) = relu(z)``: the same scores).  NPLM's
``neuralNetwork`` decides whether to skip its second layer from ``num_hidden`` of a model that
was not read yet (``model()`` leaves it uninitialised; reading the file never updates it), so
inside Moses, whose heap is not fresh, a ``num_hidden 0`` model goes through its unsized 1x1
second layer and every ``BilingualNPLM`` score is NaN (Moses then finds no translation).  With
the identity layer both of NPLM's paths give the right score.

    python3 tools/joint_nplm.py --identity-layer bilingual.model.nplm.10 bilingual.moses.nplm
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
import nlmfeature  # noqa: E402
from nlmfeature.core.joint import joint_ngrams, read_parallel  # noqa: E402
from nlmfeature.io.atomicfile import atomic_write_text  # noqa: E402


def identity_layer(src: str, dst: str) -> int:
    """Copy the NPLM text model ``src`` to ``dst`` with ``num_hidden 0`` replaced by a second
    hidden layer that is the identity of the output embedding width (weights I, biases 0);
    returns that width.  Refuses (SystemExit naming the file) a model that has two layers."""
    with open(src, encoding="utf-8") as f:
        lines = f.read().split("\n")
    cfg = {}
    for line in lines[1:]:
        if not line.strip() or line.startswith("\\"):
            break
        k, _, v = line.partition(" ")
        cfg[k] = v.strip()
    if lines[0] != "\\config" or "num_hidden" not in cfg or "output_embedding_dimension" not in cfg:
        sys.exit(f"{src}: not an NPLM text model (no \\config with num_hidden)")
    if cfg["num_hidden"] != "0":
        sys.exit(f"{src}: num_hidden is {cfg['num_hidden']}, not 0: nothing to do")
    d = int(cfg["output_embedding_dimension"])
    eye = ["\t".join("1" if j == i else "0" for j in range(d)) for i in range(d)]
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line == "num_hidden 0":
            out.append(f"num_hidden {d}")
        elif line in ("\\hidden_weights 2", "\\hidden_biases 2"):
            out.append(line)
            out.extend(eye if line.endswith("weights 2") else ["0"] * d)
            i += 1
            while i < len(lines) and lines[i].strip():  # the 1x1 block NPLM wrote
                i += 1
            continue
        else:
            out.append(line)
        i += 1
    atomic_write_text(dst, "\n".join(out))
    return d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="the joint model whose vocabularies to use")
    ap.add_argument("--out", help="output directory")
    ap.add_argument("--set", action="append", metavar="NAME=SRC,TGT,ALIGN",
                    help="a parallel text and its i-j alignment; writes OUT/NAME.numberized")
    ap.add_argument("--identity-layer", nargs=2, metavar=("IN", "OUT"),
                    help="only rewrite the num_hidden 0 NPLM model IN as OUT with an identity "
                         "second layer (same scores; what Moses' BilingualNPLM needs)")
    args = ap.parse_args(argv)
    if args.identity_layer:
        d = identity_layer(*args.identity_layer)
        print(f"{args.identity_layer[1]}: second hidden layer = identity {d}x{d}")
        return 0
    if not (args.model and args.out and args.set):
        ap.error("--model, --out and --set are required (or --identity-layer IN OUT)")
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
    for name, vocab in (("target.vocab", jm.vocab), ("source.vocab", jm.source_vocab)):
        atomic_write_text(os.path.join(args.out, name), "".join(w + "\n" for w in vocab))
    print(f"--ngram_size {jm.window + jm.order} --input_vocab_size {Vt + len(jm.source_vocab)} "
          f"--output_vocab_size {Vt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
