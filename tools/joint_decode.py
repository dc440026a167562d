#!/usr/bin/env python3
"""Moses decoding with the joint model (docs/joint.md, "Inside Moses"): KenLM alone, + NLM,
+ NNJM, + NLM + NNJM, each with the weights MERT found for that feature set in
tools/joint_rescore.py (WORKDIR/tuned.{nlm,nnjm,nlm+nnjm}); prints BLEU and the sum of
Moses' per-sentence "Translation took" times (loading excluded) per configuration.

    tools/joint_decode.py MOSES_BIN RESCORE_WORKDIR JOINT.nlm LM.nlm SRC REF OUTDIR [THREADS]
        [--bilingual-nplm NPLM_MODEL --blm-vocab DIR] [--configs kenlm,nnjm,blm] [--sentences N]

``--bilingual-nplm``: one more configuration, ``blm``: KenLM + Moses' own ``BilingualNPLM``
(NPLM's bilingual model trained on the joint model's n-grams, ``tools/joint_nplm.py``; with
``num_hidden 0`` first rewritten by ``tools/joint_nplm.py --identity-layer``), window and order
those of JOINT.nlm, ``premultiply=true``, its vocabularies ``DIR/{target,source}.vocab``
(written by ``tools/joint_nplm.py``), its weight the one MERT gave NNJM (so ``blm`` and
``nnjm`` differ only in the joint feature).

MOSES_BIN must have NLMFeature and NLMJointFeature compiled in (moses_ff/README.md).  The
system ($SYS, default ../shared/data/moses/multi30k-de-en beside the repository; its moses.tuned.ini, full tables) and its LM
binarised into OUTDIR/lm.bin (KenLM's build_binary from $KENLM_BIN, else as
``nlmfeature.mt.moses.find_build_binary``) go through ``nlmfeature.mt.moses``; the configs are
OUTDIR/{kenlm,nlm,nnjm,nlm+nnjm}.ini, the translations and logs OUTDIR/CFG.{out,log}.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys

from nlmfeature import cli
from nlmfeature.bench import shared_data
from nlmfeature.io.atomicfile import atomic_write_text
from nlmfeature.io.textio import read_lines
from nlmfeature.mt import moses as mo
from nlmfeature.mt.tuning import cli as tune_cli
from nlmfeature.mt.weights import read_weights

SYSTEM = shared_data("moses", "multi30k-de-en")


def bleu_line(out: str, ref: str) -> str:
    """The first line ``nlmfeature-tune bleu OUT --ref REF`` prints."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        tune_cli.main(["bleu", out, "--ref", ref])
    return buf.getvalue().splitlines()[0]


def head(path: str, n: int, dst: str) -> str:
    """The first ``n`` lines of ``path`` (the package's text reader) written to ``dst``."""
    atomic_write_text(dst, "".join(line + "\n" for line in read_lines(path)[:n]))
    return dst


def run(args: argparse.Namespace) -> int:
    system = os.environ.get("SYS") or SYSTEM
    os.makedirs(args.outdir, exist_ok=True)
    prepared = mo.prepare_system(os.path.join(system, "moses.tuned.ini"), args.outdir, [], system,
                                 do_filter=False, kenlm_bin=[os.environ.get("KENLM_BIN")])
    configs = {"kenlm": mo.rewrite_moses_ini(prepared.ini, os.path.join(args.outdir, "kenlm.ini"), {})}
    for cfg in ("nlm", "nnjm", "nlm+nnjm"):
        feats = []
        if cfg in ("nlm", "nlm+nnjm"):
            feats.append(f"NLMFeature name=NLM path={args.lm}")
        if cfg in ("nnjm", "nlm+nnjm"):
            feats.append(f"NLMJointFeature name=NNJM path={args.joint}")
        configs[cfg] = mo.add_features(prepared.ini, os.path.join(args.outdir, f"{cfg}.ini"), feats,
                                       read_weights(os.path.join(args.rescore_workdir, f"tuned.{cfg}")))
    if args.bilingual_nplm and not args.blm_vocab:
        raise SystemExit("--bilingual-nplm needs --blm-vocab DIR (tools/joint_nplm.py writes it)")
    if args.bilingual_nplm:
        import nlmfeature

        jm = nlmfeature.load(args.joint)
        weights = read_weights(os.path.join(args.rescore_workdir, "tuned.nnjm"))
        weights["BLM"] = weights.pop("NNJM")
        configs["blm"] = mo.add_features(prepared.ini, os.path.join(args.outdir, "blm.ini"), [
            f"BilingualNPLM name=BLM order={jm.order} source_window={jm.window // 2} "
            f"path={os.path.abspath(args.bilingual_nplm)} premultiply=true "
            f"source_vocab={os.path.join(os.path.abspath(args.blm_vocab), 'source.vocab')} "
            f"target_vocab={os.path.join(os.path.abspath(args.blm_vocab), 'target.vocab')}"], weights)
    src, ref = args.src, args.ref
    if args.sentences:                # the first N sentences and their references
        src, ref = (head(p, args.sentences, os.path.join(args.outdir, f"{name}.{args.sentences}"))
                    for name, p in (("src", src), ("ref", ref)))
    chosen = args.configs.split(",") if args.configs else list(configs)
    for cfg in chosen:
        if cfg not in configs:
            raise SystemExit(f"--configs: no configuration {cfg!r} (have {', '.join(configs)})")
    for cfg in chosen:
        ini = configs[cfg]
        r = mo.run(mo.command(args.moses, ini, src, args.threads))
        out = os.path.join(args.outdir, f"{cfg}.out")
        atomic_write_text(out, r.stdout)
        atomic_write_text(os.path.join(args.outdir, f"{cfg}.log"), r.stderr)
        print(f"{cfg} decode_seconds={r.translation:.6g} {bleu_line(out, ref)}", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("moses", help="Moses executable with NLMFeature and NLMJointFeature")
    ap.add_argument("rescore_workdir", help="tools/joint_rescore.py's work directory (tuned.* weights)")
    ap.add_argument("joint", help="the joint model (NLMJointFeature, label NNJM)")
    ap.add_argument("lm", help="the target-only NLM (NLMFeature, label NLM)")
    ap.add_argument("src", help="source sentences to translate")
    ap.add_argument("ref", help="their references (BLEU)")
    ap.add_argument("outdir", help="configs, translations and decoder logs go here")
    ap.add_argument("threads", nargs="?", type=int, default=2, help="Moses threads (default 2)")
    ap.add_argument("--bilingual-nplm", metavar="NPLM_MODEL",
                    help="add the configuration blm: KenLM + Moses' BilingualNPLM with this NPLM model")
    ap.add_argument("--blm-vocab", metavar="DIR",
                    help="folder of target.vocab and source.vocab (tools/joint_nplm.py) for --bilingual-nplm")
    ap.add_argument("--configs", help="comma-separated configurations to decode, in order "
                    "(default all: kenlm,nlm,nnjm,nlm+nnjm[,blm])")
    ap.add_argument("--sentences", type=int, default=0, help="decode only the first N sentences")
    ap.set_defaults(func=run)
    return cli.run(ap, argv)


if __name__ == "__main__":
    sys.exit(main())
