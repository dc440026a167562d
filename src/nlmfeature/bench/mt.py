"""``nlmfeature bench mt``: translation quality with and without neural LMs, on a real Moses system
(and with ``--decoder cdec`` / ``both`` on cdec's hiero system made from it).

From raw text, as a user would start:

1. ``nlmfeature prepare`` the dev and test sources and references (identical to the Moses Perl
   pipeline the system was trained with);
2. filter the phrase and reordering tables to the sentences translated, binarise the LM
   (Moses then loads in about a second);
3. train the NLM unless ``--model`` gives models (several = several features in one
   system): one model per ``--recipe``, several recipes (the default: the NCE and the
   self-normalised maximum-likelihood 8-grams) as their ensemble in one model file;
4. tune the KenLM-only and the KenLM+NLM system ``--tunings`` times each (MERT seeds 1..N, or
   ``--algorithm mira``) with ``nlmfeature-tune moses``, from the system's tuned KenLM weights;
   with ``--joint MODEL`` a third system, KenLM+NLM+joint (an ``NLMJointFeature`` line, the
   joint model of ``docs/joint.md``), is tuned the same way and compared with both;
5. decode dev and every test set with each tuned system; BLEU and chrF (tokenised, against the
   tokenised lowercased references, as the system's README) and detokenised BLEU (sacremoses,
   against the raw references, sacrebleu's 13a, case-insensitive: as papers report it); mean
   and spread over the tunings, the paired-bootstrap p-value of the difference of the means
   (every resample scores all tunings of both sides), decode seconds per sentence and their
   ratio;
6. the decoder's dev BLEU at every tuning iteration, and the test BLEU of the two candidate
   final weights of each tuning: the last optimiser output and the best decoded weights;
7. k-best rescoring: the first KenLM-only tuning's system (the system's own weights with
   ``--no-decoding``) writes 1000-best lists of dev and test, each hypothesis with its word
   alignment (Moses ``-print-alignment-info-in-n-best``); the features of the ``--model`` and
   ``--rescore-model`` NLMs are appended (``nlmfeature-rescore``: NLM0, NLM1, ...), then those
   of the ``--joint`` models (NNJM0, ..., given the source sentence and the alignment; an
   inverse model, ``train --target-to-source``, gives log p(source | hypothesis): it is a
   rescoring feature only, never put in the decoder); weights
   are tuned on dev ``--tunings`` times per side (KenLM only; KenLM + NLMs; with ``--joint``
   KenLM + NLMs + joint; ``nlmfeature-tune optimise``, MERT seeds 1..N) and every set is
   reranked (``--no-decoding``: this part alone);
8. with ``--second-pass``, decoding then rescoring (:func:`second_pass`): every KenLM + NLM
   tuning's final system writes ``--kbest`` lists of dev and test (with word alignments),
   the ``--rescore-model`` NLMs are appended (e.g. right-to-left models, which the
   left-to-right search cannot use), the weights are retuned on the dev list and every set
   reranked; with ``--joint`` the KenLM + NLM + joint tunings do the same with the
   ``--rescore-model`` NLMs and the inverse joint models (without a direct joint model, the
   KenLM + NLM tunings' lists get them); compared with KenLM-only decoding and with each
   other (part "decoding + rescoring").

Everything goes to ``--workdir``; rerunning the same command reuses every finished step
(tuning runs resume).  ``--quick`` tunes on the first ``--quick-sentences`` dev sentences with
at most 6 iterations (labelled in every output); ``--test-sentences`` cuts the test sets (also
labelled).

``--decoder cdec`` (or ``both``) does steps 4-6 for cdec's hiero system too, labelled cdec
(``nlmfeature.mt.cdec``; needs ``$CDEC_ROOT`` or ``--cdec-root``, a built cdec tree, and
``cdec_ff/libcdec_ff_nlm.so``): cdec's suffix-array extractor (``run_extractor``) extracts
one grammar per dev and test sentence from the Moses system's training pairs and
grow-diag-final-and alignment (kept in ``WORKDIR/cdec``, named by the input's content); the
cdec.ini has the word penalty, KenLM on the same binarised LM and, on the NLM side, one
``feature_function=External libcdec_ff_nlm.so`` line per model (NLM0, NLM1, ...).  Both sides
start from hand-set weights (``nlmfeature.mt.cdec.BASE_WEIGHTS``; the NLM weights at half the
LM's divided by ln 10: cdec's LM feature is log10, the NLM's natural log), are tuned
``--tunings`` times with ``nlmfeature-tune cdec`` on distinct k-best strings (cdec ``-r``; the
NLM side with the persistent cache) and decode dev and test on one thread; the scores,
p-values, seconds per sentence and tuning iterations are reported as the Moses part's.
``--joint`` and the rescoring part are Moses' only.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import math
import os
import shlex
import sys
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from nlmfeature.io.atomicfile import atomic_write_text
from nlmfeature.io.jsonout import dumps_json
from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.io.textio import read_lines as _read
from nlmfeature.mt.moses import (add_features, decode, drop_features, find_moses, prepare_system,
                                 rewrite_moses_ini, set_search_algorithm)

from nlmfeature.mt.weights import new_feature_weight

DEFAULT_SYSTEM = os.path.join("..", "shared", "data", "moses", "multi30k-de-en")
DEFAULT_DATA = os.path.join("..", "shared", "data", "parallel", "multi30k")
#: the models trained when no ``--model`` is given, as ``nlmfeature train`` options, each on one
#: thread so that it is reproducible: the order-8 unnormalised LBL of ``nlmfeature train``'s
#: defaults (NCE) and the same trained by self-normalised maximum likelihood; their ensemble
#: (one model file, :mod:`nlmfeature.core.ensemble`) is the feature of README's bench mt figures
DEFAULT_RECIPES = ("--threads 1",
                   "--output unnormalised --noise-samples 0 --self-normalise 0.1 --threads 1")


#: the systems compared, in the order they are tuned for each seed ('alone' only with
#: --nlm-alone, 'joint' only with --joint)
SIDES = ("base", "nlm", "alone", "joint")
SIDE_LABELS = {"base": "KenLM only", "nlm": "KenLM + NLM", "alone": "NLM only (no KenLM)",
               "joint": "KenLM + NLM + joint"}
#: the comparisons of :func:`collect`: (key prefix, side, against); '' is KenLM + NLM vs KenLM
PAIRS = (("", "nlm", "base"), ("alone_", "alone", "base"), ("joint_", "joint", "base"),
         ("joint_vs_nlm_", "joint", "nlm"))


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _log(msg: str) -> None:
    print(f"[bench mt {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _key(names: Sequence[str]) -> str:
    """A short key of a list of names (model paths): the work folders' names of its runs."""
    import hashlib

    return hashlib.sha1("\n".join(names).encode("utf-8")).hexdigest()[:6]


def _made_by(path: str, recipe: str) -> bool:
    """Whether ``path`` exists and its ``.recipe`` marker (written when it was finished) says
    ``recipe`` made it."""
    done = path + ".recipe"
    return os.path.exists(path) and os.path.exists(done) and open(done).read().strip() == recipe


def _write(path: str, lines: Sequence[str]) -> None:
    atomic_write_text(path, "".join(l + "\n" for l in lines))


def _quiet_call(fn, argv: List[str], what: str, log=None) -> None:
    """Run one of the package's command-line mains (its command line shown by ``log``, default
    this benchmark's); raise when it fails."""
    (log or _log)("$ " + what + " " + " ".join(shlex.quote(a) for a in argv))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = fn(argv)
    if status:
        raise NLMFeatureError(f"{what} failed (status {status}):\n{buf.getvalue()[-2000:]}")


# -- 1. data ------------------------------------------------------------------------------------
def prepare_sets(args: argparse.Namespace, work: str) -> Dict[str, dict]:
    """Prepared dev and test sets: {name: {src, ref, raw_ref, n}} (dev cut with --quick)."""
    from nlmfeature.mt.prepare import Preparer

    sets: Dict[str, dict] = {}
    prep = {l: Preparer(l) for l in (args.src_lang, args.tgt_lang)}
    names = [args.dev] + [t for t in args.test if t != args.dev]
    for name in names:
        out = {}
        limit = args.quick_sentences if (args.quick and name == args.dev) else 0
        if name != args.dev and args.test_sentences:
            limit = args.test_sentences
        tag = f"{name}.{limit}" if limit else name
        for kind, lang in (("src", args.src_lang), ("ref", args.tgt_lang)):
            raw = os.path.join(args.data, f"{name}.{lang}.gz")
            if not os.path.exists(raw):
                raw = os.path.join(args.data, f"{name}.{lang}")
            lines = _read(raw)
            if limit:
                lines = lines[:limit]
            path = os.path.join(work, f"{tag}.{kind}.{lang}")
            if not os.path.exists(path):
                _write(path, list(prep[lang].lines(lines)))
            if kind == "ref":
                out["raw_ref"] = os.path.join(work, f"{tag}.raw.{lang}")
                if not os.path.exists(out["raw_ref"]):
                    _write(out["raw_ref"], lines)
            out[kind] = path
            out["n"] = len(lines)
        sets[name] = out
    return sets


# -- 2. system ----------------------------------------------------------------------------------
#: ``--search``: the ``[search-algorithm]`` of Moses and Moses2 for each search but the
#: system's own (normal stack decoding)
SEARCH_ALGORITHMS = {"cube": "1"}


def build_system(args: argparse.Namespace, work: str, sets: Dict[str, dict]) -> Tuple[str, dict]:
    """A moses.ini on tables filtered to every set's source and a binarised LM
    (:func:`nlmfeature.mt.moses.prepare_system`); returns (path, its weights)."""
    from nlmfeature.mt.weights import read_weights

    ini_src = os.path.join(args.system, f"moses.{args.init}.ini")
    if not os.path.exists(ini_src):
        raise InputError(ini_src, 0, "the Moses system has no such config (--system, --init)")
    # the filtered tables depend on the inputs: one copy per set of input files
    system = prepare_system(ini_src, work, [s["src"] for s in sets.values()], args.system,
                            kenlm_bin=[os.path.join(args.moses_root, "bin")], log=_log)
    ini = system.ini
    if args.search != "normal":
        # another search: its own config, named (and so keyed: tunings, lists) by the search
        name, key, rest = os.path.basename(ini).split(".", 2)
        ini = set_search_algorithm(system.ini, os.path.join(os.path.dirname(ini), f"{name}.{key}-{args.search}.{rest}"),
                                   SEARCH_ALGORITHMS[args.search])
    return ini, read_weights(ini)


def nlm_ini(base_ini: str, dst: str, models: Sequence[str], base_weights: dict) -> dict:
    """``base_ini`` plus one NLMFeature line per model; returns the initial weights."""
    from nlmfeature import load

    weights = dict(base_weights)
    start = new_feature_weight(base_weights)
    feature_lines = []
    for i, m in enumerate(models):
        order = load(m).order
        feature_lines.append(f"NLMFeature name=NLM{i} path={os.path.abspath(m)} order={order}")
        weights[f"NLM{i}"] = [start]
    add_features(base_ini, dst, feature_lines, weights, first=True)
    return weights


def joint_ini(nlm_ini_path: str, dst: str, joint, nlm_weights: dict) -> dict:
    """``nlm_ini_path`` plus one ``NLMJointFeature`` line (labels NNJM0, NNJM1, ...) per joint
    model of ``joint`` (a path or a list of paths), whose weights start at half the LM's, as
    the NLMs'; returns the initial weights."""
    from nlmfeature import load
    from nlmfeature.core.joint import JointModel

    joints = [joint] if isinstance(joint, str) else list(joint)
    weights = dict(nlm_weights)
    lines = []
    for i, j in enumerate(joints):
        if not isinstance(load(j), JointModel):
            raise InputError(j, 0, "not a joint model (no source window): give it with --model, "
                             "or train one with nlmfeature train --source (docs/joint.md)")
        weights[f"NNJM{i}"] = [new_feature_weight(nlm_weights)]
        lines.append(f"NLMJointFeature name=NNJM{i} path={os.path.abspath(j)}")
    add_features(nlm_ini_path, dst, lines, weights, first=True)
    return weights


# -- 3. models ----------------------------------------------------------------------------------
def train_model(args: argparse.Namespace, work: str, dev_ref: str) -> str:
    """The NLM feature when no ``--model`` is given: one model per ``--recipe`` (``nlmfeature
    train`` options; each kept as ``WORK/nlmI.nlm`` with the recipe that made it), and with
    several recipes their ensemble as one model file (``nlmfeature ensemble``:
    ``WORK/nlm.ensemble.nlm``).  Finished models are reused."""
    from nlmfeature.commands import train as train_command
    from nlmfeature.commands.base import command
    from nlmfeature.core.ensemble import write_ensemble

    recipes = args.recipe or list(DEFAULT_RECIPES)
    train = os.path.join(args.system, "train.tok.lc.en.gz")
    paths = []
    for i, recipe in enumerate(recipes):
        path = os.path.join(work, "nlm.nlm" if len(recipes) == 1 else f"nlm{i}.nlm")
        if not _made_by(path, recipe):
            _log(f"training {path}: nlmfeature train {recipe}")
            argv = ["train", "-i", train, "--test-set", dev_ref, "-o", path,
                    "--no-progress"] + shlex.split(recipe)
            _quiet_call(command(train_command), argv, "nlmfeature")
            _write(path + ".recipe", [recipe])
        paths.append(path)
    if len(paths) == 1:
        return paths[0]
    ens = os.path.join(work, "nlm.ensemble.nlm")
    if not _made_by(ens, "\n".join(recipes)):
        write_ensemble(ens, paths)
        _write(ens + ".recipe", recipes)
    return ens


# -- 4/5. tuning and decoding -------------------------------------------------------------------
class MosesDecoding:
    """How the Moses part tunes and decodes (:func:`decoding`): ``nlmfeature-tune moses`` on a
    moses.ini, final configs with the tuned weights, ``nlmfeature.mt.moses.decode``."""

    name = "Moses"
    source = "src"                     #: the key of a set's decoder input

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def tune_argv(self, config: str) -> List[str]:
        return ["moses", "--moses", self.args.moses, "--config", config]

    def initial_weights(self, config: str) -> dict:
        from nlmfeature.mt.weights import read_weights

        return read_weights(config)

    def final(self, config: str, tdir: str, rule: str, weights: dict) -> str:
        """The config decoding with ``weights`` (the tuning's ``rule`` weights)."""
        return rewrite_moses_ini(config, os.path.join(tdir, f"final.{rule}.moses.ini"), weights)

    def decode(self, final: str, s: dict, out: str) -> float:
        return decode(self.args.moses, final, s[self.source], out, self.args.threads)


class CdecDecoding:
    """How the cdec part tunes and decodes (:func:`decoding`): ``nlmfeature-tune cdec
    --distinct`` on a cdec.ini and its starting weights file, final weights files,
    ``nlmfeature.mt.cdec.decode`` of the per-sentence grammar inputs (one thread: cdec has no
    other)."""

    name = "cdec"
    source = "sgm"

    def __init__(self, args: argparse.Namespace, binary: str, weights: Dict[str, str]) -> None:
        self.args = args
        self.binary = binary
        self.weights = weights         #: config -> its starting weights file

    def tune_argv(self, config: str) -> List[str]:
        # distinct k-best strings (cdec -r): hiero derivations repeat the same string so often
        # that without it MERT sees too few alternatives and its next weights collapsed (100
        # Multi30k dev sentences, KenLM + NLM, seed 1, 4 iterations: dev BLEU 35.13 0.83 1.91
        # 35.38 without, 35.13 35.82 40.33 43.52 with)
        return ["cdec", "--cdec", self.binary, "--config", config, "--weights",
                self.weights[config], "--distinct"]

    def initial_weights(self, config: str) -> dict:
        from nlmfeature.mt.weights import read_weights

        return read_weights(self.weights[config])

    def final(self, config: str, tdir: str, rule: str, weights: dict) -> Tuple[str, str]:
        from nlmfeature.mt.cdec import write_cdec_weights

        return config, write_cdec_weights(os.path.join(tdir, f"final.{rule}.weights"), weights)

    def decode(self, final: Tuple[str, str], s: dict, out: str) -> float:
        from nlmfeature.mt import cdec

        return cdec.decode(self.binary, final[0], final[1], s[self.source], out)


def tune(args: argparse.Namespace, dec, ini: str, dev: dict, tdir: str, seed: int,
         cache_features: Sequence[str] = ()) -> dict:
    """One ``nlmfeature-tune moses`` / ``cdec`` run (``dec``: :class:`MosesDecoding` or
    :class:`CdecDecoding`); returns its iterations and candidate final weights.
    ``cache_features``: the NLM feature names (Moses classes, cdec library file names) that
    get the persistent cache (none: no cache)."""
    from nlmfeature.commands.tune import main as tune_main
    from nlmfeature.mt.tuning.driver import DriverState, best_decoded, decoded_weights

    argv = dec.tune_argv(ini) + [
        "--source", dev[dec.source], "--ref", dev["ref"], "--workdir", tdir, "--threads",
        str(args.threads), "--algorithm", args.algorithm, "--seed", str(seed),
        "--max-iterations", str(args.max_iterations), "--nbest-size", str(args.nbest_size),
        "--jobs", str(args.jobs), "--quiet"]
    if cache_features:
        argv += ["--persistent-cache", os.path.join(os.path.dirname(tdir), "nlm-cache")]
        for feature in cache_features:
            argv += ["--nlm-feature", feature]
    _quiet_call(tune_main, argv, "nlmfeature-tune")
    state = DriverState.load(os.path.join(tdir, "state.json"))
    initial = dec.initial_weights(ini)
    it, dev_bleu, best = best_decoded(state, initial)
    hist = sorted(state.history, key=lambda h: h["iteration"])
    return dict(seed=seed, iterations=[dict(iteration=h["iteration"], dev_bleu=h.get("dev_bleu"),
                                            pool_bleu_after=h.get("pool_bleu_after"),
                                            decode_seconds=h.get("decode_seconds"))
                                       for h in hist],
                stop_reason=state.stop_reason, best_iteration=it, best_dev_bleu=dev_bleu,
                weights={"last": state.weights, "best": best},
                decoded=len(decoded_weights(state, initial)))


def dev_output(tdir: str, iteration: int) -> str:
    """The dev 1-best of a tuning's iteration: Moses' ``runK.out``, else (cdec) the first
    hypothesis of every sentence of ``runK.kbest.gz``, written once into ``runK.1best``."""
    from nlmfeature.mt.kbest import first_hypotheses

    out = os.path.join(tdir, f"run{iteration}.out")
    if os.path.exists(out):
        return out
    one = os.path.join(tdir, f"run{iteration}.1best")
    if not os.path.exists(one):
        _write(one, first_hypotheses(os.path.join(tdir, f"run{iteration}.kbest.gz")))
    return one


def decoding(args: argparse.Namespace, dec, sides: Sequence[tuple], sets: Dict[str, dict],
             scorers: Dict[str, "Scorer"], root: str) -> dict:
    """Steps 4-6 for one decoder (``dec``): every side (``(side, config, tag, cached
    features)``) tuned ``--tunings`` times in ``root/TAG.ALGORITHM.SEED``, every set decoded
    with the last and the best decoded weights of each tuning; returns {"scores" (of the
    ``--final-weights`` outputs, :func:`collect`), "tunings", "final_weights_rule"}."""
    tunings: Dict[str, List[dict]] = {side: [] for side, *_ in sides}
    runs: Dict[str, List[Dict[str, str]]] = {side: [] for side, *_ in sides}
    seconds: Dict[str, Dict[str, List[float]]] = {n: {side: [] for side, *_ in sides}
                                                  for n in sets}
    for seed in range(1, args.tunings + 1):
        for side, ini, tag, cached in sides:
            tdir = os.path.join(root, f"{tag}.{args.algorithm}{seed}")
            t0 = time.time()
            info = tune(args, dec, ini, sets[args.dev], tdir, seed, cached)
            _log(f"{dec.name} {side} seed {seed}: {len(info['iterations'])} iterations, dev BLEU "
                 + " ".join(f"{i['dev_bleu']:.2f}" for i in info["iterations"])
                 + f" ({time.time() - t0:.0f} s)")
            outs: Dict[str, Dict[str, str]] = {"last": {}, "best": {}}
            same = info["weights"]["last"] == info["weights"]["best"]
            for rule in ("last", "best"):
                final = dec.final(ini, tdir, rule, info["weights"][rule])
                for name, s in sets.items():
                    if rule == "best" and same:
                        outs[rule][name] = outs["last"][name]
                        continue
                    if rule == "best" and name == args.dev:
                        # the tuning run decoded dev with these weights: its 1-best output
                        outs[rule][name] = dev_output(tdir, info["best_iteration"])
                        continue
                    out = os.path.join(tdir, f"{name}.{rule}.1best")
                    secs = dec.decode(final, s, out)
                    if rule == args.final_weights or same:
                        seconds[name][side].append(secs)
                    outs[rule][name] = out
            info["outputs"] = outs
            info.pop("weights")
            tunings[side].append(info)
            runs[side].append(outs[args.final_weights])
    sizes = {n: s["n"] for n, s in sets.items()}
    scores = collect(scorers, runs, args.bootstrap, seconds, sizes)
    # the tuning rule: test BLEU of the last vs the best decoded weights of every tuning
    rule_rows = []
    for side, *_ in sides:
        for info in tunings[side]:
            row = dict(side=side, seed=info["seed"], best_iteration=info["best_iteration"],
                       iterations=len(info["iterations"]))
            for rule in ("last", "best"):
                for name in sets:
                    st = scorers[name].stats(info["outputs"][rule][name])["bleu"]
                    row[f"{name}.{rule}"] = score(scorers[name], "bleu", st)
            rule_rows.append(row)
    return dict(scores=scores, tunings=tunings, final_weights_rule=rule_rows)


def cdec_part(args: argparse.Namespace, work: str, sets: Dict[str, dict], models: Sequence[str],
              mkey: str, key: str, scorers: Dict[str, "Scorer"]) -> dict:
    """The cdec part (``--decoder cdec`` / ``both``): a hiero system from the Moses system's
    training pairs and alignment (``nlmfeature.mt.cdec``; grammars of every set extracted
    once, in ``WORKDIR/cdec``), KenLM alone and KenLM + the NLMs (``feature_function=External
    cdec_ff/libcdec_ff_nlm.so``, weights NLM0, NLM1, ... starting at half the LM's in its
    log10 units), both
    tuned from :data:`nlmfeature.mt.cdec.BASE_WEIGHTS` and decoded as the Moses part is
    (:func:`decoding`)."""
    from nlmfeature.mt import cdec

    cwork = os.path.join(work, "cdec")
    binary = cdec.find_cdec(args.cdec, args.cdec_root)
    extractor = cdec.find_extractor(args.cdec_root)
    shim = cdec.find_shim(args.cdec_ff)
    bitext, align = cdec.training_pairs(args.system, cwork, args.src_lang, args.tgt_lang)
    csets: Dict[str, dict] = {}
    for name, s in sets.items():
        g = cdec.extract_grammars(s["src"], cwork, bitext, align, extractor)
        if g.seconds:
            _log(f"cdec: grammars of {g.sentences} {name} sentences extracted in "
                 f"{g.seconds:.0f} s: {g.sgm}")
        csets[name] = dict(s, sgm=g.sgm)
    kenlm_bin = [os.path.join(args.moses_root, "bin")] if args.moses_root else []
    lm = cdec.system_lm(os.path.join(args.system, f"moses.{args.init}.ini"), work, args.system,
                        kenlm_bin)
    base_ini = cdec.write_ini(os.path.join(cwork, "base.cdec.ini"), lm)
    nlm_ini_path = cdec.write_ini(os.path.join(cwork, f"nlm{mkey}.cdec.ini"), lm,
                                  [cdec.nlm_feature_line(m, f"NLM{i}", shim)
                                   for i, m in enumerate(models)])
    # half the LM's weight, as in the Moses part, in the LM's units: cdec's KenLM feature is
    # log10 (Moses' is ln), the NLM's natural log
    half = cdec.BASE_WEIGHTS["LanguageModel"][0] / 2 / math.log(10)
    weights = {
        base_ini: cdec.write_cdec_weights(os.path.join(cwork, "base.weights"), cdec.BASE_WEIGHTS),
        nlm_ini_path: cdec.write_cdec_weights(
            os.path.join(cwork, f"nlm{mkey}.weights"),
            dict(cdec.BASE_WEIGHTS, **{f"NLM{i}": [half] for i in range(len(models))}))}
    sides = [("base", base_ini, "base", ()),
             ("nlm", nlm_ini_path, "nlm" + mkey, (os.path.basename(shim),))]
    res = decoding(args, CdecDecoding(args, binary, weights), sides, csets, scorers,
                   os.path.join(cwork, f"tuning.{key}"))
    res.update(cdec=binary, shim=shim, lm=lm, configs={"base": base_ini, "nlm": nlm_ini_path},
               inputs={name: s["sgm"] for name, s in csets.items()})
    return res


def print_decoding(title: str, part: dict, sets: Dict[str, dict], dev: str) -> None:
    """The scores, tuning iterations and final-weight rules of one decoding part."""
    print(format_table(title, part["scores"]))
    print("\n== tuning iterations (decoder dev BLEU) and test BLEU of the final-weight rules")
    infos = [i for side in SIDES for i in part["tunings"].get(side, [])]
    for row, info in zip(part["final_weights_rule"], infos):
        its = " ".join(f"{i['dev_bleu']:.2f}" for i in info["iterations"])
        rules = "  ".join(f"{n}: last {row[n + '.last']:.2f} best {row[n + '.best']:.2f}"
                          for n in sets)
        print(f"{row['side']:<5} seed {row['seed']}: {its}  (best at {row['best_iteration']})"
              f"  {rules}")
    for n in [n for n in sets if n != dev]:
        d = [r[f"{n}.best"] - r[f"{n}.last"] for r in part["final_weights_rule"]]
        print(f"{n}: best-decoded minus last, mean {np.mean(d):+.2f} over {len(d)} tunings "
              f"({sum(x > 0 for x in d)} better, {sum(x < 0 for x in d)} worse)")


# -- scores -------------------------------------------------------------------------------------
class Scorer:
    """Per-sentence statistics of one test set: tokenised BLEU/chrF and detokenised BLEU."""

    def __init__(self, ref: str, raw_ref: str, tgt_lang: str) -> None:
        from nlmfeature.mt.evaluate import make_metrics

        self.refs = [_read(ref)]
        self.raw = [_read(raw_ref)]
        self.lang = tgt_lang
        self.tok = make_metrics("none", False, 0, ("bleu", "chrf"))
        self.detok = make_metrics("13a", True, 0, ("bleu",))["bleu"]

    def stats(self, hyp_path: str) -> Dict[str, np.ndarray]:
        return self.stats_lines(_read(hyp_path), hyp_path)

    def stats_lines(self, hyps: List[str], where: str = "<hypotheses>") -> Dict[str, np.ndarray]:
        """Per-sentence statistics of the translations ``hyps`` (one per reference line)."""
        from nlmfeature.mt.evaluate import sentence_stats
        from nlmfeature.mt.prepare import detokenise

        if len(hyps) != len(self.refs[0]):
            raise InputError(where, len(hyps), f"{len(hyps)} lines for "
                             f"{len(self.refs[0])} references")
        out = {name: sentence_stats(m, hyps, self.refs) for name, m in self.tok.items()}
        out["detok_bleu"] = sentence_stats(self.detok, list(detokenise(hyps, self.lang)), self.raw)
        return out

    def metric(self, name: str):
        return self.detok if name == "detok_bleu" else self.tok[name]


def score(scorer: Scorer, name: str, stats: np.ndarray) -> float:
    from nlmfeature.mt.evaluate import scores_from_stats

    base = "bleu" if name == "detok_bleu" else name
    return float(scores_from_stats(base, scorer.metric(name), stats.sum(axis=0))[0])


def mean_pair_bootstrap(scorer: Scorer, name: str, runs_a: List[np.ndarray],
                        runs_b: List[np.ndarray], samples: int, seed: int = 12345) -> float:
    """p-value of the difference of the mean scores of two groups of systems: every resample
    scores every run of both groups on the same sentences (paired bootstrap as sacrebleu's,
    applied to the means)."""
    from nlmfeature.mt.evaluate import resample_indices, resampled_sums, scores_from_stats

    base = "bleu" if name == "detok_bleu" else name
    metric = scorer.metric(name)
    idx = resample_indices(len(runs_a[0]), samples, seed)
    mean = lambda runs: np.mean([scores_from_stats(base, metric, resampled_sums(r, idx))  # noqa: E731
                                 for r in runs], axis=0)
    sa, sb = mean(runs_a), mean(runs_b)
    observed = abs(np.mean([score(scorer, name, r) for r in runs_b]) -
                   np.mean([score(scorer, name, r) for r in runs_a]))
    diffs = np.abs(sb - sa)
    centred = diffs - diffs.mean()
    return (int(np.sum(centred >= observed)) + 1) / (samples + 1)


def summarise(values: Sequence[float]) -> dict:
    v = np.asarray(values, dtype=np.float64)
    return dict(mean=float(v.mean()), sd=float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                min=float(v.min()), max=float(v.max()), runs=[float(x) for x in v])


# -- 7. rescoring -------------------------------------------------------------------------------
class KbestMatrix:
    """A k-best list's feature values as one matrix, for reranking under many weight vectors."""

    def __init__(self, path: str, hypotheses: Optional[Iterable] = None) -> None:
        """The list in ``path``, or its ``hypotheses`` when they are at hand (already read)."""
        from nlmfeature.mt.kbest import read_kbest

        self.path = path
        rows, sids, self.texts = [], [], []
        self.labels: List[Tuple[str, int]] = []
        for hyp in read_kbest(path) if hypotheses is None else hypotheses:
            if not self.labels:
                self.labels = [(l, len(v)) for l, v in hyp.features]
            elif [l for l, _ in hyp.features] != [l for l, _ in self.labels]:
                raise InputError(path, 0, f"sentence {hyp.sid}: features differ from the first "
                                 "line's")
            rows.append(hyp.dense())
            sids.append(hyp.sid)
            self.texts.append(hyp.text)
        self.x = np.asarray(rows, dtype=np.float64)
        self.sids = np.asarray(sids, dtype=np.int64)
        if len(self.sids) and np.any(np.diff(self.sids) < 0):
            raise InputError(path, 0, "sentence ids are not in order (a k-best list lists each "
                             "sentence's hypotheses together, ids ascending)")
        #: where each sentence's run of rows starts, and the end
        self.offsets = np.flatnonzero(np.diff(self.sids, prepend=-1, append=-2)).astype(np.int64) \
            if len(self.sids) else np.zeros(1, dtype=np.int64)

    def column(self, label: str) -> int:
        """The column of single-valued feature ``label`` in :attr:`x`."""
        at = 0
        for l, k in self.labels:
            if l == label:
                if k != 1:
                    raise ValueError(f"{self.path}: feature {label} has {k} values, not one")
                return at
            at += k
        raise KeyError(f"{self.path}: no feature {label}")

    def with_column(self, label: str, values: np.ndarray, path: str) -> "KbestMatrix":
        """The same list with single-valued feature ``label`` set to ``values`` (one per row),
        as the list written to ``path``; a label the list lacks becomes a new last feature.
        This matrix is left as it is."""
        other = copy.copy(self)
        other.path = path
        if any(l == label for l, _ in self.labels):
            other.x = self.x.copy()
            other.x[:, self.column(label)] = values
        else:
            other.x = np.column_stack([self.x, np.asarray(values, dtype=np.float64)])
            other.labels = self.labels + [(label, 1)]
        return other

    def one_best(self, weights: dict) -> List[str]:
        """The highest-scoring hypothesis per sentence (labels without a weight count as 0)."""
        w = np.concatenate([np.asarray(weights.get(l, [0.0] * k), dtype=np.float64)
                            for l, k in self.labels])
        from nlmfeature._mert import segment_argmax

        # the tuner's reranking kernel: the first of equals within each sentence's run of rows
        rows = segment_argmax(np.ascontiguousarray(self.x @ w), self.offsets)
        pick = np.full(int(self.sids.max()) + 1, -1, dtype=np.int64)
        pick[self.sids[self.offsets[:-1]]] = rows
        return [self.texts[i] if i >= 0 else "" for i in pick]


def rescoring(args: argparse.Namespace, work: str, sets: Dict[str, dict], base_ini: str,
              base_weights: dict, models: Sequence[str], scorers: Dict[str, Scorer],
              mkey: str, joints: Sequence[str] = ()) -> dict:
    """Step 7: the KenLM-only system's k-best lists of every set (with word alignments), the
    target-only features ``models`` (``NLM0``, ``NLM1``, ...) appended, then the joint models
    ``joints`` (``NNJM0``, ... given each set's source), weights tuned on dev ``--tunings``
    times per side (``nlmfeature-tune optimise``, MERT seeds 1..N) and every set reranked.
    Returns {"kbest", "features": {side: labels}, "systems": {side: [{set: 1-best path}]}}
    with the sides 'base', 'nlm' and (with ``joints``) 'joint'."""
    from nlmfeature.mt.weights import write_weights

    rdir = work
    os.makedirs(rdir, exist_ok=True)
    ini = os.path.join(rdir, "kbest.moses.ini")
    rewrite_moses_ini(base_ini, ini, base_weights)
    nlm_names = [f"NLM{i}" for i in range(len(models))]
    joint_names = [f"NNJM{i}" for i in range(len(joints))]
    jkey = _key(list(models) + ["joint"] + list(joints))
    tags = {"base": "base", "nlm": "nlm" + mkey, "joint": "joint" + jkey}
    sides = ["base", "nlm"] + (["joint"] if joints else [])
    lists: Dict[str, Dict[str, str]] = {}
    for name, s in sets.items():
        # with word alignments ('.wa'): the joint models' affiliations come from them
        kb = os.path.join(rdir, f"{name}.{args.kbest}best" + (".distinct" if args.distinct else "")
                          + ".wa")
        decode(args.moses, ini, s["src"], os.path.join(rdir, f"{name}.decoder.1best"),
               args.threads, args.kbest, kb, args.distinct, alignment=True)
        nlm_kb = append_features(kb, kb + f".{tags['nlm']}.gz", models, nlm_names, args.jobs)
        lists[name] = {"base": kb, "nlm": nlm_kb}
        if joints:
            lists[name]["joint"] = append_features(nlm_kb, kb + f".{tags['joint']}.gz", joints,
                                                   joint_names, args.jobs, s["src"])
    # new features start at half the LM weight (as in the decoding part)
    half = base_weights.get("LM0", [0.1])[0] / 2
    inits = {"base": dict(base_weights)}
    inits["nlm"] = dict(inits["base"], **{n: [half] for n in nlm_names})
    inits["joint"] = dict(inits["nlm"], **{n: [half] for n in joint_names})
    out: dict = {"kbest": args.kbest, "systems": {},
                 "features": {"base": [], "nlm": nlm_names, "joint": nlm_names + joint_names}}
    if not joints:
        out["features"].pop("joint")
    for side in sides:
        init = os.path.join(rdir, f"init.{tags[side]}.weights")
        write_weights(init, inits[side])
        matrices: Dict[str, KbestMatrix] = {}      # one side's lists in memory at a time
        out["systems"][side] = [
            rerank(args, rdir, tags[side], {n: lists[n][side] for n in sets}, init,
                   sets[args.dev]["ref"], seed, matrices, f"rescoring {side}")
            for seed in range(1, args.tunings + 1)]
    return out


def append_features(kbest: str, out: str, models: Sequence[str], names: Sequence[str],
                    jobs: int, source: Optional[str] = None) -> str:
    """``out``: the k-best list ``kbest`` with one feature per model (named ``names``)
    appended by ``nlmfeature-rescore`` (joint models given the ``source`` sentences), written
    once; returns ``out``."""
    from nlmfeature.commands.rescore import main as rescore_main

    if not os.path.exists(out):
        argv = ["-i", kbest, "-o", out, "-q", "-j", str(jobs)]
        if source:
            argv += ["--source", source]
        for m, n in zip(models, names):
            argv += ["-m", m, "--name", n]
        _quiet_call(rescore_main, argv, "nlmfeature-rescore")
    return out


def rerank(args: argparse.Namespace, rdir: str, tag: str, lists: Dict[str, str], init: str,
           dev_ref: str, seed: int, matrices: Dict[str, "KbestMatrix"], what: str, log=None
           ) -> Dict[str, str]:
    """Weights tuned on the dev k-best list (``lists[--dev]``) from ``init`` by
    ``nlmfeature-tune optimise`` (``--algorithm``, MERT seed ``seed``), kept in
    ``rdir/TAG.ALGORITHM.SEED.weights``, and every set's list reranked with them; returns
    {set: 1-best path}.  ``matrices`` keeps the lists read, by path, for the next seed;
    ``log`` shows progress (default: this benchmark's log)."""
    from nlmfeature.commands.tune import main as tune_main
    from nlmfeature.mt.weights import read_weights

    tag = f"{tag}.{args.algorithm}{seed}"
    if args.rescore_restarts != 20:
        tag += f".r{args.rescore_restarts}"
    w = os.path.join(rdir, f"{tag}.weights")
    if not os.path.exists(w):
        t0 = time.time()
        _quiet_call(tune_main,
                    ["optimise", "--nbest", lists[args.dev], "--ref", dev_ref, "--init", init,
                     "--algorithm", args.algorithm, "--seed", str(seed), "--restarts",
                     str(args.rescore_restarts), "--jobs", str(args.jobs), "--out", w,
                     "--quiet"], "nlmfeature-tune", log)
        (log or _log)(f"{what} seed {seed}: tuned in {time.time() - t0:.0f} s")
    per_set = {}
    for name, path in lists.items():
        one = os.path.join(rdir, f"{name}.{tag}.1best")
        if not os.path.exists(one):
            if path not in matrices:
                matrices[path] = KbestMatrix(path)
            _write(one, matrices[path].one_best(read_weights(w)))
        per_set[name] = one
    return per_set


def second_pass(args: argparse.Namespace, root: str, sets: Dict[str, dict], tags: Dict[str, str],
                n_models: int, n_direct: int, extra: Sequence[str], inverse: Sequence[str],
                base_runs: List[Dict[str, str]]) -> dict:
    """Decoding, then rescoring (``--second-pass``).  Every tuning of the decoding part that a
    side starts from (``root/TAG.ALGORITHM.SEED``, final config ``final.RULE.moses.ini``)
    writes ``--kbest`` lists of every set with Moses' word alignments, once, into its
    ``second-pass`` folder; each side appends its rescoring features and retunes the weights
    on the dev list (MERT seed = the tuning's seed; the new features start at half the LM's)
    and reranks every set:

    - 'nlm': the KenLM + NLM tunings (``tags['nlm']``), the target-only ``extra`` NLMs
      appended (features NLM<n_models>, ...);
    - 'joint' (when the decoding part has a joint side, ``tags['joint']``, or ``inverse`` joint
      models are given): the KenLM + NLM + joint tunings, else the KenLM + NLM ones, with
      ``extra`` and then the ``inverse`` models (train --target-to-source: log p(source |
      hypothesis) from the hypothesis' alignment; NNJM<n_direct>, ...).

    Returns {"features": {side: names}, "systems": {"base": ``base_runs`` (KenLM-only
    decoding), side: [{set: reranked 1-best}]}}."""
    from nlmfeature.mt.weights import read_weights, write_weights

    nlm_names = [f"NLM{n_models + i}" for i in range(len(extra))]
    inv_names = [f"NNJM{n_direct + i}" for i in range(len(inverse))]
    plan = {"nlm": (tags["nlm"], list(extra), nlm_names)}
    if "joint" in tags or inverse:
        plan["joint"] = (tags.get("joint", tags["nlm"]), list(extra) + list(inverse),
                         nlm_names + inv_names)
    systems: Dict[str, list] = {"base": base_runs}
    for side, (tag, appended, names) in plan.items():
        fkey = _key(appended)
        systems[side] = []
        for seed in range(1, args.tunings + 1):
            tdir = os.path.join(root, f"{tag}.{args.algorithm}{seed}")
            ini = os.path.join(tdir, f"final.{args.final_weights}.moses.ini")
            rdir = os.path.join(tdir, "second-pass")
            os.makedirs(rdir, exist_ok=True)
            lists = {}
            for name, s in sets.items():
                kb = os.path.join(rdir, f"{name}.{args.kbest}best"
                                  + (".distinct" if args.distinct else "") + ".wa")
                decode(args.moses, ini, s["src"], os.path.join(rdir, f"{name}.decoder.1best"),
                       args.threads, args.kbest, kb, args.distinct, alignment=True)
                lists[name] = (append_features(kb, kb + f".{fkey}.gz", appended, names, args.jobs,
                                               s["src"] if inverse and side == "joint" else None)
                               if appended else kb)
            weights = read_weights(ini)
            half = weights.get("LM0", [0.1])[0] / 2
            init = os.path.join(rdir, f"init.{fkey}.weights")
            write_weights(init, dict(weights, **{n: [half] for n in names}))
            systems[side].append(rerank(args, rdir, f"rescored{fkey}", lists, init,
                                        sets[args.dev]["ref"], seed, {},
                                        f"second pass {side} (tuning {seed})"))
    return dict(features={side: plan[side][2] for side in plan}, systems=systems)


# -- report -------------------------------------------------------------------------------------
def collect(scorers: Dict[str, Scorer], runs: Dict[str, List[Dict[str, str]]], samples: int,
            seconds: Optional[Dict[str, Dict[str, List[float]]]] = None,
            sizes: Optional[Dict[str, int]] = None) -> dict:
    """Scores of every run of 'base' and 'nlm' (and 'alone' and 'joint' when ``runs`` has
    them) per set, their summaries and p-values (:data:`PAIRS`): 'difference' / 'p_value' of
    nlm vs base, 'alone_difference' / 'alone_p_value' of alone vs base, 'joint_difference' /
    'joint_p_value' of joint vs base, 'joint_vs_nlm_difference' / 'joint_vs_nlm_p_value'.
    With ``seconds``: 'seconds_per_sentence' of each side, 'ratio' (nlm over base),
    'alone_ratio' and 'joint_ratio'."""
    res: dict = {}
    names = [side for side in SIDES if runs.get(side)]
    pairs = [p for p in PAIRS if p[1] in names and p[2] in names]
    for name, scorer in scorers.items():
        stats = {side: [scorer.stats(r[name]) for r in runs[side]] for side in names}
        entry: dict = {}
        for metric in ("bleu", "chrf", "detok_bleu"):
            sides = {side: summarise([score(scorer, metric, st[metric]) for st in stats[side]])
                     for side in names}
            for prefix, b, a in pairs:
                sides[prefix + "difference"] = sides[b]["mean"] - sides[a]["mean"]
                sides[prefix + "p_value"] = mean_pair_bootstrap(
                    scorer, metric, [st[metric] for st in stats[a]],
                    [st[metric] for st in stats[b]], samples)
            entry[metric] = sides
        if seconds and name in seconds and sizes:
            per = {side: float(np.mean(seconds[name][side])) / sizes[name]
                   for side in names if seconds[name].get(side)}
            if "base" in per and "nlm" in per and per["base"] > 0:
                entry["seconds_per_sentence"] = dict(per, ratio=per["nlm"] / per["base"])
                for side in ("alone", "joint"):
                    if side in per:
                        entry["seconds_per_sentence"][side + "_ratio"] = per[side] / per["base"]
        res[name] = entry
    return res


def _extra_sides(entries) -> List[str]:
    """The sides besides KenLM only and KenLM + NLM that any of ``entries`` (score entries of
    :func:`collect`) has, in :data:`SIDES` order."""
    entries = list(entries)
    return [side for side in ("alone", "joint") if any(side in e for e in entries)]


def _comparisons(side: str) -> List[str]:
    """Key prefixes of :data:`PAIRS` that compare ``side`` with another side."""
    return [prefix for prefix, b, _ in PAIRS if b == side]


def format_table(title: str, res: dict) -> str:
    extra = _extra_sides(entry["bleu"] for entry in res.values())
    head = (f"{'set':<8} {'metric':<11} {'KenLM only':>25} {'KenLM + NLM':>25} {'diff':>7} "
            f"{'p':>6}")
    for side in extra:
        head += f" {SIDE_LABELS[side]:>25} {'diff':>7} {'p':>6}"
        if side == "joint":
            head += f" {'-NLM':>7} {'p':>6}"
    if extra:
        head += "   (" + "; ".join(
            f"{side}: diff/p vs KenLM only" + (", then vs KenLM + NLM" if side == "joint" else "")
            for side in extra) + ")"
    lines = [title, head]
    cell = lambda s: f"{s['mean']:.2f} ± {s['sd']:.2f} ({s['min']:.2f}-{s['max']:.2f})"  # noqa: E731
    for name, entry in res.items():
        for metric in ("bleu", "detok_bleu", "chrf"):
            e = entry[metric]
            line = (f"{name:<8} {metric:<11} {cell(e['base']):>25} {cell(e['nlm']):>25} "
                    f"{e['difference']:+7.2f} {e['p_value']:6.3f}")
            for side in extra:
                if side not in e:
                    line += f" {'':>25}" + f" {'':>7} {'':>6}" * len(_comparisons(side))
                    continue
                line += f" {cell(e[side]):>25}"
                for prefix in _comparisons(side):
                    line += f" {e[prefix + 'difference']:+7.2f} {e[prefix + 'p_value']:6.3f}"
            lines.append(line)
        if "seconds_per_sentence" in entry:
            s = entry["seconds_per_sentence"]
            line = (f"{name:<8} {'s/sentence':<11} {s['base']:>25.4f} {s['nlm']:>25.4f} "
                    f"{'x' + format(s['ratio'], '.2f'):>7}")
            for side in extra:
                if side in s:
                    line += f" {'':6} {s[side]:>25.4f} {'x' + format(s[side + '_ratio'], '.2f'):>7}"
            lines.append(line)
    return "\n".join(lines)


def _parts(doc: dict) -> List[Tuple[str, str]]:
    """(key, label) of the parts a report (``bench-mt.json``) measured: Moses decoding
    ('decoding'), k-best rescoring, cdec decoding ('cdec decoding')."""
    out = [("decoding", "decoding")] if "decoding" in doc else []
    if "second_pass" in doc:
        out.append(("second_pass", f"decoding + {doc['second_pass']['kbest']}-best rescoring"))
    if "rescoring" in doc:
        out.append(("rescoring", f"{doc['rescoring'].get('kbest', '')}-best rescoring"))
    if isinstance(doc.get("cdec"), dict):          # a string when cdec did not run
        out.append(("cdec", "cdec decoding"))
    return out


def format_markdown(doc: dict) -> str:
    """The scores of every part of a report (``bench-mt.json``) as one markdown table: mean ±
    sd over the tunings per side, the difference of the means and its p-value (the NLM-only
    and joint sides against KenLM only, the joint side also against KenLM + NLM)."""
    parts = [(label, doc[key]["scores"]) for key, label in _parts(doc)]
    extra = _extra_sides(e["bleu"] for _, res in parts for e in res.values())
    head = "| part | set | metric | KenLM only | KenLM + NLM | diff (p) |"
    for side in extra:
        head += f" {SIDE_LABELS[side]} | diff (p) |" + (" vs KenLM + NLM (p) |" if side == "joint" else "")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    cell = lambda s: f"{s['mean']:.2f} ± {s['sd']:.2f}"  # noqa: E731
    for label, res in parts:
        for name, entry in res.items():
            for metric in ("bleu", "detok_bleu", "chrf"):
                e = entry[metric]
                row = (f"| {label} | {name} | {metric} | {cell(e['base'])} | {cell(e['nlm'])} | "
                       f"{e['difference']:+.2f} ({e['p_value']:.3f}) |")
                for side in extra:
                    if side not in e:
                        row += " |" * (1 + len(_comparisons(side)))
                        continue
                    row += f" {cell(e[side])} |" + "".join(
                        f" {e[prefix + 'difference']:+.2f} ({e[prefix + 'p_value']:.3f}) |"
                        for prefix in _comparisons(side))
                rows.append(row)
    return "\n".join(rows)


def plot(path: str, doc: dict) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'nlmfeature[plot]'): no plot"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    labels: List[str] = []
    bars: Dict[str, List[float]] = {side: [] for side in SIDES}
    errs: Dict[str, List[float]] = {side: [] for side in SIDES}
    for key, part in _parts(doc):
        for name, entry in doc[key]["scores"].items():
            labels.append(f"{part}\n{name}")
            for side in SIDES:     # a side a part did not measure: a zero-height bar
                bars[side].append(entry["bleu"].get(side, {}).get("mean", 0.0))
                errs[side].append(entry["bleu"].get(side, {}).get("sd", 0.0))
    shown = [side for side in SIDES if any(bars[side])]
    x = np.arange(len(labels))
    width = 0.8 / max(1, len(shown))
    for i, side in enumerate(shown):
        ax.bar(x + (i - (len(shown) - 1) / 2) * width, bars[side], width, yerr=errs[side],
               label=SIDE_LABELS[side], capsize=3)
    ax.set_xticks(x)
    ax.set_xticklabels(labels)
    values = [v for side in shown for v in bars[side] if v]
    lo = min(values) if values else 0
    ax.set_ylim(max(0, lo - 5), max(values) + 2 if values else 1)
    ax.set_ylabel("BLEU (tokenised, mean ± sd over tunings)")
    ax.legend()
    ax.set_title("test and dev BLEU", fontsize=10)
    fig.suptitle(doc["label"], fontsize=9)
    ax = axes[1]
    for key, prefix in (("decoding", ""), ("cdec", "cdec ")):
        if not isinstance(doc.get(key), dict):
            continue
        for side, style in zip(SIDES, ("-", "--", "-.", ":")):
            for run in doc[key].get("tunings", {}).get(side, []):
                its = [i["iteration"] for i in run["iterations"]]
                ax.plot(its, [i["dev_bleu"] for i in run["iterations"]], style, marker="o",
                        label=f"{prefix}{SIDE_LABELS[side]} seed {run['seed']}")
    ax.set_xlabel("tuning iteration")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("decoder dev BLEU")
    ax.set_title("dev BLEU of every tuning iteration")
    if ax.get_lines():
        ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path + ".tmp.png", dpi=100)
    plt.close(fig)
    os.replace(path + ".tmp.png", path)
    return None


# -- main ---------------------------------------------------------------------------------------
def _bench(args: argparse.Namespace) -> int:
    t_start = time.time()
    args.system = os.path.abspath(args.system)
    args.data = os.path.abspath(args.data)
    if not os.path.isdir(args.system):
        raise InputError(args.system, 0, "no such Moses system folder (--system)")
    with_moses = args.decoder in ("moses", "moses2", "both")
    with_cdec = args.decoder in ("cdec", "both")
    from nlmfeature import load

    # inverse joint models (train --target-to-source) score the source given the whole
    # translation: rescoring features only (the rescoring part, the second pass)
    joints = [os.path.abspath(j) for j in args.joint]
    inverse = [j for j in joints if load(j).target_to_source]
    direct = [j for j in joints if j not in inverse]      # the decoders' joint models
    if args.second_pass and (not with_moses or args.no_decoding
                             or not (args.rescore_model or inverse)):
        raise NLMFeatureError("--second-pass rescores the Moses decoding part's k-best lists "
                              "with the --rescore-model NLMs (and inverse --joint models): it "
                              "needs --decoder moses or both, the decoding part (no "
                              "--no-decoding) and --rescore-model or an inverse --joint model")
    if inverse and not args.no_decoding and not args.second_pass:
        raise InputError(inverse[0], 0, "an inverse joint model (train --target-to-source) "
                         "scores the source given the whole translation: decoders refuse it; "
                         "give --second-pass (it rescores the decoder's k-best lists) or "
                         "--no-decoding (the rescoring part only)")
    if with_moses:
        # the decoding part's joint side needs NLMJointFeature in Moses: fail now, not after
        # the other sides' tunings
        if args.decoder == "moses2" and not args.moses:
            from nlmfeature.mt.moses import find_program

            args.moses = find_program("moses2")
            if not args.moses:
                raise NLMFeatureError("--decoder moses2: no moses2 under $MOSES_ROOT; give --moses "
                                      "PATH/moses2 (built with moses_ff/moses2, moses_ff/README.md)")
        args.moses = find_moses(args.moses, features=("NLMFeature",) + (
            ("NLMJointFeature",) if direct and not args.no_decoding else ()))
        args.moses_root = os.environ.get("MOSES_ROOT") or os.path.dirname(os.path.dirname(args.moses))
    else:
        args.moses_root = os.environ.get("MOSES_ROOT") or ""
        if args.joint:
            raise NLMFeatureError("--joint is compared in the Moses part only: give --decoder "
                                  "moses or both")
    if with_cdec and not args.no_decoding:
        from nlmfeature.mt import cdec

        # missing programs fail now, not after training and the Moses part
        cdec.find_cdec(args.cdec, args.cdec_root)
        cdec.find_extractor(args.cdec_root)
        cdec.find_shim(args.cdec_ff)
    if args.tunings < 1:
        raise NLMFeatureError("--tunings must be at least 1")
    if args.nlm_alone and (not with_moses or args.no_decoding):
        raise NLMFeatureError("--nlm-alone adds a system to the Moses decoding part: it needs "
                              "--decoder moses, moses2 or both and the decoding part (no --no-decoding)")
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    decoders = {"moses": "Moses", "moses2": "Moses2", "cdec": "cdec", "both": "Moses + cdec"}[args.decoder]
    label = (f"{decoders} {os.path.basename(args.system)}"
             + (f" ({args.search} search)" if args.search != "normal" and with_moses else "")
             + f", {args.algorithm} x{args.tunings} "
             f"(<= {args.max_iterations} iterations), "
             + (f"QUICK: tuned on the first {args.quick_sentences} {args.dev} sentences"
                if args.quick else f"tuned on all of {args.dev}")
             + (f"; tests cut to {args.test_sentences} sentences" if args.test_sentences else ""))
    _log(label)
    sets = prepare_sets(args, work)
    if with_moses:
        base_ini, base_weights = build_system(args, work, sets)
        key = os.path.basename(base_ini).split(".")[1]       # the inputs' key (build_system)
    else:
        from nlmfeature.mt.moses import inputs_key

        key = inputs_key([s["src"] for s in sets.values()])  # the same key as build_system's
    models = [os.path.abspath(m) for m in args.model] or [train_model(args, work, sets[args.dev]["ref"])]
    mkey = _key(models)                                  # the NLMs' key
    joint = joints[0] if len(joints) == 1 else (joints or None)
    rescore_models = models + [os.path.abspath(m) for m in args.rescore_model]
    for m in models:
        if load(m).reverse and not args.no_decoding:
            raise InputError(m, 0, "a right-to-left model (train --reverse): the decoders decode "
                             "left to right; give it with --rescore-model (rescoring only)")
    for m in rescore_models:
        if load(m).header.get("source"):
            raise InputError(m, 0, "a joint model: give it with --joint (its features need the "
                             "source sentence and the word alignment)")
    sides = []
    if with_moses:
        nlm_ini_path = os.path.join(work, f"nlm{mkey}.{key}.moses.ini")
        nlm_weights = nlm_ini(base_ini, nlm_ini_path, models, base_weights)
        sides = [("base", base_ini, "base", ()),
                 ("nlm", nlm_ini_path, "nlm" + mkey, ("NLMFeature",))]
        if args.nlm_alone:
            alone_ini_path = os.path.join(work, f"alone{mkey}.{key}.moses.ini")
            drop_features(nlm_ini_path, alone_ini_path, ("KENLM",))
            sides.append(("alone", alone_ini_path, "alone" + mkey, ("NLMFeature",)))
        if direct:
            jkey = _key(models + direct)
            joint_ini_path = os.path.join(work, f"joint{jkey}.{key}.moses.ini")
            joint_ini(nlm_ini_path, joint_ini_path, direct, nlm_weights)
            sides.append(("joint", joint_ini_path, "joint" + jkey,
                          ("NLMFeature", "NLMJointFeature")))
    scorers = {name: Scorer(s["ref"], s["raw_ref"], args.tgt_lang) for name, s in sets.items()}
    doc: dict = dict(label=label, quick=bool(args.quick), system=args.system, moses=args.moses,
                     decoder=args.decoder, models=models, joint=joint, algorithm=args.algorithm,
                     tunings=args.tunings, threads=args.threads,
                     sentences={n: s["n"] for n, s in sets.items()},
                     final_weights=args.final_weights)
    if with_moses and not args.no_decoding:
        doc["decoding"] = decoding(args, MosesDecoding(args), sides, sets, scorers,
                                   os.path.join(work, f"tuning.{key}"))
    if args.second_pass:
        extra = [os.path.abspath(m) for m in args.rescore_model]
        base_runs = [t["outputs"][args.final_weights] for t in doc["decoding"]["tunings"]["base"]]
        sp = second_pass(args, os.path.join(work, f"tuning.{key}"), sets,
                         {side: tag for side, _, tag, _ in sides if side != "base"},
                         len(models), len(direct), extra, inverse, base_runs)
        doc["second_pass"] = dict(kbest=args.kbest, models=extra, joint=inverse,
                                  features=sp["features"],
                                  restarts=args.rescore_restarts,
                                  scores=collect(scorers, sp["systems"], args.bootstrap))
    if with_moses and not args.no_rescoring:
        weights_src = os.path.join(work, f"tuning.{key}", f"base.{args.algorithm}1",
                                   f"weights.{args.final_weights}.txt")
        from nlmfeature.mt.weights import read_weights

        w = read_weights(weights_src) if os.path.exists(weights_src) else base_weights
        rkey = _key(rescore_models)
        resc = rescoring(args, os.path.join(work, f"rescoring.{key}"), sets, base_ini, w,
                         rescore_models, scorers, rkey, joints)
        doc["rescoring"] = dict(kbest=args.kbest, weights_from=weights_src if os.path.exists(weights_src)
                                else f"moses.{args.init}.ini", models=rescore_models,
                                joint=joints, features=resc["features"],
                                restarts=args.rescore_restarts,
                                scores=collect(scorers, resc["systems"], args.bootstrap))
    if with_cdec and not args.no_decoding:
        doc["cdec"] = cdec_part(args, work, sets, models, mkey, key, scorers)
    else:
        doc["cdec"] = ("not run: --no-decoding" if with_cdec else
                       "not run: --decoder moses (--decoder cdec or both runs it)")
    doc["seconds"] = time.time() - t_start
    json_path = os.path.join(work, "bench-mt.json")
    atomic_write_text(json_path, dumps_json(doc, indent=1, sort_keys=True) + "\n")
    note = (plot(args.plot or os.path.join(work, "bench-mt.png"), doc)
            if _parts(doc) else "nothing measured: no plot")
    if args.json:
        print(dumps_json(doc, indent=1, sort_keys=True))
        return 0
    if args.markdown:
        print(format_markdown(doc))
        return 0
    print(f"nlmfeature bench mt — {label}")
    print(f"models: {', '.join(models)}"
          + (f"; joint model(s): {', '.join(joints)}" if joints else "")
          + (f"; rescoring only: {', '.join(args.rescore_model)}" if args.rescore_model else "")
          + f"; final weights: {args.final_weights}; "
          f"threads {args.threads}; {doc['seconds'] / 60:.1f} min")
    print("BLEU/chrF: tokenised lowercased (sacrebleu -tok none); detok_bleu: sacremoses-"
          "detokenised vs raw references (13a, case-insensitive); mean ± sd (min-max) over "
          "tunings; p: paired bootstrap of the difference of the means")
    if "decoding" in doc:
        print()
        print_decoding("== Moses decoding", doc["decoding"], sets, args.dev)
    if "second_pass" in doc:
        feats = doc["second_pass"]["features"]
        said = lambda side: " ".join(feats[side]) or "nothing"  # noqa: E731
        joint_lists = "its own decoding" if direct else "the KenLM + NLM decoding"
        print()
        print(format_table(f"== decoding + rescoring: each decoding tuning's {args.kbest}-best "
                           f"lists, features appended, retuned; KenLM + NLM: {said('nlm')}"
                           + (f"; KenLM + NLM + joint ({joint_lists}): {said('joint')}"
                              if "joint" in feats else "")
                           + "; against KenLM-only decoding", doc["second_pass"]["scores"]))
    if "rescoring" in doc:
        print()
        feats = doc["rescoring"]["features"]
        print(format_table(f"== rescoring the KenLM-only system's {args.kbest}-best lists "
                           f"(features added: KenLM + NLM {' '.join(feats['nlm'])}"
                           + (f"; KenLM + NLM + joint {' '.join(feats['joint'])}"
                              if "joint" in feats else "") + ")",
                           doc["rescoring"]["scores"]))
    elif not with_moses:
        print("\nrescoring: not run (it reranks Moses' k-best lists: --decoder moses or both)")
    if isinstance(doc["cdec"], dict):
        print()
        print_decoding("== cdec decoding (hiero grammars from the system's training pairs, "
                       "1 thread)", doc["cdec"], sets, args.dev)
    else:
        print(f"\ncdec: {doc['cdec']}")
    print(f"JSON: {json_path}" + (f"; {note}" if note else
                                  f"; plot: {args.plot or os.path.join(work, 'bench-mt.png')}"))
    return 0


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    """Run ``nlmfeature bench mt`` on parsed arguments."""
    import signal

    if threading_main():
        # `kill` stops like Ctrl-C: the running decoder is killed, finished steps stay
        signal.signal(signal.SIGTERM, _interrupted)
    if not args.test:
        args.test = ["test"]
    if args.max_iterations is None:
        args.max_iterations = 6 if args.quick else 10
    return _bench(args)
