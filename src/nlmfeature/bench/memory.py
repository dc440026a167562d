"""``nlmfeature bench memory``: perplexity, BLEU and the decoder's memory against model size (Baltescu & Blunsom 2015, §7).

Neural models (the decoder recipe, ``nlmfeature train --output unnormalised``: NCE) of
several embedding widths, each also stored as float16 (``nlmfeature convert --float16``), and
with direct n-gram features in hashed stores of several sizes (a smaller store prunes them: more n-grams share a weight); beside
KenLM 5-gram models of the same text and vocabulary: probing, trie, trie with 8-bit
quantisation (``build_binary -q 8 -b 8 trie``) and pruned (``lmplz --prune 0 0 1``: 3-grams and
longer seen once dropped) with trie -q 8 -b 8.  Models of your own (``--model``, e.g. trained for
hours on a large corpus, or continued on in-domain text) are measured beside them, float16
copies included; the KenLM models then take their vocabulary.

Every model is trained on ``--train``, its early stopping uses ``--valid``, and it is measured
on ``--test``: size of the file a decoder maps (bytes; neural models with their precomputed
first-layer tables), test perplexity (unnormalised neural models are renormalised exactly over
the vocabulary, direct features included), and the perplexity of the linear interpolation
with the full KenLM model (weight tuned on ``--valid``).

BLEU against size (unless ``--no-bleu``): every model becomes the **only language model** of the
real Moses system's k-best lists (``../shared/data/nbest/moses-multi30k-de-en``: the dev 100-best
of the last MERT iteration and the test2016 100-best of the tuned system, ``--nbest-dir``): each
hypothesis' ``LM0`` value (the natural-log probability of the system's KenLM, as Moses writes it)
is replaced by the model's log-probability of the whole hypothesis (``<s>`` context, ``</s>``
scored; an unnormalised neural model's raw scores, as a decoder adds them), the weights are
tuned on dev by MERT ``--tunings`` times (seeds 1..N, from the system's tuned weights) and the
test list reranked; BLEU (tokenised, lowercased reference, sacrebleu ``-tok none``) is the mean
of the tunings.  Then the same with the model **beside the lists' LM**: ``LM0`` kept, the
model's log-probability a second feature ``LM1`` (its weight starting at half ``LM0``'s, as
``bench mt`` starts an NLM), tuned and reranked the same way.  The row ``system-lm`` keeps the
decoder's own LM (the unchanged lists): the reference point.  It is rescoring, not decoding:
the lists were searched with the system's LM.

The decoder's memory (with ``--moses``, a Moses or Moses2 with NLMFeature, and
``--decoder-config``, a moses.ini of the system with one KENLM feature): every model in turn
replaces that KENLM line (an NLMFeature line for a neural model, a KENLM line for a KenLM file;
same label and weight) and the decoder translates the first ``--decoder-sentences`` lines of
``--decoder-input`` on one thread: its peak resident memory (a memory-mapped model counts the
pages the search touched) and its load time (the wall seconds of translating an empty input);
the same config without a language model is the reference (what the tables and the search
take).  Decode time is ``benchmarks/bench_decoder.py``'s measurement, not this one's.

A table (or ``--json``) and, with ``--plot``, a PNG of perplexity (and BLEU, and the decoder's
peak memory) against size.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from nlmfeature.io.jsonout import dumps_json
from nlmfeature.bench import shared_data

_SHARED = shared_data("nbest", "moses-multi30k-de-en")
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


def _ints(text: str, flag: str) -> List[int]:
    from nlmfeature.errors import NLMFeatureError

    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise NLMFeatureError(f"{flag}: expected comma-separated integers, got {text!r}") from None


def _ppl(lp: np.ndarray) -> float:
    return float(math.exp(-float(np.mean(lp))))


def neural_scores(path: str, sentences: List[List[str]]) -> np.ndarray:
    """Exactly normalised per-token natural-log probabilities of a model file
    (:func:`nlmfeature.core.model.exactly_normalised`)."""
    from nlmfeature.core.model import exactly_normalised, load
    from nlmfeature.training.corpus import ngrams

    m = load(path)
    data = ngrams([s[::-1] for s in sentences] if m.reverse else sentences, m.vocab, m.order)
    return exactly_normalised(m).score_batch(data.contexts, data.words)


def run(args: argparse.Namespace) -> int:
    from nlmfeature.errors import NLMFeatureError
    from nlmfeature.training.kenlm_baseline import KenLMScorer, find_tool, interpolate, train_kenlm
    from nlmfeature.core.model import load
    from nlmfeature.training.corpus import read_lines
    from nlmfeature.training.trainer import TrainConfig, train

    for f in (args.train, args.valid, args.test):
        if not os.path.exists(f):
            raise NLMFeatureError(f"{f}: no such file (see --train/--valid/--test)")
    for f in args.model:
        if not os.path.isfile(f):
            raise NLMFeatureError(f"--model {f}: no such file")
    given = [(f, load(f)) for f in args.model]      # refused before any work: joint models, two vocabularies
    for f, m in given:
        if m.native.source_window:
            raise NLMFeatureError(f"--model {f}: a joint model; give target-side language models")
        if m.vocab != given[0][1].vocab:
            raise NLMFeatureError(f"--model {f}: its vocabulary ({len(m.vocab)} words) is not that of "
                                  f"{given[0][0]} ({len(given[0][1].vocab)}): the rows must share one vocabulary")
    if not args.no_bleu:
        if args.dev_nbest is None:
            args.dev_nbest = last_dev_nbest(args.nbest_dir)
        for f in (args.dev_nbest, *NBEST_FILES):
            if not os.path.exists(os.path.join(args.nbest_dir, f)):
                raise NLMFeatureError(f"{os.path.join(args.nbest_dir, f)}: no such file (see --nbest-dir "
                                      "and --dev-nbest, or --no-bleu)")
        if args.tunings < 1:
            raise NLMFeatureError(f"--tunings must be at least 1, got {args.tunings}")
    if args.moses:              # refused before any work
        from nlmfeature.mt.moses import find_moses

        args.moses = find_moses(args.moses)
        for flag, f in (("--decoder-config", args.decoder_config), ("--decoder-input", args.decoder_input)):
            if not f:
                raise NLMFeatureError(f"--moses needs {flag}")
            if not os.path.isfile(f):
                raise NLMFeatureError(f"{flag} {f}: no such file")
        if args.decoder_sentences < 1:
            raise NLMFeatureError(f"--decoder-sentences must be at least 1, got {args.decoder_sentences}")
    elif args.decoder_config or args.decoder_input:
        raise NLMFeatureError("--decoder-config and --decoder-input are for --moses (the decoder)")
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
            from nlmfeature.mt.kbest import head_sentences

            train_path = head_sentences(args.train, os.path.join(out, "train.quick.txt.gz"), 2000, kbest=False)
            widths, spaces, iterations = [8, 16], [1 << 14], 1
        valid, test = read_lines(args.valid), read_lines(args.test)
        rows: List[Dict[str, Any]] = []
        # -- neural models ---------------------------------------------------------------
        configs = [(f"nlm-d{w}", dict(word_width=w, direct_order=0)) for w in widths]
        wide = 16 if args.quick else 200
        configs += [(f"nlm-d{wide}+direct-2^{int(math.log2(h))}", dict(word_width=wide, hash_space=h))
                    for h in spaces]
        vocab = None
        vocab_of = ""
        if args.quick and args.model:
            configs = []            # --quick checks the given models' path only: nothing trained
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
            m = load(path)
            vocab, vocab_of = m.vocab, path
            rows += _neural_rows(name, path, m, out, test, valid,
                                 {"epochs": res.epochs, "train_minutes": round(minutes, 2)})
        for path, m in given:       # models of the user's own, measured as they are
            if vocab is not None and m.vocab != vocab:
                raise NLMFeatureError(f"--model {path}: its vocabulary ({len(m.vocab)} words) is not that of "
                                      f"{vocab_of} ({len(vocab)}): the rows must share one vocabulary "
                                      "(--widths '' --direct-hash-spaces '' trains none)")
            vocab, vocab_of = m.vocab, path
            name = os.path.basename(path)
            name = name[:-4] if name.endswith(".nlm") else name
            log(f"measuring {path}")
            rows += _neural_rows(name, path, m, out, test, valid, {"given": path})
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
            rows.append({"model": name, "kind": "kenlm", "path": binary, "bytes": os.path.getsize(binary),
                         "test_logprob": sc.token_scores(test)[0].logprob,
                         "valid_logprob": sc.token_scores(valid)[0].logprob})
        # -- BLEU ---------------------------------------------------------------------------
        bleu = None
        if not args.no_bleu:
            bleu = lm_swap_bleu(rows, vocab, args, os.path.join(out, "bleu"), log)
        # -- the decoder ----------------------------------------------------------------------
        decoder = None
        if args.moses:
            decoder = decoder_figures(rows, args, os.path.join(out, "decoder"), log)
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
            del r["test_logprob"], r["valid_logprob"], r["path"]
        result = {"train": args.train, "valid": args.valid, "test": args.test, "quick": args.quick,
                  "vocab": len(vocab) if vocab is not None else None, "rows": rows}
        if bleu is not None:
            result["bleu"] = bleu
        if decoder is not None:
            result["decoder"] = decoder
        if args.plot:
            plot(rows, args.plot, "quick run: figures mean nothing" if args.quick else os.path.basename(args.test),
                 decoder["no_lm"]["decoder_peak_mb"] if decoder else None)
            result["plot"] = args.plot
        if args.json:
            print(dumps_json(result, indent=2))
        elif args.markdown:
            print(format_markdown(result))
        else:
            print(f"test perplexity against file size ({args.test}; vocabulary {result['vocab']})"
                  + ("  [--quick: figures mean nothing]" if args.quick else ""))
            print(f"{'model':34s} {'MB':>9s} {'test ppl':>9s} {'x KenLM':>8s} {'linear w/ KenLM':>16s}"
                  + (f" {'BLEU (only LM)':>15s} {'dev':>6s} {'BLEU (beside)':>15s} {'dev':>6s}" if bleu else "")
                  + (f" {'dec. MB':>8s} {'load s':>6s}" if decoder else ""))

            def b_(r: Dict[str, Any], prefix: str) -> str:
                return (f" {r[prefix + 'test_bleu']:8.2f} +-{r[prefix + 'test_bleu_sd']:4.2f} "
                        f"{r[prefix + 'dev_bleu']:6.2f}" if prefix + "test_bleu" in r else "")

            def d_(r: Dict[str, Any]) -> str:
                return (f" {r['decoder_peak_mb']:8.0f} {r['decoder_load_seconds']:6.2f}"
                        if "decoder_peak_mb" in r else "")

            for r in rows:
                lin = f"{r['linear_with_kenlm_ppl']:10.2f} (w {r['linear_weight']:.2f})" if "linear_weight" in r else ""
                print(f"{r['model']:34s} {r['MB']:9.2f} {r['test_ppl']:9.2f} {r['ratio_to_kenlm']:8.3f} {lin:>16s}"
                      f"{b_(r, '')}{b_(r, 'beside_')}{d_(r)}")
            if bleu:
                print(f"{'system-lm (the decoder LM0)':34s} {'':>9s} {'':>9s} {'':>8s} {'':>16s}"
                      f"{b_(bleu['system_lm'], '')}")
                print(f"BLEU: {bleu['note']}")
            if decoder:
                print(f"{'no LM (decoder tables and search)':34s} {'':>9s} {'':>9s} {'':>8s} {'':>16s}"
                      f"{' ' * 46 if bleu else ''}{d_(decoder['no_lm'])}")
                print(f"decoder: {decoder['moses']} on {decoder['sentences']} sentences of {decoder['input']}, "
                      "1 thread; peak resident memory, load = an empty input's wall seconds")
            if args.plot:
                print(f"plot: {args.plot}")
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


def format_markdown(result: Dict[str, Any]) -> str:
    """The rows of a run (``--json``'s document) as one markdown table."""
    bleu, dec = result.get("bleu"), result.get("decoder")
    beside = bool(bleu) and any("beside_test_bleu" in r for r in result["rows"])
    head = ["model", "MB", "test ppl", "x KenLM probing", "linear with KenLM probing (weight)"]
    if bleu:
        head += ["test BLEU as the only LM (sd)", "dev BLEU"]
    if beside:
        head += ["test BLEU beside the lists' LM (sd)", "dev BLEU"]
    if dec:
        head += ["decoder peak MB", "decoder load s"]

    def bleu_cells(r: Dict[str, Any], prefix: str) -> List[str]:
        return [f"{r[prefix + 'test_bleu']:.2f} ({r[prefix + 'test_bleu_sd']:.2f})", f"{r[prefix + 'dev_bleu']:.2f}"]

    def dec_cells(r: Dict[str, Any]) -> List[str]:
        return [f"{r['decoder_peak_mb']:.0f}", f"{r['decoder_load_seconds']:.2f}"]

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        cells = [r["model"], f"{r['MB']:.2f}", f"{r['test_ppl']:.2f}", f"{r['ratio_to_kenlm']:.3f}",
                 f"{r['linear_with_kenlm_ppl']:.2f} ({r['linear_weight']:.2f})" if "linear_weight" in r else ""]
        if bleu:
            cells += bleu_cells(r, "")
        if beside:
            cells += bleu_cells(r, "beside_")
        if dec:
            cells += dec_cells(r)
        lines.append("| " + " | ".join(cells) + " |")
    if bleu:
        cells = ["the system's own LM (the lists' LM0)", "", "", "", ""] + bleu_cells(bleu["system_lm"], "")
        if beside:
            cells += ["", ""]
        if dec:
            cells += ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    if dec:
        cells = ["no LM (the decoder's tables and search)"] + [""] * (len(head) - 3) + dec_cells(dec["no_lm"])
        lines.append("| " + " | ".join(cells) + " |")
    if result.get("quick"):
        lines.append("")
        lines.append("(--quick: figures mean nothing)")
    return "\n".join(lines)


def last_dev_nbest(folder: str) -> str:
    """The name of the last MERT iteration's dev list in ``folder`` (the highest
    ``dev.iterN.100best.gz``); ``dev.iter1.100best.gz`` when there is none (reported missing)."""
    import re

    found = [(int(m.group(1)), name) for name in (os.listdir(folder) if os.path.isdir(folder) else [])
             for m in [re.fullmatch(r"dev\.iter(\d+)\.100best\.gz", name)] if m]
    return max(found)[1] if found else "dev.iter1.100best.gz"


#: files of --nbest-dir besides --dev-nbest
NBEST_FILES = ("test.tuned.100best.gz", "dev.ref.en.gz", "test.ref.en.gz", "moses.tuned.ini")
#: sentences of each list kept with --quick
QUICK_SENTENCES = 40


def _neural_rows(name: str, path: str, m, out: str, test: List[str], valid: List[str],
                 extra: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The rows of the neural model file ``path`` (loaded: ``m``) and of its float16 copy
    (written into ``out``; a file already float16 is one row)."""
    from nlmfeature.core.model import save

    files = [(name, path)]
    if m.header.get("storage") != "float16":
        half = os.path.join(out, name + ".f16.nlm")
        save(half, m.header, {k: np.asarray(v) for k, v in m.arrays.items()}, half=True)
        files.append((name + " float16", half))
    return [dict({"model": label, "kind": "neural", "path": p, "bytes": os.path.getsize(p),
                  "test_logprob": neural_scores(p, test), "valid_logprob": neural_scores(p, valid)}, **extra)
            for label, p in files]


def lm_swap_bleu(rows: List[Dict[str, Any]], vocab, args: argparse.Namespace, work: str,
                 log) -> Dict[str, Any]:
    """BLEU with each row's model as the only LM of the --nbest-dir lists, and beside their LM
    (module doc).  Adds ``test_bleu``, ``test_bleu_sd``, ``test_bleu_runs`` and ``dev_bleu`` to
    every row, the same prefixed ``beside_``, and returns
    {"system_lm": the same for the unchanged lists, "lists", "tunings", "note"}."""
    from nlmfeature.bench.mt import KbestMatrix, rerank
    from nlmfeature.core.model import load
    from nlmfeature.io.atomicfile import open_output
    from nlmfeature.io.textio import read_lines
    from nlmfeature.mt.evaluate import make_metrics, scores_from_stats, sentence_stats
    from nlmfeature.mt.kbest import format_number, read_kbest
    from nlmfeature.mt.rescore import sentence_logprobs
    from nlmfeature.mt.weights import new_feature_weight, read_weights, write_weights
    from nlmfeature.errors import NLMFeatureError
    from nlmfeature.training.kenlm_baseline import KenLMScorer

    # the models are trained afresh every run: nothing in an earlier run's BLEU folder (lists,
    # tuned weights, 1-bests, named by row) may be taken for this run's
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    d = args.nbest_dir
    srcs = {"dev": os.path.join(d, args.dev_nbest), "test": os.path.join(d, "test.tuned.100best.gz")}
    refs = {"dev": read_lines(os.path.join(d, "dev.ref.en.gz")),
            "test": read_lines(os.path.join(d, "test.ref.en.gz"))}
    limit = QUICK_SENTENCES if args.quick else None
    if limit:
        refs = {k: v[:limit] for k, v in refs.items()}
    lists: Dict[str, list] = {}
    for name, path in srcs.items():
        # (a k-best list lists the sentences in order: reading stops after the first ``limit``)
        hyps = list(read_kbest(path) if limit is None
                    else itertools.takewhile(lambda h: h.sid < limit, read_kbest(path)))
        if not hyps or not any(label == "LM0" for label, _ in hyps[0].features):
            raise NLMFeatureError(f"{path}: no LM0= feature to replace (a Moses k-best list of a "
                                  "system with one KenLM feature is expected)")
        if any(label == BESIDE_LABEL for label, _ in hyps[0].features):
            raise NLMFeatureError(f"{path}: the list has a {BESIDE_LABEL}= feature already (a "
                                  "system with two LMs); give the lists of a system with one KenLM feature")
        lists[name] = hyps
    texts = sorted({h.text for hyps in lists.values() for h in hyps})
    index = {t: i for i, t in enumerate(texts)}
    tokens = [t.split() for t in texts]
    init = os.path.join(work, "init.weights")
    tuned = read_weights(os.path.join(d, "moses.tuned.ini"))
    write_weights(init, tuned)
    # beside the lists' LM, the model starts at half its weight (as bench mt starts an NLM)
    init_beside = os.path.join(work, "init.beside.weights")
    write_weights(init_beside, dict(tuned, **{BESIDE_LABEL: [new_feature_weight(tuned)]}))
    bleu = make_metrics("none", False, 0, ("bleu",))["bleu"]
    dev_ref = _quick_ref(refs["dev"], work) if limit else os.path.join(d, "dev.ref.en.gz")
    tune = argparse.Namespace(dev="dev", algorithm="mert", jobs=args.jobs,
                              rescore_restarts=2 if args.quick else 20)
    tunings = 1 if args.quick else args.tunings

    # every row writes the same lists with other LM0 values: each line is formatted once,
    # around its LM0 value, and the reranker's matrix is built once, its LM0 column replaced
    base = {name: KbestMatrix(srcs[name], hyps) for name, hyps in lists.items()}
    lines = {name: [_around_lm0(h) for h in hyps] for name, hyps in lists.items()}
    which = {name: np.asarray([index[h.text] for h in hyps], dtype=np.int64) for name, hyps in lists.items()}

    def measure(tag: str, scores: Optional[List[float]], beside: bool = False) -> Dict[str, Any]:
        """BLEU with ``scores`` (one per distinct hypothesis) as the lists' LM0 values, or with
        ``beside`` as a second LM feature after LM0; None: the lists as they are."""
        paths = {}
        matrices: Dict[str, Any] = {}       # the reranker's matrices, from the lists at hand
        for name, hyps in lists.items():
            p = os.path.join(work, f"{tag}.{name}.nbest.gz")
            lm0 = base[name].x[:, base[name].column("LM0")]
            values = lm0 if scores is None else np.asarray(scores, dtype=np.float64)[which[name]]
            with open_output(p) as f:
                if beside:
                    f.writelines(pre + format_number(float(a)) + f" {BESIDE_LABEL}= " + format_number(float(v))
                                 + post for (pre, post), a, v in zip(lines[name], lm0, values))
                else:
                    f.writelines(pre + format_number(float(v)) + post
                                 for (pre, post), v in zip(lines[name], values))
            paths[name] = p
            matrices[p] = base[name].with_column(BESIDE_LABEL if beside else "LM0", values, p)
        test, dev = [], []
        for seed in range(1, tunings + 1):
            best = rerank(tune, work, tag, paths, init_beside if beside else init, dev_ref, seed, matrices,
                          f"BLEU {tag}", lambda m: None)
            for name, out in (("test", test), ("dev", dev)):
                hyps = read_lines(best[name])[:len(refs[name])]
                hyps += [""] * (len(refs[name]) - len(hyps))
                st = sentence_stats(bleu, hyps, [refs[name]]).sum(axis=0)
                out.append(float(scores_from_stats("bleu", bleu, st)[0]))
        return {"test_bleu": round(float(np.mean(test)), 2),
                "test_bleu_sd": round(float(np.std(test, ddof=1)) if len(test) > 1 else 0.0, 2),
                "test_bleu_runs": [round(x, 2) for x in test], "dev_bleu": round(float(np.mean(dev)), 2)}

    system = measure("system-lm", None)
    log(f"BLEU: the decoder's own LM {system['test_bleu']:.2f} (test) over {len(texts)} distinct hypotheses")
    for i, r in enumerate(rows):
        t0 = time.time()
        if r["kind"] == "neural":
            scores = sentence_logprobs(load(r["path"]), tokens)
        else:
            scores = KenLMScorer(r["path"], vocab).sentence_logprobs(tokens)
        r.update(measure(f"row{i}", scores))
        r.update({f"beside_{k}": v for k, v in measure(f"row{i}.beside", scores, beside=True).items()})
        log(f"BLEU: {r['model']}: test {r['test_bleu']:.2f} as the only LM, {r['beside_test_bleu']:.2f} "
            f"beside the lists' LM ({time.time() - t0:.0f} s)")
    note = (f"each model as the only LM of the Moses k-best lists in {d} ({args.dev_nbest}, "
            f"test.tuned.100best.gz{'; first %d sentences' % limit if limit else ''}) and beside their "
            f"LM ({BESIDE_LABEL}), MERT x{tunings} on dev; rescoring, not decoding")
    return {"system_lm": system, "lists": srcs, "tunings": tunings, "note": note}


def decoder_figures(rows: List[Dict[str, Any]], args: argparse.Namespace, work: str, log) -> Dict[str, Any]:
    """Each row's model as the language model of the decoder ``--moses`` (Moses or Moses2 with
    NLMFeature): ``--decoder-config`` with its one KENLM line replaced by the row's model (a
    KENLM line for a KenLM file, an NLMFeature line for a neural one, under the same label and
    weight), one thread.  Adds to every row ``decoder_load_seconds`` (the wall seconds of
    translating an empty input), ``decoder_peak_mb`` (the process's peak resident memory
    translating the first ``--decoder-sentences`` lines of ``--decoder-input``; decode time is
    ``benchmarks/bench_decoder.py``'s measurement, not this one's); returns the same figures
    of the config without a language model ("no_lm": what the tables and the search take) and
    the run's settings."""
    from nlmfeature.bench import rss_of
    from nlmfeature.errors import InputError, NLMFeatureError
    from nlmfeature.io.atomicfile import atomic_write_text
    from nlmfeature.io.textio import read_lines
    from nlmfeature.mt.moses import add_features, command, drop_features
    from nlmfeature.mt.weights import read_weights

    cfg = args.decoder_config
    os.makedirs(work, exist_ok=True)
    no_lm = os.path.join(work, "no-lm.moses.ini")
    labels = drop_features(cfg, no_lm, ("KENLM",))
    if len(labels) != 1:
        raise InputError(cfg, 0, f"{len(labels)} KENLM feature lines: the decoder figures swap the one "
                         "language model of a system for each model")
    label = labels[0]
    weight = read_weights(cfg).get(label)
    if not weight:
        raise InputError(cfg, 0, f"no weight for the language model {label}")
    src = read_lines(args.decoder_input)[:args.decoder_sentences]
    if not src:
        raise InputError(args.decoder_input, 0, "no sentences to translate")
    inp, empty = os.path.join(work, "input.txt"), os.path.join(work, "empty.txt")
    atomic_write_text(inp, "".join(line + "\n" for line in src))
    atomic_write_text(empty, "")

    def measure(ini: str) -> Dict[str, Any]:
        try:
            load_s, _, _ = rss_of(command(args.moses, ini, empty))
            _, rss, _ = rss_of(command(args.moses, ini, inp))
        except NLMFeatureError as exc:
            raise NLMFeatureError(f"the decoder failed on {ini}: {exc}") from None
        return {"decoder_load_seconds": round(load_s, 2), "decoder_peak_mb": round(rss / 1e6, 1)}

    base = measure(no_lm)
    log(f"decoder: no LM: {base['decoder_peak_mb']:.0f} MB peak, {base['decoder_load_seconds']:.1f} s to load")
    for i, r in enumerate(rows):
        if r["kind"] == "neural":     # (its order comes from the file)
            line = f"NLMFeature name={label} path={os.path.abspath(r['path'])}"
        else:
            line = f"KENLM name={label} factor=0 path={os.path.abspath(r['path'])} order=5"
        ini = add_features(no_lm, os.path.join(work, f"row{i}.moses.ini"), [line], {label: weight})
        r.update(measure(ini))
        log(f"decoder: {r['model']}: {r['decoder_peak_mb']:.0f} MB peak, {r['decoder_load_seconds']:.1f} s "
            "to load")
    return {"no_lm": base, "moses": args.moses, "config": cfg, "input": args.decoder_input,
            "sentences": len(src), "threads": 1}


#: the label of a model added beside the lists' own LM (LM0)
BESIDE_LABEL = "LM1"
#: an LM0 value no list holds, marking where a line's LM0 value goes (see _around_lm0)
_MARK = 0.12345678901234568


def _around_lm0(hyp) -> Tuple[str, str]:
    """``hyp``'s k-best line (Moses format, with its newline) split around its LM0 value:
    ``pre + format_number(value) + post`` is the line with LM0 = value."""
    from nlmfeature.mt.kbest import format_hypothesis

    marked = [(lab, [_MARK] if lab == "LM0" else v) for lab, v in hyp.features]
    line = format_hypothesis(dataclasses.replace(hyp, features=marked), "moses") + "\n"
    pre, mark, post = line.partition(f"LM0= {_MARK!r}")
    if not mark or mark in post:
        raise ValueError(f"sentence {hyp.sid}: cannot place the LM0 value in its k-best line")
    return pre + "LM0= ", post


def _quick_ref(lines: List[str], work: str) -> str:
    """The dev references of the --quick subset, as a file for the tuner."""
    from nlmfeature.io.atomicfile import atomic_write_text

    p = os.path.join(work, "dev.ref.quick")
    atomic_write_text(p, "".join(line + "\n" for line in lines))
    return p


def plot(rows: List[Dict[str, Any]], path: str, title: str, no_lm_mb: Optional[float] = None) -> None:
    """Perplexity (and, when measured, BLEU as the only LM and beside the lists' LM, and the
    decoder's peak memory, with ``no_lm_mb``: that of the decoder without a language model)
    against size (log scale), neural and KenLM models, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nlmfeature.io.atomicfile import atomic_open

    # (label, [(key, series label, filled markers)])
    panels = [("test perplexity", [("test_ppl", "", True)])]
    if any("test_bleu" in r for r in rows):
        series = [("test_bleu", "as the only LM", True)]
        if any("beside_test_bleu" in r for r in rows):
            series.append(("beside_test_bleu", "beside the lists' LM", False))
        panels.append(("test BLEU (k-best)", series))
    if any("decoder_peak_mb" in r for r in rows):
        panels.append(("decoder peak memory (MB)", [("decoder_peak_mb", "", True)]))
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5), squeeze=False)
    for ax, (label, series) in zip(axes[0], panels):
        for key, what, filled in series:
            for kind, marker, color in (("neural", "o", "tab:blue"), ("kenlm", "s", "tab:red")):
                rs = [r for r in rows if r["kind"] == kind and key in r]
                name = "nlmfeature" if kind == "neural" else "KenLM 5-gram"
                ax.scatter([r["MB"] for r in rs], [r[key] for r in rs], marker=marker,
                           color=color if filled else "none", edgecolors=color,
                           label=f"{name}, {what}" if what else name)
                for r in rs:
                    ax.annotate(r["model"], (r["MB"], r[key]), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")
        if series[0][0] == "decoder_peak_mb" and no_lm_mb is not None:
            ax.axhline(no_lm_mb, color="gray", linestyle="--", label="the decoder without an LM")
        ax.set_xscale("log")
        ax.set_xlabel("model file size (MB, log scale)")
        ax.set_ylabel(label)
        ax.set_title(f"{label} against size ({title})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_open(path, suffix=".png") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)
