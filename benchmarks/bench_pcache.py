#!/usr/bin/env python3
"""Persistent tuning cache benchmark: real MERT and MIRA tuning loops in Moses, with and without the cache.

On a real Moses system (default: the Multi30k de->en system in ``../shared/data/moses/multi30k-de-en``
beside the repository, its tables filtered to the dev sentences used and its LM binarised
first), for each NLM given and each algorithm (MERT, MIRA), runs a tuning loop of
``--iterations`` iterations on the first ``--sentences`` dev sentences (a subset, labelled as
such in the output).  Every iteration decodes the dev set (100-best) three times with that
iteration's weights, back to back:

* KenLM and the other features only (the NLM's weight set aside): the cost of everything else;
* with the NLM, no persistent cache;
* with the NLM and ``persistent-cache=DIR`` (the directory carries over between iterations);

checks that the two NLM decodes give identical n-best lists (the cache is exact), and pools
the k-best lists for ``nlmfeature-tune optimise`` (the same algorithm) to get the next
weights.  At the end the last weights are decoded once more with the cache ("unchanged
weights", as a resumed or repeated tuning run does).

Printed per iteration: the decoders' CPU seconds (user + system of the Moses process, one
decoder thread: steadier on a shared machine than wall time; with ``--repeats R`` the least of
R interleaved decodes of each configuration, every cached one from the same cache state), the NLM's cost (CPU time
beyond the KenLM-only decode) without and with the cache and their ratio, the time inside the
scorer (``NLMFEATURE_TIMING=1``: the decoder thread's time in scoring calls, sampled one in 16
on average by the monotonic clock and scaled by the sentence's CPU over wall time, and its CPU
time in every sentence begin and end, the clocks' cost subtracted; this costs the decode
well under 1%) without and with the cache and their ratio -- the NLM cost minus this is the
feature's effect on the search (other hypotheses, less recombination), which no cache can
remove --, the share of each level found on disk (n-gram scores: share of
lookups; context normalisers: share of distinct contexts; within-class normalisers: share
of distinct (context, class) pairs; from ``NLMFEATURE_CACHE_STATS=1``), the share of the
iteration's distinct n-grams already on disk (the n-gram-level bound: if only n-gram
scores were reused, at best ``1 - share`` of the work would remain; the decode bound adds the
NLM cost outside the scorer, which no cache removes: ``decode_bound``), the cache directory's
size, whether both NLM decodes gave identical 100-best lists, dev BLEU; wall times in the JSON.

Needs a Moses binary with NLMFeature compiled in (``--moses``, else ``bin/moses`` or the newest
moses-cmd build of ``--moses-root`` / ``$MOSES_ROOT``; it must load this checkout's
libnlmfeature: see ``--help`` of ``--moses``) and KenLM's ``build_binary`` (``$MOSES_ROOT/bin``,
~/.cache/nlmfeature/kenlm/bin or PATH, ``tools/build_kenlm.sh``); the tables are filtered by
``nlmfeature.mt.moses`` (the lines Moses' ``filter-model-given-input.pl`` keeps).  Example::

    MOSES_ROOT=/path/to/mosesdecoder python3 benchmarks/bench_pcache.py \\
        --model class=class.nlm --model unnormalised=lbl.nlm --sentences 100 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "src"))  # this checkout's package (the one the measured Moses loads)
from nlmfeature.commands import base  # noqa: E402
from nlmfeature.bench import shared_data  # noqa: E402
from nlmfeature.io.atomicfile import atomic_write_text  # noqa: E402
from nlmfeature.io.textio import iter_lines  # noqa: E402
from nlmfeature.commands.base import size_bytes  # noqa: E402
from nlmfeature.mt import moses as mo  # noqa: E402
from nlmfeature.mt.weights import Weights, format_weights, read_weights  # noqa: E402
SHARED = shared_data()
SYSTEM = os.path.join(SHARED, "moses", "multi30k-de-en")
NBEST = os.path.join(SHARED, "nbest", "moses-multi30k-de-en")
PY = [sys.executable]


def read_lines(path: str, n: Optional[int] = None) -> List[str]:
    """The first ``n`` lines (all if 0/None), through the package's one text reader."""
    out = []
    for _, line in iter_lines(path):
        if n and len(out) >= n:
            break
        out.append(line)
    return out


def prepare_system(system: str, moses_root: Optional[str], src: str, work: str) -> str:
    """moses.ini of the system (its moses.untuned.ini) with tables filtered to ``src`` and a
    binarised LM (``build_binary`` of ``moses_root`` first), in ``work``/system
    (``nlmfeature.mt.moses.prepare_system``)."""
    ini = os.path.join(system, "moses.untuned.ini")
    out = os.path.join(work, "system")
    return mo.prepare_system(ini, out, [mo.content_named_input(out, [src], ini)], system,
                             kenlm_bin=[os.path.join(moses_root, "bin") if moses_root else None]).ini


def write_ini(path: str, base: str, weights: Weights, nlm: Optional[str], extra: str = "") -> str:
    """``base`` with ``weights`` and, with ``nlm``, its feature line (label NLM0) at the end of
    [feature]; without, no NLM0 weight."""
    lines = [f"NLMFeature name=NLM0 path={os.path.abspath(nlm)} factor=0 stats=true {extra}".rstrip()] if nlm else []
    return mo.add_features(base, path, lines, {k: v for k, v in weights.items() if nlm or k != "NLM0"})


def run_moses(moses: str, ini: str, src: str, nbest: str, threads: int, env: Dict[str, str]) -> Dict:
    r = mo.run(mo.command(moses, ini, src, threads, nbest, 100, distinct=True), env=env)
    st: Dict[str, int] = {}
    scorer_ns = 0
    for line in r.stderr.splitlines():
        if line.startswith("nlmfeature: cache sentence "):
            for kv in line.split()[4:]:
                k, v = kv.split("=")
                st[k] = st.get(k, 0) + int(v)
        elif line.startswith("NLMFeature ") and " nlm_ns=" in line:
            scorer_ns += int(line.split(" nlm_ns=")[1].split()[0])
    return {"wall": r.wall, "cpu": r.cpu, "translation": r.translation, "stats": st, "output": r.stdout,
            "scorer": scorer_ns / 1e9,
            "notes": [l for l in r.stderr.splitlines() if l.startswith("nlmfeature:") and "cache sentence" not in l]}


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def fastest(runs: List[Dict]) -> Dict:
    """The repeat with the least CPU time, its scorer time the least of any repeat: on a shared
    machine a decode is only ever slowed down by others, so the minimum is the steady figure."""
    best = dict(min(runs, key=lambda r: r["cpu"]))
    best["scorer"] = min(r["scorer"] for r in runs)
    return best


def du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def level_rates(st: Dict[str, int]) -> Dict[str, float]:
    def r(a, b):
        return st.get(a, 0) / st[b] if st.get(b) else 0.0
    return {"ngram_lookups_from_disk": r("persistent_hits", "lookups"),
            "distinct_ngrams_on_disk": r("ngrams_on_disk", "ngrams"),
            "contexts_on_disk": r("contexts_on_disk", "contexts"),
            "class_pairs_on_disk": r("class_pairs_on_disk", "class_pairs")}


def decode_bound(cost: float, scorer: float, ngram_bound: float) -> float:
    """The least NLM cost ratio an iteration's reuse allows: of the NLM's ``cost`` without the
    cache (CPU seconds beyond the KenLM-only decode), the part outside the scorer (its effect on
    the search: other hypotheses, less recombination; the shim) stays, and of the ``scorer``'s
    own seconds the share of distinct n-grams not on disk (``ngram_bound``); hits taken as free."""
    if cost <= 0:
        return float("nan")
    return (max(cost - scorer, 0.0) + ngram_bound * min(scorer, cost)) / cost


def nbest_body(path: str) -> List[str]:
    """The n-best lines without the sentence-independent noise (identical decodes match)."""
    return open(path, encoding="utf-8").read().splitlines()


def optimise(pool: List[str], ini: str, ref: str, out: str, algorithm: str, seed: int,
             env: Dict[str, str]) -> Weights:
    """The next weights from the pooled k-best lists, by this checkout's optimiser (``env``:
    the one Moses runs with, whose PYTHONPATH puts this checkout's package first)."""
    cmd = PY + ["-m", "nlmfeature.cli", "tune", "optimise", "--init", ini, "--ref", ref, "--out", out,
                "--algorithm", algorithm, "--quiet"]
    for nb in pool:
        cmd += ["--nbest", nb]
    if algorithm == "mert":
        cmd += ["--restarts", "5", "--seed", str(seed)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"optimise failed: {p.stderr[-2000:]}")
    return read_weights(out)


def bleu(hyps: List[str], refs: List[str]) -> float:
    import sacrebleu
    return sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[], metavar="NAME=PATH", required=True,
                    help="an NLM to add to the system (repeatable), e.g. class=class.nlm")
    ap.add_argument("--moses", default=None,
                    help="Moses executable with NLMFeature (default $MOSES_ROOT/bin/moses).  It is run "
                         "with LD_LIBRARY_PATH and PYTHONPATH pointing at this checkout, so it loads "
                         "this checkout's libnlmfeature (which imports its own package), whatever "
                         "tree Moses was linked against (check with ldd)")
    ap.add_argument("--moses-root", default=os.environ.get("MOSES_ROOT"),
                    help="mosesdecoder tree: its bin/moses (else its newest moses-cmd build) when --moses is "
                         "not given, and its bin/build_binary binarises the LM (default $MOSES_ROOT)")
    ap.add_argument("--system", default=SYSTEM,
                    help="Moses system directory with moses.untuned.ini, tables and an ARPA LM "
                         "(default ../shared/data/moses/multi30k-de-en beside the repository)")
    ap.add_argument("--dev-src", default=os.path.join(NBEST, "dev.src.de.gz"), help="dev source")
    ap.add_argument("--dev-ref", default=os.path.join(NBEST, "dev.ref.en.gz"), help="dev reference")
    ap.add_argument("--sentences", type=int, default=100,
                    help="first N dev sentences (default 100; 0: all 1,014)")
    ap.add_argument("--algorithms", default="mert,mira", help="comma-separated: mert, mira (default both)")
    ap.add_argument("--iterations", type=int, default=4, help="tuning iterations (default 4)")
    ap.add_argument("--nlm-weight", type=float, default=0.1, help="initial weight of NLM0 (default 0.1)")
    ap.add_argument("--threads", type=int, default=1, help="decoder threads (default 1)")
    ap.add_argument("--seed", type=int, default=1, help="MERT random restarts seed (default 1)")
    ap.add_argument("--repeats", type=positive_int, default=1,
                    help="decode each iteration's three configurations this many times, interleaved, each "
                         "cached repeat from the cache as the iteration found it, and report the least CPU "
                         "time of each (default 1; 3 on a shared machine, where one run cannot resolve 10%%)")
    ap.add_argument("--max-bytes", default=None, metavar="SIZE", type=size_bytes,
                    help="bound of the cache directory (persistent-cache-max: 500M, 2G, ...; default: the "
                         "feature's own, 4G); a bound below the dev set's files shows what a tuning loop keeps")
    ap.add_argument("--workdir", default=None, help="keep files here (default: a temporary directory)")
    ap.add_argument("--json", default=None, help="write all figures to this JSON file")
    ap.set_defaults(func=run)
    return base.run(ap, argv)     # the package's one error handler: bad input gives a message, no traceback


def run(args: argparse.Namespace) -> int:

    moses = mo.find_moses(args.moses, args.moses_root)
    work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="bench_pcache."))
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "dev.src")
    refs = read_lines(args.dev_ref, args.sentences or None)
    with open(src, "w", encoding="utf-8") as f:
        f.write("\n".join(read_lines(args.dev_src, args.sentences or None)) + "\n")
    ref = os.path.join(work, "dev.ref")
    with open(ref, "w", encoding="utf-8") as f:
        f.write("\n".join(refs) + "\n")
    ini0 = prepare_system(args.system, args.moses_root, src, work)
    weights0 = read_weights(ini0)
    # this checkout's library and package (Moses' RUNPATH names the tree it was built against)
    env = dict(os.environ, NLMFEATURE_CACHE_STATS="1", NLMFEATURE_TIMING="1",
               PYTHONPATH=os.path.join(REPO, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               LD_LIBRARY_PATH=os.path.join(REPO, "src", "nlmfeature", "lib") + os.pathsep
               + os.environ.get("LD_LIBRARY_PATH", ""))
    env.pop("NLMFEATURE_PERSISTENT_CACHE", None)
    n = len(refs)
    label = f"first {n} dev sentences" if args.sentences and n < 1014 else f"{n} dev sentences"
    print(f"moses: {moses}\nsystem: {os.path.abspath(args.system)} (tables filtered, LM binarised)\n"
          f"dev: {label}; {args.iterations} iterations; {args.threads} thread(s); "
          f"cache bound {args.max_bytes or 'the default'}\nworkdir: {work}")
    results: Dict = {"moses": moses, "sentences": n, "label": label, "max_bytes": args.max_bytes, "runs": {}}
    for spec in args.model:
        name, path = spec.split("=", 1)
        for alg in [a for a in args.algorithms.split(",") if a]:
            key = f"{name}/{alg}"
            pc = os.path.join(work, f"pcache-{name}-{alg}")
            shutil.rmtree(pc, ignore_errors=True)
            weights = dict(weights0, NLM0=[args.nlm_weight])
            pool: List[str] = []
            rows = []
            print(f"\n== {name} model, {alg.upper()} ({label})")
            print(f"{'iter':>4s} {'KenLM s':>8s} {'NLM s':>7s} {'+cache s':>8s} {'NLM cost':>8s} "
                  f"{'w/ cache':>8s} {'ratio':>6s} {'scorer':>7s} {'w/ cache':>8s} {'ratio':>6s} "
                  f"{'ngram':>6s} {'dist.':>6s} {'ctx':>6s} {'class':>6s} "
                  f"{'bound':>6s} {'disk MB':>8s} {'same':>4s} {'BLEU':>6s}")
            for it in range(1, args.iterations + 2):
                final = it == args.iterations + 1  # the last weights again: unchanged weights
                tag = f"{name}.{alg}.{it}"
                ini_k = write_ini(os.path.join(work, f"{tag}.kenlm.ini"), ini0, weights, None)
                ini_n = write_ini(os.path.join(work, f"{tag}.nlm.ini"), ini0, weights, path)
                bound = f" persistent-cache-max={args.max_bytes}" if args.max_bytes else ""
                ini_c = write_ini(os.path.join(work, f"{tag}.pc.ini"), ini0, weights, path,
                                  f"persistent-cache={pc}{bound}")
                nb = os.path.join(work, f"{tag}.pc.nbest")
                snap = pc + ".before"
                if args.repeats > 1:  # every cached repeat starts from the cache as the iteration found it
                    shutil.rmtree(snap, ignore_errors=True)
                    if os.path.isdir(pc):
                        shutil.copytree(pc, snap)
                runs: Dict[str, List[Dict]] = {"kenlm": [], "nlm": [], "cache": []}
                same = True
                for k in range(args.repeats):
                    if k:
                        shutil.rmtree(pc, ignore_errors=True)
                        if os.path.isdir(snap):
                            shutil.copytree(snap, pc)
                    runs["kenlm"].append(run_moses(moses, ini_k, src, os.path.join(work, f"{tag}.kenlm.nbest"),
                                                   args.threads, env))
                    runs["nlm"].append(run_moses(moses, ini_n, src, os.path.join(work, f"{tag}.nlm.nbest"),
                                                 args.threads, env))
                    runs["cache"].append(run_moses(moses, ini_c, src, nb, args.threads, env))
                    same = same and nbest_body(nb) == nbest_body(os.path.join(work, f"{tag}.nlm.nbest"))
                shutil.rmtree(snap, ignore_errors=True)
                rk, rn, rc = (fastest(runs[c]) for c in ("kenlm", "nlm", "cache"))
                cost_n = rn["cpu"] - rk["cpu"]
                cost_c = rc["cpu"] - rk["cpu"]
                lv = level_rates(rc["stats"])
                disk = du(pc)
                b = bleu(rc["output"].splitlines(), refs)
                row = {"iteration": it, "unchanged_weights": final, "kenlm_seconds": rk["cpu"],
                       "nlm_seconds": rn["cpu"], "nlm_cache_seconds": rc["cpu"],
                       "wall_seconds": {"kenlm": rk["wall"], "nlm": rn["wall"], "nlm_cache": rc["wall"]},
                       "translation_seconds": {"kenlm": rk["translation"], "nlm": rn["translation"],
                                               "nlm_cache": rc["translation"]},
                       "nlm_cost_seconds": cost_n, "nlm_cost_cache_seconds": cost_c,
                       "cost_ratio": cost_c / cost_n if cost_n > 0 else float("nan"),
                       "scorer_seconds": rn["scorer"], "scorer_cache_seconds": rc["scorer"],
                       "scorer_ratio": rc["scorer"] / rn["scorer"] if rn["scorer"] > 0 else float("nan"),
                       "cpu_seconds_each_repeat": {c: [r["cpu"] for r in v] for c, v in runs.items()},
                       "scorer_seconds_each_repeat": {c: [r["scorer"] for r in v] for c, v in runs.items()},
                       "levels": lv, "ngram_level_bound": 1 - lv["distinct_ngrams_on_disk"],
                       # the NLM cost left if every n-gram on disk cost nothing: the search's
                       # share (cost beyond the scorer's time) plus the scorer's time at the
                       # n-gram-level bound, over the cost without the cache
                       "decode_bound": decode_bound(cost_n, rn["scorer"], 1 - lv["distinct_ngrams_on_disk"]),
                       "disk_bytes": disk, "identical_nbest": same, "bleu": b, "stats": rc["stats"],
                       "notes": rc["notes"], "weights": format_weights(weights).splitlines()}
                rows.append(row)
                results["runs"][key] = rows
                if args.json:  # after every iteration: a long run leaves its figures behind
                    atomic_write_text(args.json, json.dumps(results, indent=2, default=str) + "\n")
                print(f"{('same' if final else str(it)):>4s} {rk['cpu']:8.2f} {rn['cpu']:7.2f} "
                      f"{rc['cpu']:8.2f} {cost_n:8.2f} {cost_c:8.2f} {row['cost_ratio']:6.2f} "
                      f"{rn['scorer']:7.2f} {rc['scorer']:8.2f} {row['scorer_ratio']:6.2f} "
                      f"{lv['ngram_lookups_from_disk']:6.3f} {lv['distinct_ngrams_on_disk']:6.3f} "
                      f"{lv['contexts_on_disk']:6.3f} {lv['class_pairs_on_disk']:6.3f} "
                      f"{row['ngram_level_bound']:6.3f} {disk / 1e6:8.1f} {('yes' if same else 'NO'):>4s} {b:6.2f}",
                      flush=True)
                for note in sorted(set(rc["notes"])):
                    print(f"     {note}")
                if final:
                    break
                pool.append(nb)
                if it < args.iterations:
                    weights = optimise(pool, ini_c, ref, os.path.join(work, f"{tag}.weights"), alg, args.seed, env)
            results["runs"][key] = rows
            later = [r for r in rows[1:args.iterations] if r["nlm_cost_seconds"] > 0]
            if later:
                tot_n = sum(r["nlm_cost_seconds"] for r in later)
                tot_c = sum(r["nlm_cost_cache_seconds"] for r in later)
                bound = sum(r["ngram_level_bound"] * r["nlm_cost_seconds"] for r in later) / tot_n
                dbound = sum(r["decode_bound"] * r["nlm_cost_seconds"] for r in later) / tot_n
                sc_n = sum(r["scorer_seconds"] for r in later)
                sc_c = sum(r["scorer_cache_seconds"] for r in later)
                results["runs"][key + "/summary"] = {
                    "iterations_2_to_n_ratio": tot_c / tot_n, "ngram_level_bound": bound,
                    "decode_bound": dbound, "unchanged_weights_decode_bound": rows[-1]["decode_bound"],
                    "scorer_iterations_2_to_n_ratio": sc_c / sc_n if sc_n else float("nan"),
                    "unchanged_weights_ratio": rows[-1]["cost_ratio"],
                    "unchanged_weights_scorer_ratio": rows[-1]["scorer_ratio"],
                    # what no cache can remove: the NLM's effect on the search (more hypotheses,
                    # less recombination), the NLM cost beyond the time inside the scorer
                    "search_share_of_nlm_cost": (tot_n - sc_n) / tot_n}
                print(f"   iterations 2-{args.iterations}: NLM cost {tot_n:.2f} s -> {tot_c:.2f} s with the cache "
                      f"({tot_c / tot_n:.2f}x); n-gram-level bound {bound:.2f}x, decode bound {dbound:.2f}x; "
                      f"unchanged weights {rows[-1]['cost_ratio']:.2f}x (decode bound "
                      f"{rows[-1]['decode_bound']:.2f}x)")
                print(f"   time inside the scorer, iterations 2-{args.iterations}: {sc_n:.2f} s -> {sc_c:.2f} s "
                      f"({sc_c / sc_n if sc_n else float('nan'):.2f}x); unchanged weights {rows[-1]['scorer_ratio']:.2f}x; "
                      f"the rest of the NLM cost ({(tot_n - sc_n) / tot_n:.0%}) is its effect on the search, "
                      "which no cache removes")
    if args.json:
        atomic_write_text(args.json, json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
