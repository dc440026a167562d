#!/usr/bin/env python3
"""Decoder benchmark: Moses (and cdec) with KenLM alone vs KenLM + nlmfeature NLMs.

Measures, on a real system (default: the Multi30k de->en phrase-based Moses system in
``../shared/data/moses/multi30k-de-en`` beside the repository; ``--shared`` or
$NLMFEATURE_SHARED point elsewhere; 100 test2016 sentences):

* the system made fast to load first: its phrase and reordering
  tables are filtered to the input (the lines Moses' ``filter-model-given-input.pl`` keeps,
  by ``nlmfeature.mt.moses``, no Moses scripts needed) and the ARPA LM is binarised with
  KenLM's ``build_binary`` (kept in ``--workdir`` and reused);
* decoding time with KenLM alone, KenLM + each NLM (``--model NAME=PATH``) and KenLM + a
  joint model (``--joint NAME=PATH``, with an NLM too as ``--joint NAME=PATH:MODEL``), with 1 and
  more threads: the sum of Moses' per-sentence "Translation took" times (the wall-clock
  figure) and the process wall time minus model loading (decoding an empty input).  Every
  configuration runs ``--repeats`` times, interleaved, and the minimum is kept (the machine
  may be shared); "paired" is the median over repeats of the ratio of runs made back to
  back, steadier when the machine's speed drifts;
* whether the translations are identical across thread counts (they must be) and BLEU
  (sacrebleu on the tokenised text, ``--tokenize none``);
* where the time goes: the NLM's counters from a counting run (``stats=true`` with the
  caches on: lookups per sentence, exact n-gram repeats, distinct contexts, normaliser cache
  hit rates) and, with ``--profile``, a ``perf`` profile of each 1-thread decode split into
  KenLM, the decoder's search, the NLM shim, the C API, the session, and the scorer's parts
  (hidden layer, output layer, normalisers, direct features, cache hashing, as far as the
  compiler left them as separate functions);
* optionally (``--tune-sentences N``) a second tuning iteration with and without the
  persistent cache.

``--decoder moses2`` (alone or beside ``moses``) decodes the same prepared system with Moses2
(``--moses2`` or MOSES_ROOT's, built with moses_ff/moses2): KenLM alone and KenLM + each NLM,
each with Moses2's normal search, its batch search (``search-algorithm 4``, the NLM scoring a
stack's hypotheses in one ``nlm_score_spans`` call) and cube pruning (``search-algorithm 1``,
the search Moses2's authors optimised), on each thread count: CPU time minus
loading, ratios to KenLM alone, the batch search's gain, thread scaling, and with ``moses`` too
the CPU time against Moses' with the same model.

``--decoder cdec`` does the same in cdec (1 thread) with hiero grammars extracted per
sentence by cdec's suffix-array extractor (``run_extractor``) from the system's training
pairs and word alignment (kept in the workdir), untuned hand-set weights.

Needs MOSES_ROOT (a mosesdecoder tree with moses_ff built in, moses_ff/README.md; or --moses) and, for
cdec, CDEC_ROOT (a built cdec tree) and cdec_ff/libcdec_ff_nlm.so.  Never builds a decoder.
Example (docs/results.md's decode-time figures were made this way)::

    MOSES_ROOT=/path/mosesdecoder CDEC_ROOT=/path/cdec python3 benchmarks/bench_decoder.py \\
        --model unnormalised=lbl.nlm --model class=class.nlm --decoder moses,cdec \\
        --threads 1,2 --profile --workdir /tmp/bd --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

from nlmfeature.commands import base
from nlmfeature.errors import DecoderError
from nlmfeature.io import textio
from nlmfeature.io.atomicfile import atomic_write_text
from nlmfeature.mt import cdec as cd
from nlmfeature.mt import moses as mo
from nlmfeature.mt.weights import Weights, read_weights

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM_REL = os.path.join("data", "moses", "multi30k-de-en")
NBEST_REL = os.path.join("data", "nbest", "moses-multi30k-de-en")


def shared_dir(arg: Optional[str]) -> str:
    """The shared data folder: --shared, else $NLMFEATURE_SHARED, else ../shared beside the repo."""
    d = arg or os.environ.get("NLMFEATURE_SHARED") or os.path.join(REPO, "..", "shared")
    return os.path.abspath(d)


def read_lines(path: str, n: Optional[int] = None, skip: int = 0) -> List[str]:
    """Lines ``skip .. skip+n`` of a text file (the package's reader)."""
    lines = textio.read_lines(path)[skip:]
    return lines[:n] if n else lines


def write_lines(path: str, lines: List[str]) -> str:
    """Write ``lines`` to ``path`` (atomically); returns ``path``."""
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def prepare_moses_system(system: str, ini: Optional[str], inputs: List[str], work: str,
                         kenlm_bin: Optional[str], do_filter: bool = True) -> Tuple[str, Weights, Dict]:
    """(config, its weights, info) of the system: tables filtered to ``inputs``, LM binarised
    (``nlmfeature.mt.moses.prepare_system`` on ``content_named_input``: a workdir reused with
    other inputs filters again)."""
    path = mo.system_ini(system, ini)
    cat = mo.content_named_input(work, inputs, path)
    prepared = mo.prepare_system(path, work, [cat], system, do_filter, [kenlm_bin])
    info: Dict = {"system": system, "ini": prepared.ini, "lm": prepared.lm}
    if do_filter:
        info["filtered"] = prepared.tables
    if prepared.filter_seconds:
        info["filter_seconds"] = prepared.filter_seconds
    return prepared.ini, read_weights(prepared.ini), info


def write_ini(path: str, base: str, weights: Weights, nlm: Optional[str] = None,
              nlm_weight: float = 0.1, extra: str = "", feature: str = "NLMFeature",
              joint: Optional[str] = None, joint_weight: float = 0.1, joint_extra: str = "") -> str:
    """A moses.ini: the config ``base`` with ``weights``, a joint model's ``NLMJointFeature``
    line (label NNJM0, keys ``joint_extra``) and the NLM's feature line (label NLM0) at the
    end of [feature]."""
    lines = []
    if joint:
        lines.append(f"NLMJointFeature name=NNJM0 path={os.path.abspath(joint)} {joint_extra}".rstrip())
    if nlm and feature == "NeuralLM":
        order = 5
        with open(nlm, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("ngram_size"):
                    order = int(line.split()[1])
                    break
        lines.append(f"NeuralLM name=NLM0 path={os.path.abspath(nlm)} factor=0 order={order} {extra}".rstrip())
    elif nlm:
        lines.append(f"NLMFeature name=NLM0 path={os.path.abspath(nlm)} factor=0 {extra}".rstrip())
    w = {k: v for k, v in weights.items() if k not in ("NLM0", "NNJM0")}
    if nlm:
        w["NLM0"] = [nlm_weight]
    if joint:
        w["NNJM0"] = [joint_weight]
    return mo.add_features(base, path, lines, w)


def parse_stats(stderr: str, feature: str = "NLMFeature") -> Dict[str, int]:
    """Sum of the NLM's per-sentence counters (lines 'NLMFeature ... key=value ...'; a joint
    model's: ``feature`` 'NLMJointFeature')."""
    stats: Dict[str, int] = {}
    sentences = 0
    for line in stderr.splitlines():
        if line.startswith(feature + " ") and "lookups=" in line:
            sentences += 1
            for kv in line.split():
                if "=" in kv:
                    k, v = kv.split("=", 1)
                    if v.lstrip("-").isdigit():
                        stats[k] = stats.get(k, 0) + int(v)
    if sentences:
        stats["sentences"] = sentences
    return stats


def timed(cmd: List[str], stdin: Optional[str] = None, env: Optional[Dict[str, str]] = None) -> Dict:
    """A timed decoder run (``nlmfeature.mt.moses.run``): wall, CPU and per-sentence
    'Translation took' seconds, output lines and the NLM's counters."""
    r = mo.run(cmd, stdin, env)
    return {"wall": r.wall, "cpu": r.cpu, "stdout": r.stdout, "stderr": r.stderr, "max_rss": r.max_rss,
            "translation": r.translation, "output": r.output, "stats": parse_stats(r.stderr)}


def run_moses(moses: str, ini: str, src: str, threads: int = 1, nbest: Optional[str] = None,
              nbest_size: int = 100, weights_file: Optional[str] = None,
              env: Optional[Dict[str, str]] = None) -> Dict:
    extra = ["-weight-overwrite", open(weights_file).read().strip()] if weights_file else []
    return timed(mo.command(moses, ini, src, threads, nbest, nbest_size, distinct=True, extra=extra),
                 env=env)


def bleu(hyps: List[str], refs: List[str]) -> float:
    import sacrebleu
    return sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score


def rates(st: Dict[str, int]) -> Dict[str, float]:
    n = st.get("lookups", 0)
    sents = max(1, st.get("sentences", 1))
    out: Dict[str, float] = {"lookups": n, "lookups_per_sentence": n / sents}
    for name, hits, misses in [("context", "context_hits", "context_misses"),
                               ("class", "class_hits", "class_misses")]:
        h, m = st.get(hits, 0), st.get(misses, 0)
        out[f"{name}_hit_rate"] = h / (h + m) if h + m else 0.0
    for k in ("ngram_hits", "persistent_hits"):
        out[k.replace("_hits", "_hit_rate")] = st.get(k, 0) / n if n else 0.0
    if n and "ngram_hits" in st:
        out["distinct_ngrams_per_sentence"] = (n - st["ngram_hits"]) / sents
    if st.get("context_misses"):
        out["distinct_contexts_per_sentence"] = st["context_misses"] / sents
    return out


# ---------------------------------------------------------------------------------------
# where the time goes: perf profiles split into parts
# ---------------------------------------------------------------------------------------

PARTS = [
    # (part, dso pattern, symbol pattern)
    ("nlm shim", None, r"NLMFeature|NLMJointFeature|NLMFeatureFF|StateView|create_ff|TraversalFeaturesImpl.*anon"),
    ("nlm C API", r"^libnlmfeature", None),
    ("nlm C API", r"^_capi", None),
    ("nlm session / n-gram memo", r"^_pcache", None),
    ("nlm hidden layer", r"^_scorer", r"compute_hidden|branch_forward|layer_forward|hidden_"),
    ("nlm normalisers", r"^_scorer", r"lognorm|gemv|logsumexp|expf|tree_logprob"),
    ("nlm direct features", r"^_scorer", r"direct_|splitmix"),
    ("nlm cache hashing", r"^_scorer", r"table_|nt_|ngram_hash|key_hash|memo"),
    ("nlm output layer", r"^_scorer", r"word_logit|class_logit|dotf|output"),
    ("nlm scorer (inlined forward pass)", r"^_scorer", None),
    ("kenlm", None, r"\blm::|LanguageModelKen|KLanguageModel|lm_ff|kenlm"),
    ("malloc/free", r"^libc", r"malloc|free|cfree|_int_|tcache"),
    ("python", r"python|\.cpython-", None),
]


def part_of(dso: str, sym: str) -> str:
    for part, dpat, spat in PARTS:
        if dpat and not re.search(dpat, dso):
            continue
        if spat and not re.search(spat, sym):
            continue
        return part
    if re.search(r"\[kernel|vmlinux", dso):
        return "kernel"
    return "decoder search & other features"


def perf_profile(cmd: List[str], data: str, env: Optional[Dict[str, str]] = None) -> Optional[Dict]:
    """Run ``cmd`` under ``perf record`` and split its samples into parts (None without perf)."""
    perf = shutil.which("perf")
    if not perf:
        return None
    timed([perf, "record", "-q", "-F", "1999", "-o", data, "--"] + cmd, env=env)
    p = subprocess.run([perf, "report", "-i", data, "--stdio", "--no-children", "--sort", "dso,sym", "-q"],
                       capture_output=True, text=True)
    parts: Dict[str, float] = {}
    top: List[Tuple[float, str, str]] = []
    for line in p.stdout.splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+\[[^\]]*\]\s+(.*)$", line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(2), m.group(3).strip()
        part = part_of(dso, sym)
        parts[part] = parts.get(part, 0.0) + pct
        top.append((pct, dso, sym))
    top.sort(reverse=True)
    return {"parts_percent": dict(sorted(parts.items(), key=lambda kv: -kv[1])),
            "top_symbols": [{"percent": a, "dso": b, "symbol": c[:160]} for a, b, c in top[:25]]}


# ---------------------------------------------------------------------------------------
# cdec: a hiero grammar per sentence from cdec's suffix-array extractor (nlmfeature.mt.cdec)
# ---------------------------------------------------------------------------------------

def prepare_cdec_system(system: str, src: str, work: str) -> Dict:
    """Per-sentence hiero grammars for ``src`` (``run_extractor`` on the system's training
    pairs and alignment) and the hand-set weights file, kept in ``work/cdec``."""
    cdir = os.path.join(work, "cdec")
    bitext, align = cd.training_pairs(system, cdir)
    g = cd.extract_grammars(src, cdir, bitext, align)
    info: Dict = {"sgm": g.sgm, "weights": cd.write_cdec_weights(os.path.join(cdir, "weights.base"),
                                                                  cd.BASE_WEIGHTS)}
    if g.seconds:
        info["extract_seconds"] = g.seconds
    return info


def cdec_config(path: str, lm: str, nlm: Optional[str] = None, extra: str = "",
                ff: Optional[str] = None, joint: Optional[str] = None) -> str:
    """A cdec.ini: KenLM on ``lm`` and, with ``nlm``, the NLM's External feature line (NLM);
    with ``joint``, a joint model's (NNJM, the joint shim beside ``ff``)."""
    lines = [cd.nlm_feature_line(joint, "NNJM", ff, joint=True)] if joint else []
    if nlm:
        lines.append(cd.nlm_feature_line(nlm, "NLM", ff, extra))
    return cd.write_ini(path, lm, lines)


def run_cdec(cdec: str, ini: str, weights: str, sgm: str) -> Dict:
    r = cd.run(cd.command(cdec, ini, weights, sgm))
    return {"wall": r.wall, "cpu": r.cpu, "stdout": r.stdout, "stderr": r.stderr, "max_rss": r.max_rss,
            "translation": r.translation, "output": r.output, "stats": parse_stats(r.stderr)}


class Runs:
    """Timings of interleaved repeats: wall, CPU and (Moses) 'Translation took' seconds per key,
    loading cost (an empty input) per configuration, peak resident memory (bytes) per key and
    of loading, the last output per key and the keys whose output changed between repeats."""

    def __init__(self) -> None:
        self.walls: Dict = {}
        self.cpus: Dict = {}
        self.trans: Dict = {}
        self.load: Dict[str, float] = {}
        self.load_cpu: Dict[str, float] = {}
        self.outputs: Dict = {}
        self.changed: set = set()
        self.rss: Dict = {}
        self.load_rss: Dict[str, int] = {}

    def add_load(self, name: str, r: Dict) -> None:
        self.load[name] = min(self.load.get(name, 1e9), r["wall"])
        self.load_cpu[name] = min(self.load_cpu.get(name, 1e9), r["cpu"])
        self.load_rss[name] = max(self.load_rss.get(name, 0), r.get("max_rss", 0))

    def add(self, key, r: Dict) -> None:
        self.rss[key] = max(self.rss.get(key, 0), r.get("max_rss", 0))
        self.walls.setdefault(key, []).append(r["wall"])
        self.cpus.setdefault(key, []).append(r["cpu"])
        self.trans.setdefault(key, []).append(r.get("translation", 0.0))
        if key in self.outputs and self.outputs[key] != r["output"]:
            self.changed.add(key)
        self.outputs[key] = r["output"]


def figures(runs: List[float], load: float, base_runs: List[float], base_load: float, n: int) -> Tuple[float, float, float]:
    """(ms per sentence of the best run minus loading, its ratio to the baseline's best, the median
    over repeats of the ratios of runs made back to back)."""
    per = (min(runs) - load) / n * 1000
    base = (min(base_runs) - base_load) / n * 1000
    return per, per / base, median([(a - load) / (b - base_load) for a, b in zip(runs, base_runs)])


def median(xs: List[float]) -> float:
    xs = sorted(xs)
    k = len(xs) // 2
    return xs[k] if len(xs) % 2 else (xs[k - 1] + xs[k]) / 2


def bench_cdec(args, models: Dict[str, str], extras: Dict[str, str], shared: str, work: str,
               test_src: str, refs: List[str], lm: str,
               joints: Optional[Dict[str, Tuple[str, Optional[str]]]] = None) -> Dict:
    cdec = cd.find_cdec()
    ff = cd.find_shim(args.cdec_ff)
    info = prepare_cdec_system(args.system or os.path.join(shared, SYSTEM_REL), test_src, work)
    info["lm"] = lm
    empty_sgm = write_lines(os.path.join(work, "cdec", "empty.sgm"), [])
    cfg: Dict[str, Tuple[str, str]] = {}
    cfg["kenlm"] = (cdec_config(os.path.join(work, "cdec", "kenlm.ini"), lm),
                    cd.write_cdec_weights(os.path.join(work, "cdec", "kenlm.w"), cd.BASE_WEIGHTS))
    for name, path in models.items():
        cfg[name] = (cdec_config(os.path.join(work, "cdec", f"{name}.ini"), lm, path,
                                 extras.get(name, ""), ff),
                     cd.write_cdec_weights(os.path.join(work, "cdec", f"{name}.w"),
                                           dict(cd.BASE_WEIGHTS, NLM=[args.nlm_weight])))
    for name, (path, with_nlm) in (joints or {}).items():
        w = dict(cd.BASE_WEIGHTS, NNJM=[args.nlm_weight])
        if with_nlm:
            w["NLM"] = [args.nlm_weight]
        cfg[name] = (cdec_config(os.path.join(work, "cdec", f"{name}.ini"), lm,
                                 models[with_nlm] if with_nlm else None,
                                 extras.get(with_nlm, "") if with_nlm else "", ff, joint=path),
                     cd.write_cdec_weights(os.path.join(work, "cdec", f"{name}.w"), w))
    n = len(refs)
    res: Dict = {"cdec": cdec, "sentences": n, "grammar": info, "configs": {}}
    runs = Runs()
    for rep in range(args.repeats):
        for name, (ini, w) in cfg.items():
            runs.add_load(name, run_cdec(cdec, ini, w, empty_sgm))
            runs.add(name, run_cdec(cdec, ini, w, info["sgm"]))
        print(f"  cdec repeat {rep + 1}/{args.repeats} done", flush=True)
    walls, cpus, load, load_cpu, outputs = runs.walls, runs.cpus, runs.load, runs.load_cpu, runs.outputs
    print(f"\ncdec ({n} sentences, 1 thread; wall and CPU time minus loading (an empty input))\n"
          f"{'config':16s} {'ms/sent':>9s} {'ratio':>6s} {'paired':>6s} {'cpu ms/s':>9s} {'ratio':>6s} {'paired':>6s} "
          f"{'BLEU':>6s}")
    for name in cfg:
        per, ratio, paired = figures(walls[name], load[name], walls["kenlm"], load["kenlm"], n)
        cper, cratio, cpaired = figures(cpus[name], load_cpu[name], cpus["kenlm"], load_cpu["kenlm"], n)
        b = bleu(outputs[name], refs)
        res["configs"].setdefault(name, {}).update({
            "ms_per_sentence": per, "ratio_to_kenlm": ratio, "paired_ratio_median": paired,
            "cpu_ms_per_sentence": cper, "cpu_ratio_to_kenlm": cratio, "cpu_paired_ratio_median": cpaired,
            "load_seconds": load[name], "walls": walls[name], "cpus": cpus[name], "bleu": b,
            "nondeterministic": name in runs.changed})
        print(f"{name:16s} {per:9.1f} {ratio:6.2f} {paired:6.2f} {cper:9.1f} {cratio:6.2f} {cpaired:6.2f} {b:6.2f}")
    for name, path in models.items():
        ini = cdec_config(os.path.join(work, "cdec", f"{name}.stats.ini"), lm, path,
                          (extras.get(name, "") + " --stats").strip(), ff)
        st = run_cdec(cdec, ini, cfg[name][1], info["sgm"])["stats"]
        res["configs"][name]["counters"] = dict(st, **rates(st))
        r = rates(st)
        print(f"counters {name}: {r['lookups_per_sentence']:.0f} lookups/sentence, n-gram cache hit rate "
              f"{r['ngram_hit_rate']:.3f}, context hit rate {r['context_hit_rate']:.3f}, class normaliser hit "
              f"rate {r['class_hit_rate']:.3f}")
    if args.profile:
        for name, (ini, w) in cfg.items():
            prof = perf_profile([cdec, "-c", ini, "-w", w, "-i", info["sgm"]],
                                os.path.join(work, "cdec", f"{name}.perf.data"))
            if prof:
                res["configs"][name]["profile"] = prof
                print(f"profile cdec {name}: " + ", ".join(f"{k} {v:.1f}%" for k, v in prof["parts_percent"].items()))
    return res


#: Moses2's searches by name: its ``[search-algorithm]`` numbers (4: the batch search of
#: moses2.patch; 1: cube pruning, the search Moses2's authors made fastest and expect in use)
MOSES2_SEARCHES = {"normal": "0", "batch": "4", "cube": "1"}


def moses2_binary(args, nlm: bool) -> str:
    """The moses2 executable of ``--moses2`` (else MOSES_ROOT's), checked to register
    NLMFeature where the run decodes with a neural model (``nlm``)."""
    moses2 = args.moses2 or mo.find_program("moses2")
    if not moses2:
        sys.exit("no moses2: give --moses2 or MOSES_ROOT (a tree with moses2 built, moses_ff/README.md)")
    return mo.find_moses(moses2, features=("NLMFeature",) if nlm else ())


def bench_moses2(args, models: Dict[str, str], extras: Dict[str, str], base: str, weights: Weights, work: str,
                 src: str, refs: List[str], moses_res: Optional[Dict]) -> Dict:
    """Moses2 with KenLM alone and KenLM + each NLM, each with the searches of
    ``--moses2-search`` (:data:`MOSES2_SEARCHES`: the normal search, evaluating hypothesis by
    hypothesis; the batch search, a stack's new hypotheses evaluated at once, the NLM scoring
    them in one ``nlm_score_spans`` call; cube pruning), on each thread count: CPU and wall time
    minus loading, ratios to KenLM alone on the same search, BLEU, whether the thread counts
    (and the batch and normal searches) give the same translations, and (with the Moses part
    run too) the CPU time against Moses' with the same model."""
    moses2 = args.moses2   # (found and checked by run, before the Moses half: moses2_binary)
    d = os.path.join(work, "moses2")
    os.makedirs(d, exist_ok=True)
    configs: Dict[str, str] = {}
    given = dict(c.split("=", 1) for c in args.config)
    names = list(given) or ["kenlm"] + list(models)
    searches = [x.strip() for x in args.moses2_search.split(",") if x.strip()]
    bad = [x for x in searches if x not in MOSES2_SEARCHES]
    if bad or not searches:
        sys.exit(f"--moses2-search: unknown search {bad[0] if bad else '(none)'} "
                 f"(known: {', '.join(MOSES2_SEARCHES)})")
    for search in searches:
        algo = MOSES2_SEARCHES[search]
        for name in names:
            path = os.path.join(d, f"{name}.{search}.ini")
            # a ready-made configuration or the system with the model, its search set
            made = given[name] if given else write_ini(path, base, weights, models.get(name), args.nlm_weight,
                                                       extras.get(name, ""))
            configs[f"{name}/{search}"] = mo.set_search_algorithm(made, path, algo)
    threads = [int(t) for t in args.threads.split(",")]
    n = len(refs)
    empty = write_lines(os.path.join(d, "empty.src"), [])
    print(f"moses2: {moses2}\nthreads {threads}, {args.repeats} repeats", flush=True)
    runs = Runs()
    for rep in range(args.repeats):
        for key, ini in configs.items():
            runs.add_load(key, timed(mo.command(moses2, ini, empty)))
            for t in threads:
                runs.add((key, t), timed(mo.command(moses2, ini, src, t)))
        print(f"  moses2 repeat {rep + 1}/{args.repeats} done", flush=True)
    res: Dict = {"moses2": moses2, "sentences": n, "configs": {}}
    print(f"\nMoses2 ({n} sentences; 'cpu' = the process's CPU time minus that of loading (an empty input); "
          f"ratios to {names[0]} with the same search; paired = median over repeats of back-to-back ratios; "
          f"'vs moses' = CPU time over Moses' with the same model and threads; 'load s' = the wall "
          f"seconds of decoding an empty input; 'RSS MB' = the process's peak resident memory; 'same' = the "
          f"same translations on every thread count (batch: as the normal search's))\n"
          f"{'config':22s} {'thr':>3s} {'cpu ms/s':>9s} {'ratio':>6s} {'paired':>6s} {'wall ms/s':>9s} "
          f"{'BLEU':>6s} {'same':>5s} {'vs moses':>8s} {'load s':>6s} {'RSS MB':>7s}")
    for key in configs:
        name, search = key.split("/")
        base_key = f"{names[0]}/{search}"
        b = bleu(runs.outputs[(key, threads[0])], refs)
        # the batch search must translate as the normal one does; every search the same on
        # every thread count
        ref_key = f"{name}/normal" if search == "batch" and f"{name}/normal" in configs else key
        same = all(runs.outputs[(key, t)] == runs.outputs[(ref_key, threads[0])] for t in threads)
        c = res["configs"].setdefault(key, {"bleu": b, "load_seconds": runs.load[key], "threads": {},
                                            "load_max_rss_bytes": runs.load_rss[key],
                                            "same_translations": same, "same_as": f"{ref_key}, {threads[0]} thread(s)"})
        for t in threads:
            k, kb = (key, t), (base_key, t)
            cper, cratio, cpaired = figures(runs.cpus[k], runs.load_cpu[key], runs.cpus[kb], runs.load_cpu[base_key], n)
            wper, wratio, _ = figures(runs.walls[k], runs.load[key], runs.walls[kb], runs.load[base_key], n)
            vs = None
            if moses_res and name in moses_res["configs"] and t in moses_res["configs"][name].get("threads", {}):
                vs = cper / moses_res["configs"][name]["threads"][t]["cpu_ms_per_sentence"]
            c["threads"][t] = {"cpu_ms_per_sentence": cper, "cpu_ratio_to_kenlm": cratio,
                               "cpu_paired_ratio_median": cpaired, "wall_ms_per_sentence": wper,
                               "wall_ratio_to_kenlm": wratio, "cpu_seconds_all": runs.cpus[k],
                               "cpu_ratio_to_moses": vs, "max_rss_bytes": runs.rss[k]}
            print(f"{key:22s} {t:3d} {cper:9.1f} {cratio:6.2f} {cpaired:6.2f} {wper:9.1f} {b:6.2f} "
                  f"{str(same):>5s} {('%.2f' % vs) if vs else '-':>8s} {runs.load[key]:6.2f} "
                  f"{runs.rss[k] / 1e6:7.0f}", flush=True)
    if args.markdown:
        # the same figures as one markdown table (docs/results.md)
        print(f"\n| configuration | search | threads | CPU ms per sentence | x {names[0]} (paired) | "
              f"wall ms per sentence | BLEU |\n|---|---|---|---|---|---|---|")
        for key in configs:
            name, search = key.split("/")
            c = res["configs"][key]
            for t in threads:
                f = c["threads"][t]
                print(f"| {name} | {search} | {t} | {f['cpu_ms_per_sentence']:.1f} | "
                      f"{f['cpu_ratio_to_kenlm']:.2f} ({f['cpu_paired_ratio_median']:.2f}) | "
                      f"{f['wall_ms_per_sentence']:.1f} | {c['bleu']:.2f} |")
        print()
    for name in names if {"normal", "batch"} <= set(searches) else []:
        # the batch path's gain: CPU of the normal search over the batch search's, same threads
        for t in threads:
            nb, bb = (f"{name}/normal", t), (f"{name}/batch", t)
            gain = median([(a - runs.load_cpu[nb[0]]) / (b - runs.load_cpu[bb[0]])
                           for a, b in zip(runs.cpus[nb], runs.cpus[bb])])
            res["configs"][f"{name}/batch"]["threads"][t]["normal_over_batch_cpu_paired"] = gain
            print(f"batch search gain {name}, {t} thread(s): normal/batch CPU = {gain:.3f} (paired median)")
    for name in names:
        # thread scaling: CPU and wall of the most threads against one thread
        if len(threads) > 1:
            for search in searches:
                key = f"{name}/{search}"
                c = res["configs"][key]["threads"]
                c[threads[-1]]["wall_speedup_over_one_thread"] = c[threads[0]]["wall_ms_per_sentence"] / \
                    c[threads[-1]]["wall_ms_per_sentence"]
                print(f"thread scaling {key}: wall {threads[0]} -> {threads[-1]} threads "
                      f"{c[threads[-1]]['wall_speedup_over_one_thread']:.2f}x")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                    help="an NLM to add to KenLM (repeatable), e.g. unnormalised=lbl.nlm")
    ap.add_argument("--neurallm", action="append", default=[], metavar="NAME=NPLM_MODEL",
                    help="a configuration NAME with Moses' own NPLM feature (NeuralLM, --with-nplm) on this NPLM "
                         "text model instead of NLMFeature, to compare with the same model converted by "
                         "`nlmfeature convert` (repeatable)")
    ap.add_argument("--joint", action="append", default=[], metavar="NAME=JOINT[:MODEL]",
                    help="a configuration NAME with a joint model (NNJM, docs/joint.md) as NLMJointFeature "
                         "(label NNJM0) beside KenLM and, with :MODEL (a --model name), that NLM too "
                         "(repeatable); weights as for --model (--weights NAME=INI's NLM0/NNJM0, else "
                         "--nlm-weight; in cdec the joint shim libcdec_ff_nlmjoint.so beside --cdec-ff, feature "
                         "NNJM); counters cover --model configurations and, in Moses, joint ones without an NLM")
    ap.add_argument("--moses", default=None, help="the moses executable (default: MOSES_ROOT/bin/moses, else "
                    "the newest moses-cmd build under MOSES_ROOT; a copy keeps a measurement safe from rebuilds)")
    ap.add_argument("--feature-args", action="append", default=[], metavar="NAME=ARGS",
                    help="extra keys for model NAME's feature line (Moses: 'key=value ...'; cdec: "
                         "'--option value ...'; a --joint NAME: its NLMJointFeature line in Moses), e.g. to "
                         "compare settings of one model under two names")
    ap.add_argument("--binary", action="append", default=[], metavar="NAME=MOSES",
                    help="run configuration NAME (kenlm or a --model name) with this moses executable instead "
                         "of MOSES_ROOT's (e.g. a build of another nlmfeature version, to compare in one run)")
    ap.add_argument("--decoder", default="moses", help="comma-separated: moses, moses2, cdec (default moses)")
    ap.add_argument("--moses2", default=None, help="the moses2 executable for --decoder moses2 (default: "
                    "MOSES_ROOT/bin/moses2, else the newest moses2 build under MOSES_ROOT)")
    ap.add_argument("--shared", default=None, help="the shared folder holding data/ (default: $NLMFEATURE_SHARED "
                    "or ../shared beside the repository)")
    ap.add_argument("--system", default=None, help="directory of the Moses system (default: "
                    "SHARED/data/moses/multi30k-de-en; its moses.tuned.ini, else moses.ini)")
    ap.add_argument("--ini", default=None, help="the system's moses.ini (default: see --system)")
    ap.add_argument("--test-src", default=None, help="test source text (default: SHARED/data/nbest/"
                    "moses-multi30k-de-en/test.src.de.gz, test2016)")
    ap.add_argument("--test-ref", default=None, help="test reference (default: test.ref.en.gz beside it)")
    ap.add_argument("--sentences", type=int, default=100, help="test sentences to decode (default 100)")
    ap.add_argument("--threads", default="1,2", help="comma-separated Moses thread counts (default 1,2)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration; the minimum is kept "
                    "(default 3)")
    ap.add_argument("--nlm-weight", type=float, default=0.1, help="weight of the NLM feature (default 0.1)")
    ap.add_argument("--kenlm-twice", action="store_true",
                    help="add configuration kenlm+kenlm: the system's KenLM model a second time as its own "
                         "feature at weight 0 (the same search): what any second n-gram LM feature costs "
                         "Moses, KenLM's own lookups and minimised state included (Moses only)")
    ap.add_argument("--moses2-search", default="normal,batch,cube",
                    help="comma-separated Moses2 searches to time (default normal,batch,cube): normal "
                         "(search-algorithm 0), batch (4: a stack's hypotheses scored in one call) and cube "
                         "(1: cube pruning at Moses2's default pop limit, the search its authors optimised)")
    ap.add_argument("--markdown", action="store_true",
                    help="also print the Moses2 figures as one markdown table (docs/results.md)")
    ap.add_argument("--config", action="append", default=[], metavar="NAME=MOSES_INI",
                    help="Moses2 only: decode this ready-made moses.ini as configuration NAME instead of "
                         "the system with --model features (repeatable; the first is the baseline of the "
                         "ratios), e.g. the tuned systems of `nlmfeature bench mt` (each side's "
                         "final.last.moses.ini): every configuration with its own tuned weights, timed "
                         "side by side")
    ap.add_argument("--weights", action="append", default=[], metavar="NAME=MOSES_INI",
                    help="use the [weight] section of this moses.ini (e.g. tuned by nlmfeature-tune) for "
                         "configuration NAME (kenlm or a --model name); repeatable")
    ap.add_argument("--no-filter", action="store_true", help="use the full tables (slow to load)")
    ap.add_argument("--kenlm-bin", default=None, help="directory of KenLM's build_binary (default: "
                    "MOSES_ROOT/bin, $NLMFEATURE_KENLM_BIN, ~/.cache/nlmfeature/kenlm/bin, PATH)")
    ap.add_argument("--profile", action="store_true", help="also profile one 1-thread decode per "
                    "configuration with perf and split the time into parts")
    ap.add_argument("--no-counters", action="store_true", help="skip the counting run (stats=true)")
    ap.add_argument("--cdec-ff", default=None,
                    help="the cdec feature library (default cdec_ff/libcdec_ff_nlm.so of this repository)")
    ap.add_argument("--tune-src", default=None, help="dev source for tuning (default SHARED/data/nbest/"
                    "moses-multi30k-de-en/dev.src.de.gz)")
    ap.add_argument("--tune-ref", default=None, help="dev reference (default dev.ref.en.gz beside it)")
    ap.add_argument("--tune-sentences", type=int, default=0, help="dev sentences for the persistent-cache "
                    "tuning measurement (default 0: skip it)")
    ap.add_argument("--tune-models", default="", help="comma-separated model names for the tuning "
                    "measurement (default: all)")
    ap.add_argument("--tune-algorithm", default="mert", choices=["mert", "mira", "pro"],
                    help="optimiser giving the second iteration's weights (default mert)")
    ap.add_argument("--workdir", default=None, help="keep files here and reuse the filtered tables, binary LM "
                    "and grammars of an earlier run (default: a temporary directory)")
    ap.add_argument("--json", default=None, help="write all figures to this JSON file")
    ap.set_defaults(func=run)
    return base.run(ap, argv)     # the package's one error handler: bad input gives a message, no traceback


def run(args: argparse.Namespace) -> int:

    shared = shared_dir(args.shared)
    system = os.path.abspath(args.system or os.path.join(shared, SYSTEM_REL))
    nbest = os.path.join(shared, NBEST_REL)
    args.test_src = args.test_src or os.path.join(nbest, "test.src.de.gz")
    args.test_ref = args.test_ref or os.path.join(os.path.dirname(args.test_src),
                                                  os.path.basename(args.test_src).replace("src.de", "ref.en"))
    args.tune_src = args.tune_src or os.path.join(nbest, "dev.src.de.gz")
    args.tune_ref = args.tune_ref or os.path.join(nbest, "dev.ref.en.gz")
    for p in (system, args.test_src, args.test_ref):
        if not os.path.exists(p):
            sys.exit(f"{p} not found (give --shared DIR or the file's flag)")
    decoders = [d for d in args.decoder.split(",") if d]
    models = dict(m.split("=", 1) for m in args.model)
    neurallm = dict(m.split("=", 1) for m in args.neurallm)
    extras = dict(m.split("=", 1) for m in args.feature_args)
    joints: Dict[str, Tuple[str, Optional[str]]] = {}
    for spec in args.joint:
        name, _, rest = spec.partition("=")
        path, _, with_nlm = rest.partition(":")
        if not path or (with_nlm and with_nlm not in models):
            sys.exit(f"--joint {spec}: give NAME=JOINT_PATH[:MODEL_NAME] with MODEL_NAME a --model name")
        joints[name] = (path, with_nlm or None)
    for name, path in list(models.items()) + [(n, p) for n, (p, _) in joints.items()]:
        if not os.path.exists(path):
            sys.exit(f"model {name}: {path} not found")
    if "moses2" in decoders:   # (checked now, not after the Moses half of the run)
        args.moses2 = moses2_binary(args, bool(models or args.config))
    work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="bench_decoder."))
    os.makedirs(work, exist_ok=True)
    src = write_lines(os.path.join(work, "test.src"), read_lines(args.test_src, args.sentences))
    refs = read_lines(args.test_ref, args.sentences)
    n = len(refs)
    results: Dict = {"sentences": n, "test_src": args.test_src, "system": system, "workdir": work,
                     "nlm_weight": args.nlm_weight, "models": models, "feature_args": extras,
                     "joint": {k: {"joint": p, "with": m} for k, (p, m) in joints.items()}}
    print(f"workdir: {work}\nsystem: {system}\n{n} test sentences", flush=True)

    lm = None
    base, weights = "", {}
    if args.config:
        if decoders != ["moses2"]:
            sys.exit("--config: ready-made configurations are decoded by --decoder moses2 only")
        for spec in args.config:
            name, _, path = spec.partition("=")
            if not name or not os.path.exists(path):
                sys.exit(f"--config {spec}: give NAME=MOSES_INI with an existing file")
    elif "moses2" in decoders and "moses" not in decoders:
        inputs = [src]
        base, weights, sysinfo = prepare_moses_system(system, args.ini, inputs, work, args.kenlm_bin,
                                                      not args.no_filter)
    if "moses" in decoders:
        moses = mo.find_moses(args.moses, features=("NLMFeature",) + (("NLMJointFeature",) if joints else ()))
        inputs = [src] + ([write_lines(os.path.join(work, "dev.src"), read_lines(args.tune_src, args.tune_sentences))]
                          if args.tune_sentences else [])
        base, weights, sysinfo = prepare_moses_system(system, args.ini, inputs, work, args.kenlm_bin,
                                                      not args.no_filter)
        lm = sysinfo.get("lm")
        results["moses"] = mres = {"moses": moses, "system_info": sysinfo, "configs": {}}
        binaries = dict(b.split("=", 1) for b in args.binary)
        mres["binaries"] = binaries
        tuned = {k: read_weights(v) for k, v in (w.split("=", 1) for w in args.weights)}
        configs = {"kenlm": write_ini(os.path.join(work, "kenlm.ini"), base, tuned.get("kenlm", weights))}
        for name, path in models.items():
            w = tuned.get(name, weights)
            nw = w.get("NLM0", [args.nlm_weight])[0]
            configs[name] = write_ini(os.path.join(work, f"{name}.ini"), base, w, path, nw, extras.get(name, ""))
        for name, (path, with_nlm) in joints.items():
            w = tuned.get(name, weights)
            nw = w.get("NLM0", [args.nlm_weight])[0]
            jw = w.get("NNJM0", [args.nlm_weight])[0]
            configs[name] = write_ini(os.path.join(work, f"{name}.ini"), base, w,
                                      models[with_nlm] if with_nlm else None, nw,
                                      extras.get(with_nlm, "") if with_nlm else "",
                                      joint=path, joint_weight=jw, joint_extra=extras.get(name, ""))
        if args.kenlm_twice:
            # the cost of a second n-gram LM feature to Moses, measured on KenLM itself: the
            # system's binary LM once more (label LM9), weight 0 so that the search is KenLM
            # alone's; its state is KenLM's minimised one, so it costs no recombination
            configs["kenlm+kenlm"] = mo.add_features(
                base, os.path.join(work, "kenlm+kenlm.ini"),
                [f"KENLM name=LM9 factor=0 path={os.path.abspath(lm)} order=5"],
                dict(tuned.get("kenlm", weights), LM9=[0.0]))
        for name, path in neurallm.items():
            configs[name] = write_ini(os.path.join(work, f"{name}.ini"), base, tuned.get(name, weights), path,
                                      args.nlm_weight, extras.get(name, ""), feature="NeuralLM")
        threads = [int(t) for t in args.threads.split(",")]
        print(f"moses: {moses}\nthreads {threads}, {args.repeats} repeats", flush=True)
        empty = write_lines(os.path.join(work, "empty.src"), [])
        runs = Runs()
        for rep in range(args.repeats):
            for name, ini in configs.items():
                exe = binaries.get(name, moses)
                runs.add_load(name, run_moses(exe, ini, empty))
                for t in threads:
                    runs.add((name, t), run_moses(exe, ini, src, threads=t))
            print(f"  moses repeat {rep + 1}/{args.repeats} done", flush=True)
        walls, cpus, trans, load, load_cpu, outputs = (runs.walls, runs.cpus, runs.trans, runs.load, runs.load_cpu,
                                                       runs.outputs)
        print(f"\nMoses ({n} sentences; 'trans' = sum of per-sentence 'Translation took' (wall clock); 'cpu' = "
              f"the process's CPU time minus that of loading (decoding an empty input), robust on a busy machine; "
              f"ratios to KenLM alone; paired = median over repeats of back-to-back ratios)\n"
              f"{'config':16s} {'thr':>3s} {'trans ms/s':>10s} {'ratio':>6s} {'paired':>6s} {'cpu ms/s':>9s} "
              f"{'ratio':>6s} {'paired':>6s} {'BLEU':>6s} {'same-thr':>8s}")
        for name in configs:
            b = bleu(outputs[(name, threads[0])], refs)
            same = all(outputs[(name, t)] == outputs[(name, threads[0])] for t in threads)
            c = mres["configs"].setdefault(name, {})
            c.update({"bleu": b, "load_seconds": load[name], "same_translations_across_threads": same,
                      "nondeterministic": any((name, t) in runs.changed for t in threads), "threads": {}})
            for t in threads:
                k, kb = (name, t), ("kenlm", t)
                per, ratio, paired = figures(trans[k], 0.0, trans[kb], 0.0, n)
                wper, wratio, _ = figures(walls[k], load[name], walls[kb], load["kenlm"], n)
                cper, cratio, cpaired = figures(cpus[k], load_cpu[name], cpus[kb], load_cpu["kenlm"], n)
                c["threads"][t] = {
                    "cpu_ms_per_sentence": cper, "cpu_ratio_to_kenlm": cratio,
                    "cpu_paired_ratio_median": cpaired, "cpu_seconds_all": cpus[k],
                    "load_cpu_seconds": load_cpu[name],
                    "translation_ms_per_sentence": per, "ratio_to_kenlm": ratio,
                    "paired_ratio_median": paired, "translation_seconds": trans[k],
                    "wall_ms_per_sentence": wper, "wall_ratio_to_kenlm": wratio, "wall_seconds": walls[k]}
                print(f"{name:16s} {t:3d} {per:10.1f} {ratio:6.2f} {paired:6.2f} {cper:9.1f} "
                      f"{cratio:6.2f} {cpaired:6.2f} {b:6.2f} {str(same):>8s}")
            if name != "kenlm":
                c["same_translations_as_kenlm"] = outputs[(name, threads[0])] == outputs[("kenlm", threads[0])]

        if not args.no_counters:
            # counters, two untimed runs per model: (1) what Moses asks -- the span memo off and
            # the n-gram / context caches on with huge bounds, so that exact n-gram repeats and
            # distinct contexts are counted (scores do not change); (2) the default settings, for
            # the span memo's hit rate and the lookups that reach the scorer
            # (and the joint models of configurations without an NLM: NLMJointFeature's counters)
            counted = [(name, path, False) for name, path in models.items()] + \
                      [(name, path, True) for name, (path, with_nlm) in joints.items() if not with_nlm]
            for name, path, is_joint in counted:
                mc = mres["configs"][name]
                for kind, keys in (("counters", "stats=true span-memo-entries=0 ngram-cache-entries=67108864 "
                                                "cache-entries=16777216 context-cache=true"),
                                   ("counters_default", "stats=true")):
                    w = tuned.get(name, weights)
                    if is_joint:
                        ini = write_ini(os.path.join(work, f"{name}.{kind}.ini"), base, w, joint=path,
                                        joint_weight=w.get("NNJM0", [args.nlm_weight])[0], joint_extra=keys)
                    else:
                        ini = write_ini(os.path.join(work, f"{name}.{kind}.ini"), base, w, path,
                                        args.nlm_weight, (extras.get(name, "") + " " + keys).strip())
                    try:
                        r = run_moses(binaries.get(name, moses), ini, src)
                    except DecoderError as e:  # e.g. an older build without span-memo-entries
                        mc[kind] = {"error": str(e).splitlines()[-1][:300]}
                        print(f"counters {name} ({kind}): not available: {mc[kind]['error']}")
                        continue
                    st = parse_stats(r["stderr"], "NLMJointFeature") if is_joint else r["stats"]
                    rr = rates(st)
                    if st.get("span_calls"):
                        rr["span_memo_hit_rate"] = st.get("span_hits", 0) / st["span_calls"]
                        rr["span_calls_per_sentence"] = st["span_calls"] / max(1, st.get("sentences", 1))
                    mc[kind] = dict(st, **rr)
                    if r["output"] != outputs[(name, threads[0])]:
                        mc[kind + "_changed_translations"] = True
                    if kind == "counters":
                        print(f"counters {name}: {rr['lookups_per_sentence']:.0f} lookups/sentence, "
                              f"{rr.get('distinct_ngrams_per_sentence', 0):.0f} distinct n-grams "
                              f"({rr['ngram_hit_rate']:.3f} repeats), "
                              f"{rr.get('distinct_contexts_per_sentence', 0):.0f} distinct contexts, class "
                              f"normaliser hit rate {rr['class_hit_rate']:.3f}", flush=True)
                    else:
                        print(f"counters {name} (defaults): {rr.get('span_calls_per_sentence', 0):.0f} expansions"
                              f"/sentence, span memo hit rate {rr.get('span_memo_hit_rate', 0):.3f}, "
                              f"{rr['lookups_per_sentence']:.0f} lookups/sentence reach the scorer, n-gram cache "
                              f"hit rate {rr['ngram_hit_rate']:.3f}", flush=True)
        if args.profile:
            for name, ini in configs.items():
                prof = perf_profile([binaries.get(name, moses), "-f", ini, "-i", src, "-threads", "1"],
                                    os.path.join(work, f"{name}.perf.data"))
                if prof:
                    mres["configs"][name]["profile"] = prof
                    print(f"profile moses {name}: " +
                          ", ".join(f"{k} {v:.1f}%" for k, v in prof["parts_percent"].items()), flush=True)

        # second tuning iteration with and without the persistent cache
        if args.tune_sentences:
            dev = os.path.join(work, "dev.src")  # written above (filter input)
            with open(dev, "w", encoding="utf-8") as f:
                f.write("\n".join(read_lines(args.tune_src, args.tune_sentences)) + "\n")
            devref = os.path.join(work, "dev.ref")
            with open(devref, "w", encoding="utf-8") as f:
                f.write("\n".join(read_lines(args.tune_ref, args.tune_sentences)) + "\n")
            names = [x for x in args.tune_models.split(",") if x] or list(models)
            results["tuning"] = {}
            for name in names:
                path = models[name]
                pc = os.path.join(work, f"pcache-{name}")
                # this checkout's package, installed or not (an installed one may be another checkout's)
                penv = dict(os.environ, PYTHONPATH=os.path.join(REPO, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
                subprocess.run([sys.executable, "-m", "nlmfeature.cli", "cache", pc, "--clear"], capture_output=True,
                               env=penv)
                # a model the cache does not pay for leaves no directory behind: copy an empty one
                os.makedirs(pc, exist_ok=True)
                ini_pc = write_ini(os.path.join(work, f"{name}.pc.ini"), base, weights, path, args.nlm_weight,
                                   f"persistent-cache={pc} stats=true")
                ini_nopc = write_ini(os.path.join(work, f"{name}.nopc.ini"), base, weights, path, args.nlm_weight,
                                     "stats=true")
                nb1 = os.path.join(work, f"{name}.it1.nbest")
                it1 = run_moses(moses, ini_pc, dev, nbest=nb1)
                w1 = os.path.join(work, f"{name}.w1")
                subprocess.run([sys.executable, "-m", "nlmfeature.cli", "tune", "optimise", "--nbest", nb1, "--init", ini_pc, "--ref", devref,
                                "--out", w1, "--algorithm", args.tune_algorithm, "--quiet"]
                               + (["--restarts", "5"] if args.tune_algorithm == "mert" else []),
                               check=True, capture_output=True, env=penv)
                wline = " ".join(l.strip() for l in open(w1) if l.strip())
                wfile = os.path.join(work, f"{name}.w1.line")
                with open(wfile, "w") as f:
                    f.write(wline)
                # the same weights without the NLM: the cost of everything else
                ini_base = os.path.join(work, f"{name}.kenlm-w1.ini")
                base_w = {k: v for k, v in read_weights(w1).items() if k != "NLM0"}
                write_ini(ini_base, base, base_w)
                times = {"kenlm": [], "no_cache": [], "persistent_cache": []}
                stats = {}
                for rep in range(args.repeats):
                    times["kenlm"].append(run_moses(moses, ini_base, dev, nbest=os.path.join(work, "x.nbest"))["wall"])
                    r = run_moses(moses, ini_nopc, dev, nbest=os.path.join(work, "y.nbest"), weights_file=wfile)
                    times["no_cache"].append(r["wall"])
                    stats["no_cache"] = r["stats"]
                    # keep the cache as iteration 1 left it: work on a copy
                    cp = pc + ".copy"
                    subprocess.run(["rm", "-rf", cp])
                    subprocess.run(["cp", "-a", pc, cp], check=True)
                    ini_cp = write_ini(os.path.join(work, f"{name}.pccopy.ini"), base, weights, path, args.nlm_weight,
                                       f"persistent-cache={cp} stats=true")
                    r = run_moses(moses, ini_cp, dev, nbest=os.path.join(work, "z.nbest"), weights_file=wfile)
                    times["persistent_cache"].append(r["wall"])
                    stats["persistent_cache"] = r["stats"]
                t = {k: min(v) for k, v in times.items()}
                cost_no = t["no_cache"] - t["kenlm"]
                cost_pc = t["persistent_cache"] - t["kenlm"]
                results["tuning"][name] = {
                    "iteration1_seconds": it1["wall"], "iteration2_seconds": t,
                    "nlm_cost_seconds": {"no_cache": cost_no, "persistent_cache": cost_pc},
                    "cost_ratio": cost_no / cost_pc if cost_pc > 0 else float("inf"),
                    "persistent_hit_rate": rates(stats["persistent_cache"])["persistent_hit_rate"],
                    "stats": stats}
                print(f"tuning {name}: iteration 2 on {args.tune_sentences} dev sentences: KenLM only "
                      f"{t['kenlm']:.2f} s, +NLM {t['no_cache']:.2f} s, +NLM with persistent cache "
                      f"{t['persistent_cache']:.2f} s; NLM cost {cost_no:.2f} s -> {cost_pc:.2f} s "
                      f"({results['tuning'][name]['cost_ratio']:.1f}x lower); persistent hit rate "
                      f"{results['tuning'][name]['persistent_hit_rate']:.3f}")

    if "moses2" in decoders:
        results["moses2"] = bench_moses2(args, models, extras, base, weights, work, src, refs,
                                         results.get("moses"))

    if "cdec" in decoders:
        if lm is None:
            lm = cd.system_lm(mo.system_ini(system, args.ini), work, system, [args.kenlm_bin])
        results["cdec"] = bench_cdec(args, models, extras, shared, work, src, refs, lm, joints)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
        print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
