"""``nlmfeature score``: natural-log probabilities of the sentences of a text."""
from __future__ import annotations

import argparse
import math
import sys

from nlmfeature.core.model import load
from nlmfeature.errors import NLMFeatureError
from nlmfeature.io.textio import iter_lines, split_tokens


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score sentences (natural-log probability per line)",
                       description="Print one line per input sentence: its total log-probability, "
                                   "or with --per-word each token's score (including </s>), an "
                                   "out-of-vocabulary word marked word<unk>=score as KenLM's "
                                   "query marks it.  Standard error ends with the counts of "
                                   "sentences, tokens and OOVs, and says when the scores are an "
                                   "unnormalised model's raw outputs (which can be above 0).")
    p.add_argument("--model", "-m", required=True, help="nlmfeature model file (.nlm)")
    p.add_argument("--input", "-i", default="-", help="tokenised text, one sentence per line "
                   "(plain, .gz, or - for standard input; default -)")
    p.add_argument("--per-word", action="store_true",
                   help="print 'word=score' for every token and </s> instead of the total "
                        "('word<unk>=score' for a word scored as <unk>)")
    p.add_argument("--log10", action="store_true",
                   help="print base-10 logs (as KenLM's query) instead of natural logs")
    p.add_argument("--source", metavar="FILE",
                   help="joint models: the source sentence of each input line (line by line)")
    p.add_argument("--alignment", metavar="FILE",
                   help="joint models: the i-j word alignment of each source/input pair")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the model checksum check when loading (faster start on big models)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model = load(args.model, verify=not args.no_verify)
    scale = 1 / math.log(10) if args.log10 else 1.0
    out = sys.stdout
    joint = bool(model.header.get("source"))
    if joint != bool(args.source and args.alignment) or (not joint and (args.source or args.alignment)):
        raise NLMFeatureError(f"{args.model} is a joint model: give --source and --alignment" if joint else
                              f"{args.model} is a target-only model: --source and --alignment apply to joint models")
    if joint:
        from nlmfeature.core.joint import read_parallel
        # an inverse model (train --target-to-source) scores the --source sentences
        srcs, tgts, affs = read_parallel(args.source, args.input, args.alignment, keep_empty=True,
                                         target_to_source=model.target_to_source)
        pairs = iter(zip(srcs, affs))
    n_sent = n_tok = n_oov = 0
    vocab = model.vocab
    for line in (tgts if joint else (line for _, line in iter_lines(args.input, stream=True))):
        toks = line if joint else split_tokens(line)
        if joint:
            src, aff = next(pairs)
            scores = model.score_affiliated(src, toks, aff) * scale
        else:
            scores = model.score_sentence(toks) * scale
        oov = [vocab.is_oov(w) for w in toks] + [False]
        n_sent, n_tok, n_oov = n_sent + 1, n_tok + len(toks) + 1, n_oov + sum(oov)
        if args.per_word:
            out.write(" ".join(f"{w}{'<unk>' if o else ''}={s:.6f}"
                               for w, o, s in zip(toks + ["</s>"], oov, scores)) + "\n")
        else:
            out.write(f"{scores.sum():.6f}\n")
    if not args.quiet:
        print(f"{args.prog_name}: {n_sent} sentences, {n_tok} tokens (with </s>), {n_oov} OOV "
              "(scored as <unk>)", file=sys.stderr)
        if not model.normalised:
            print(f"{args.prog_name}: note: {args.model} has an unnormalised "
                  f"({model.output_type}) output layer: scores are raw network outputs, "
                  "approximately log-probabilities, and can be above 0 (perplexity --exact "
                  "renormalises them)", file=sys.stderr)
    return 0
