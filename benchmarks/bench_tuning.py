#!/usr/bin/env python3
"""Benchmark nlmfeature's tuners (MERT, MIRA, PRO) against Moses' ``mert`` and ``kbmira``.

On the real Multi30k de-en dev 100-best lists (``../shared/data/nbest/moses-multi30k-de-en``)
it optimises over the pool of iterations 1..N (default: iteration 1 alone, then 1-4), starting
from the weights iteration N was decoded with, and prints for every optimiser the dev BLEU of
the re-ranked 1-best before and after (computed by sacrebleu on the chosen hypotheses, not by
our own statistics) and the run time.

If a Moses build is found (``--moses-root`` or ``$MOSES_ROOT``; the
tools are looked up in ``bin/`` and in the ``mert/bin/...`` build directory), the same lists go
through Moses' ``extractor`` (BLEU, case-sensitive, closest reference length) and then ``mert``
(``-n 20``, as mert-moses.pl) and ``kbmira``; their weights are scored the same way and shown
side by side.

Example::

    python benchmarks/bench_tuning.py --jobs 2 --seeds 1 2 3
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import numpy as np
import sacrebleu

from nlmfeature.bench import shared_data

from nlmfeature.io.atomicfile import open_output
from nlmfeature.mt.bleu import References
from nlmfeature.mt.moses import find_program
from nlmfeature.io.textio import read_lines
from nlmfeature.mt.tuning import optimise_pool
from nlmfeature.mt.tuning.data import KbestPool
from nlmfeature.mt.tuning.mert import LineSearcher, l1_normalise
from nlmfeature.mt.weights import read_weights

DATA = shared_data("nbest", "moses-multi30k-de-en")


def find_moses_tool(root: Optional[str], name: str) -> Optional[str]:
    """Path of a Moses tuning tool (``mert``, ``kbmira``, ``extractor``) or None: in ``root``,
    or $MOSES_ROOT (``nlmfeature.mt.moses.find_program``)."""
    for r in (root, os.environ.get("MOSES_ROOT")):
        found = find_program(name, r) if r else None
        if found:
            return found
    return None


def dev_bleu(pool: KbestPool, searcher: LineSearcher, refs: List[str], w: np.ndarray) -> float:
    """sacrebleu corpus BLEU (tokenize none) of the 1-best texts under ``w``."""
    texts = pool.texts(searcher.one_best(w))
    return sacrebleu.corpus_bleu(texts, [refs], tokenize="none", force=True).score


def run(cmd: List[str], cwd: str, log: str) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.run(cmd, cwd=cwd, stdout=err, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed; see {log}")
    return time.perf_counter() - t0


def moses_side(iters: List[int], init: np.ndarray, work: str, tools: Dict[str, str],
               seeds: List[int], jobs: int, dim: int, extracted: Dict[int, float]):
    """Run Moses' extractor (once per list), mert and kbmira; yields result rows."""
    ref = os.path.join(work, "dev.ref")
    if not os.path.exists(ref):
        with open_output(ref) as out:
            out.write("".join(l + "\n" for l in read_lines(os.path.join(DATA, "dev.ref.en.gz"))))
    for i in iters:
        if i not in extracted:
            extracted[i] = run([tools["extractor"], "--sctype", "BLEU", "--scconfig", "case:true",
                                "--scfile", f"run{i}.scores.dat", "--ffile", f"run{i}.features.dat",
                                "-r", ref, "-n", os.path.join(DATA, f"dev.iter{i}.100best.gz")],
                               work, os.path.join(work, f"extract{i}.log"))
    extract_time = sum(extracted[i] for i in iters)
    ffiles = [f"run{i}.features.dat" for i in iters]
    sfiles = [f"run{i}.scores.dat" for i in iters]
    init_line = " ".join(repr(float(v)) for v in init)
    with open(os.path.join(work, "init.opt"), "w") as f:
        f.write(init_line + "\n" + " ".join(["0"] * dim) + "\n" + " ".join(["1"] * dim) + "\n")
    with open(os.path.join(work, "dense.init"), "w") as f:
        f.write(init_line + "\n")
    for seed in seeds:
        log = os.path.join(work, f"mert.{seed}.log")
        secs = run([tools["mert"], "-d", str(dim), "-n", "20", "-r", str(seed), "--ifile",
                    "init.opt", "--scfile", ",".join(sfiles), "--ffile", ",".join(ffiles),
                    "--sctype", "BLEU", "--scconfig", "case:true", "--threads", str(jobs)],
                   work, log)
        text = open(log).read()
        m = re.search(r"Best point:\s*(.*?)\s*=>\s*(\S+)", text)
        w = np.array([float(x) for x in m.group(1).split()])
        yield "Moses mert", seed, w, secs, f"(+{extract_time:.1f}s extractor)"
    for seed in seeds:
        out = os.path.join(work, f"kbmira.{seed}.out")
        args = [tools["kbmira"], "--dense-init", "dense.init", "-r", str(seed), "-o", out]
        for ff, sf in zip(ffiles, sfiles):
            args += ["--ffile", ff, "--scfile", sf]
        secs = run(args, work, os.path.join(work, f"kbmira.{seed}.log"))
        vals = {}
        for line in open(out):
            name, value = line.split()
            vals[int(name[1:])] = float(value)
        w = l1_normalise(np.array([vals[i] for i in range(dim)]))
        yield "Moses kbmira", seed, w, secs, f"(+{extract_time:.1f}s extractor)"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pools", nargs="+", default=["1", "1-4"],
                    help="pools to optimise over: 'N' (iteration N) or 'A-B' (default: 1 1-4)")
    ap.add_argument("--algorithms", nargs="+", default=["mert", "mira", "pro"],
                    help="our optimisers to run (default: mert mira pro)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1],
                    help="random seeds; every optimiser runs once per seed (default: 1)")
    ap.add_argument("--jobs", type=int, default=2,
                    help="processes for our MERT's restarts and threads for Moses mert")
    ap.add_argument("--moses-root", help="Moses checkout/build (default: $MOSES_ROOT)")
    ap.add_argument("--no-moses", action="store_true", help="skip Moses' tools")
    ap.add_argument("--workdir", help="directory for Moses' files (default: a temporary one)")
    args = ap.parse_args(argv)

    ref_lines = read_lines(os.path.join(DATA, "dev.ref.en.gz"))
    refs = References([ref_lines])
    tools = {}
    if not args.no_moses:
        for name in ("extractor", "mert", "kbmira"):
            path = find_moses_tool(args.moses_root, name)
            if path:
                tools[name] = path
        if len(tools) < 3:
            print(f"Moses tools not found (have {sorted(tools)}); running ours only")
            tools = {}
    work = args.workdir or tempfile.mkdtemp(prefix="bench_tuning.")
    os.makedirs(work, exist_ok=True)
    extracted: Dict[int, float] = {}

    for spec in args.pools:
        a, _, b = spec.partition("-")
        iters = list(range(int(a), int(b or a) + 1))
        t0 = time.perf_counter()
        pool = KbestPool(refs)
        pool.add_files([os.path.join(DATA, f"dev.iter{i}.100best.gz") for i in iters],
                       jobs=args.jobs)
        read_secs = time.perf_counter() - t0
        init_ini = os.path.join(DATA, f"dev.iter{iters[-1]}.moses.ini")
        init = pool.weight_vector(read_weights(init_ini), init_ini)
        A = pool.arrays()
        searcher = LineSearcher(A)
        before = dev_bleu(pool, searcher, ref_lines, init)
        print(f"\n== pool of iteration(s) {spec}: {pool.num_hypotheses} distinct hypotheses, "
              f"{pool.num_sentences} sentences, {pool.dim} features; read + BLEU statistics "
              f"{read_secs:.1f}s")
        print(f"   start: weights of {os.path.basename(init_ini)}; dev BLEU (sacrebleu, "
              f"re-ranked 1-best) {before:.2f}")
        print(f"   {'optimiser':<14}{'seed':>5}{'BLEU before':>13}{'BLEU after':>12}{'seconds':>10}")
        rows: Dict[str, List[tuple]] = {}
        for alg in args.algorithms:
            for seed in args.seeds:
                t0 = time.perf_counter()
                res = optimise_pool(A, alg, init, settings=dict(seed=seed, jobs=args.jobs))
                secs = time.perf_counter() - t0
                after = dev_bleu(pool, searcher, ref_lines, res.weights)
                assert abs(after - res.bleu) < 1e-6, (after, res.bleu)
                rows.setdefault("ours " + alg, []).append((after, secs))
                print(f"   {'ours ' + alg:<14}{seed:>5}{before:>13.2f}{after:>12.2f}{secs:>10.1f}",
                      flush=True)
        if tools:
            for name, seed, w, secs, note in moses_side(iters, init, work, tools, args.seeds,
                                                        args.jobs, pool.dim, extracted):
                after = dev_bleu(pool, searcher, ref_lines, w)
                rows.setdefault(name, []).append((after, secs))
                print(f"   {name:<14}{seed:>5}{before:>13.2f}{after:>12.2f}{secs:>10.1f} {note}",
                      flush=True)
        print(f"   mean over seeds {args.seeds}:")
        for name, vals in rows.items():
            b = np.array([v[0] for v in vals])
            t = np.array([v[1] for v in vals])
            print(f"   {name:<14} BLEU {b.mean():.2f} (min {b.min():.2f}, max {b.max():.2f}), "
                  f"{t.mean():.1f}s")
    print(f"\nMoses work files in {work}" if tools else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
