"""Decoder-in-the-loop tuning, like Moses' ``mert-moses.pl``, resumable after interruption.

Iteration k (1, 2, ...) in the work directory:

1. ``runK.moses.ini`` (or ``runK.cdec.ini`` + ``runK.weights``): a copy of the config with the
   current weights, and ``persistent-cache=DIR`` on the NLM feature lines when asked (so later
   iterations reuse the n-gram scores cached by earlier ones);
2. the decoder translates the dev source into a k-best list, ``runK.kbest.gz`` (decoder
   output goes to a temporary file first, so a half-written list is never used);
3. the list is merged into the pool (``pool.npz``; features + BLEU statistics of every distinct
   hypothesis so far) and the dev BLEU of the decoder's 1-best is logged;
4. the optimiser (MERT, MIRA or PRO) runs on the whole pool from the current weights (MERT
   also from the best weights of earlier iterations, plus random restarts) and writes
   ``runK.weights.out``;
5. stop when no weight moved by ``min_change`` (1e-5, mert-moses.pl's test, on L1-normalised
   weights) or after ``max_iterations``; then the tuned config (``moses.ini`` / ``cdec.ini`` +
   ``weights.final``) is written with the final weights chosen by ``final_weights``:
   ``"last"`` (the last optimiser output, mert-moses.pl's default) or ``"best"`` (the weights
   whose decode gave the best dev BLEU, mert-moses.pl's ``--return-best-dev``).  Both are
   also written as ``weights.last.txt`` and ``weights.best.txt``.

``state.json`` is rewritten atomically after every step; rerunning the same command continues
where it stopped (a decode that was interrupted is redone).  ``log.tsv`` has one line per
iteration: dev BLEU, pool BLEU before/after optimising, pool size, times, weights.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

from nlmfeature.decoder.pcache import bound_report
from nlmfeature.io.atomicfile import (atomic_write_bytes, atomic_write_text, install, open_output,
                                      remove_stale, temp_prefix)
from nlmfeature.mt.bleu import DEFAULT_TOKENIZE, References, corpus_bleu
from nlmfeature.errors import DecoderError, InputError
from nlmfeature.mt.kbest import first_hypotheses, format_number
from nlmfeature.io.textio import iter_lines, open_binary, read_lines
from nlmfeature.mt.weights import read_weights, write_weights
from nlmfeature.mt.tuning import optimise_pool
from nlmfeature.mt import cdec, moses
from nlmfeature.mt.tuning.data import KbestPool

STATE_VERSION = 1
Weights = Dict[str, List[float]]
#: which weights a finished run keeps (``nlmfeature-tune --final-weights``): "last" or "best".
#: Measured with ``nlmfeature bench mt`` (README): over 4 Multi30k tunings the best decoded
#: weights scored 0.25 test BLEU below the last ones (2 better, 2 worse), so "last" stays.
FINAL_WEIGHTS = ("last", "best")
FINAL_WEIGHTS_DEFAULT = "last"


#: the stop reason of a tuning the iteration limit stopped (then the limit): a higher limit tunes on
LIMIT_REASON = "reached --max-iterations"


@dataclass
class DriverSettings:
    """Everything the driver needs; see ``nlmfeature-tune moses --help`` for the meanings."""

    decoder: str                      # "moses" or "cdec"
    binary: str
    config: str
    source: str
    refs: List[str]
    workdir: str
    weights: Optional[str] = None     # cdec: initial weights file
    nbest_size: int = 100
    distinct: bool = False
    max_iterations: int = 25
    algorithm: str = "mert"
    threads: int = 1
    persistent_cache: Optional[str] = None
    persistent_cache_max: Optional[str] = None  # its disk bound ("2G"), as the feature takes it
    nlm_features: Optional[List[str]] = None   # default: NLMFeature / libcdec_ff_nlm.so
    cache_key: str = "persistent-cache"
    tokenize: str = DEFAULT_TOKENIZE
    lowercase: bool = False
    min_change: float = 1e-5
    decoder_args: List[str] = field(default_factory=list)
    optimiser: dict = field(default_factory=dict)
    final_weights: str = FINAL_WEIGHTS_DEFAULT     # "last" or "best" (module doc)

    def identity(self) -> dict:
        """The settings that must not change when a run is resumed."""
        return dict(decoder=self.decoder, config=os.path.abspath(self.config),
                    source=os.path.abspath(self.source),
                    refs=[os.path.abspath(r) for r in self.refs], algorithm=self.algorithm,
                    tokenize=self.tokenize, lowercase=self.lowercase,
                    nbest_size=self.nbest_size)


@dataclass
class DriverState:
    """What ``state.json`` holds."""

    version: int
    identity: dict
    iteration: int                    # iteration being worked on (1-based)
    step: str                         # "start", "decoded", "pooled", "optimised", "done"
    weights: Weights                  # weights the current iteration decodes with
    best_starts: List[Weights] = field(default_factory=list)
    history: List[dict] = field(default_factory=list)
    stop_reason: str = ""

    @classmethod
    def load(cls, path: str) -> "DriverState":
        try:
            data = json.loads("\n".join(read_lines(path)))
        except ValueError as exc:
            raise InputError(path, 0, f"cannot read the tuning state ({exc}); delete the work "
                             "directory to start afresh") from None
        if data.get("version") != STATE_VERSION:
            raise InputError(path, 0, f"state version {data.get('version')}, expected "
                             f"{STATE_VERSION}; use a new work directory")
        return cls(**data)

    def save(self, path: str) -> None:
        atomic_write_text(path, json.dumps(asdict(self), indent=1, sort_keys=True) + "\n")


def tuned_vector(weights: Weights, labels: List[str]) -> np.ndarray:
    """The L1-normalised values of ``labels`` in ``weights`` (missing labels count as 0)."""
    vals = [v for l in labels for v in weights.get(l, [])]
    v = np.asarray(vals, dtype=np.float64)
    norm = np.abs(v).sum()
    return v / norm if norm > 0 else v


def weights_converged(old: Weights, new: Weights, labels: List[str], tol: float = 1e-5) -> bool:
    """True when no tuned weight (L1-normalised) changed by ``tol`` or more."""
    a, b = tuned_vector(old, labels), tuned_vector(new, labels)
    if a.shape != b.shape:
        return False
    return bool(np.all(np.abs(a - b) < tol))


def decoded_weights(state: "DriverState", initial: Weights) -> List[Weights]:
    """The weights each logged iteration decoded with: the initial ones for iteration 1, the
    previous iteration's optimiser output after that."""
    out: List[Weights] = []
    prev = initial
    for h in sorted(state.history, key=lambda h: h["iteration"]):
        out.append(prev)
        prev = h.get("weights", prev)
    return out


def best_decoded(state: "DriverState", initial: Weights) -> tuple:
    """(iteration, dev BLEU, weights) of the iteration whose decode scored the best dev BLEU
    (the earliest of equals)."""
    hist = sorted(state.history, key=lambda h: h["iteration"])
    used = decoded_weights(state, initial)
    best = max(range(len(hist)), key=lambda i: (hist[i].get("dev_bleu", -1.0), -i))
    return hist[best]["iteration"], float(hist[best].get("dev_bleu", float("nan"))), used[best]


class Driver:
    """Runs (or resumes) a tuning job; see the module doc."""

    def __init__(self, settings: DriverSettings, log: Callable[[str], None] = print,
                 progress: bool = False) -> None:
        self.s = settings
        self.log = log
        self.progress = progress
        self.dir = os.path.abspath(settings.workdir)
        os.makedirs(self.dir, exist_ok=True)
        self.state_path = os.path.join(self.dir, "state.json")
        self.pool_path = os.path.join(self.dir, "pool.npz")
        self.refs = References.from_files(settings.refs, tokenize=settings.tokenize,
                                          lowercase=settings.lowercase)
        self._pool: Optional[KbestPool] = None

    # -- paths --------------------------------------------------------------------------
    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def kbest_path(self, k: int) -> str:
        return self.path(f"run{k}.kbest.gz")

    # -- state --------------------------------------------------------------------------
    def initial_state(self) -> DriverState:
        src = self.s.weights if self.s.decoder == "cdec" else self.s.config
        if src is None:
            raise InputError(self.s.config, 0, "cdec tuning needs --weights (initial weights)")
        return DriverState(STATE_VERSION, self.s.identity(), 1, "start", read_weights(src))

    def load_state(self) -> DriverState:
        if not os.path.exists(self.state_path):
            state = self.initial_state()
            state.save(self.state_path)
            return state
        state = DriverState.load(self.state_path)
        if state.identity != self.s.identity():
            changed = [k for k in state.identity if state.identity[k] != self.s.identity().get(k)]
            raise InputError(self.state_path, 0, f"this work directory was started with other "
                             f"settings ({', '.join(changed)} differ); use the original options "
                             "or a new --workdir")
        return state

    def pool(self) -> KbestPool:
        if self._pool is None:
            if os.path.exists(self.pool_path):
                self._pool = KbestPool.load(self.pool_path, self.refs)
            else:
                self._pool = KbestPool(self.refs)
        return self._pool

    # -- steps --------------------------------------------------------------------------
    def write_config(self, k: int, weights: Weights, kbest_file: str) -> List[str]:
        """Write iteration ``k``'s config (and weights); returns the decoder command.

        Moses writes its k-best list to ``kbest_file``; cdec writes it to standard output.
        """
        opts = {}
        if self.s.persistent_cache:
            os.makedirs(self.s.persistent_cache, exist_ok=True)
            names = self.s.nlm_features or (["NLMFeature"] if self.s.decoder == "moses"
                                            else ["libcdec_ff_nlm.so"])
            opts = {name: {self.s.cache_key: os.path.abspath(self.s.persistent_cache)}
                    for name in names}
            if self.s.persistent_cache_max:
                for o in opts.values():
                    o[self.s.cache_key + "-max"] = self.s.persistent_cache_max
        if self.s.decoder == "moses":
            ini = self.path(f"run{k}.moses.ini")
            moses.rewrite_moses_ini(self.s.config, ini, weights, opts)
            cmd = moses.command(self.s.binary, ini, os.path.abspath(self.s.source),
                                self.s.threads, kbest_file, self.s.nbest_size, self.s.distinct)
        else:
            ini = self.path(f"run{k}.cdec.ini")
            wfile = self.path(f"run{k}.weights")
            cdec.rewrite_cdec_ini(self.s.config, ini, opts)
            cdec.write_cdec_weights(wfile, weights)
            cmd = cdec.command(self.s.binary, ini, wfile, os.path.abspath(self.s.source),
                               self.s.nbest_size, self.s.distinct)
        return cmd + list(self.s.decoder_args)

    def decode(self, k: int, weights: Weights) -> float:
        """Run the decoder for iteration ``k``; returns the seconds it took."""
        out = self.kbest_path(k)
        for name in os.listdir(self.dir):     # leftovers of a decode that was interrupted
            if name.startswith((f".run{k}.kbest.", f".run{k}.out.")):
                os.unlink(os.path.join(self.dir, name))
        remove_stale(self.path(f"run{k}.kbest"))
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(self.path(f"run{k}.kbest")), dir=self.dir)
        os.close(fd)
        remove_stale(self.path(f"run{k}.out"))
        fd, stdout_tmp = tempfile.mkstemp(prefix=temp_prefix(self.path(f"run{k}.out")), dir=self.dir)
        os.close(fd)
        cmd = self.write_config(k, weights, tmp)
        err_path = self.path(f"run{k}.decoder.log")
        self.log(f"iteration {k}: decoding: {' '.join(cmd)}")
        t0 = time.time()
        try:
            with open(stdout_tmp, "wb") as raw, open(err_path, "wb") as err:
                # run where the original config is, so that its relative paths still work
                proc = subprocess.run(cmd, stdout=raw, stderr=err,
                                      cwd=os.path.dirname(os.path.abspath(self.s.config)))
            if proc.returncode != 0:
                raise DecoderError(f"{cmd[0]} exited with status {proc.returncode}; see "
                                   f"{err_path}")
            listing = tmp if self.s.decoder == "moses" else stdout_tmp
            n = 0
            with open_output(out) as dst:
                for _, line in iter_lines(listing):
                    if "|||" in line:      # cdec also prints other lines on stdout
                        dst.write(line + "\n")
                        n += 1
            if n == 0:
                os.unlink(out)
                raise DecoderError(f"{cmd[0]} produced no k-best lines; see {err_path}")
            if self.s.decoder == "moses":
                install(stdout_tmp, self.path(f"run{k}.out"))
            if self.s.persistent_cache:
                note = bound_report(self.s.persistent_cache, len(self.refs), err_path)
                if note:
                    self.log(f"iteration {k}: {note}")
        finally:
            for t in (tmp, stdout_tmp):
                if os.path.exists(t):
                    os.unlink(t)
        return time.time() - t0

    def absorb(self, k: int) -> dict:
        """Merge iteration ``k``'s list into the pool; returns the log fields of that step."""
        path = self.kbest_path(k)
        pool = self.pool()
        if os.path.abspath(path) not in pool.sources:
            read, new = pool.add_file(path, progress=self.progress)
            pool.save(self.pool_path)
        else:
            read, new = -1, -1
        hyps = first_hypotheses(path, len(self.refs))
        dev = float(corpus_bleu(self.refs.corpus_stats(hyps).sum(axis=0)))
        return dict(dev_bleu=dev, read=read, new=new, pool_size=pool.num_hypotheses)

    def optimise(self, state: DriverState) -> Weights:
        """Optimise on the pool from the current weights; returns the new weights."""
        pool = self.pool()
        pool.check_complete()
        is_cdec = self.s.decoder == "cdec"
        init = pool.weight_vector(state.weights, self.state_path, missing_ok=is_cdec)
        starts = [pool.weight_vector(w, self.state_path, missing_ok=is_cdec)
                  for w in state.best_starts]
        settings = dict(self.s.optimiser)
        # a different, reproducible seed per iteration (mert-moses.pl uses run * 1000)
        settings["seed"] = int(settings.get("seed") or 0) + 1000 * state.iteration
        res = optimise_pool(pool.arrays(), self.s.algorithm, init, starts, settings,
                            progress=self.progress)
        self._last = res
        return pool.weights_dict(res.weights, state.weights)

    def write_final(self, weights: Weights) -> str:
        """Write the tuned config; returns its path."""
        if self.s.decoder == "moses":
            final = self.path("moses.ini")
            moses.rewrite_moses_ini(self.s.config, final, weights)
        else:
            final = self.path("cdec.ini")
            with open_binary(self.s.config) as src:
                atomic_write_bytes(final, src.read())
            cdec.write_cdec_weights(self.path("weights.final"), weights)
        write_weights(self.path("weights.final.txt"), weights)
        return final

    def append_log(self, entry: dict) -> None:
        header = ("iteration\tdev_bleu\tpool_bleu_before\tpool_bleu_after\tpool_size\t"
                  "decode_seconds\toptimise_seconds\tfinished\tweights\n")
        path = self.path("log.tsv")
        rows = []
        if os.path.exists(path):
            rows = [l for l in read_lines(path)[1:]
                    if l and not l.startswith(f"{entry['iteration']}\t")]
        w = " ".join(f"{l}= {' '.join(format_number(v) for v in vals)}"
                     for l, vals in entry["weights"].items())
        rows.append("\t".join([str(entry["iteration"]), f"{entry['dev_bleu']:.4f}",
                               f"{entry['pool_bleu_before']:.4f}",
                               f"{entry['pool_bleu_after']:.4f}", str(entry["pool_size"]),
                               f"{entry['decode_seconds']:.1f}",
                               f"{entry['optimise_seconds']:.1f}", entry["finished"], w]))
        atomic_write_text(path, header + "\n".join(rows) + "\n")

    # -- main loop ----------------------------------------------------------------------
    def run(self) -> DriverState:
        """Run or resume until convergence or ``max_iterations``; returns the final state."""
        state = self.load_state()
        if (state.step == "done" and state.stop_reason.startswith(LIMIT_REASON)
                and state.iteration < self.s.max_iterations):
            # stopped by the iteration limit, not converged: a higher limit tunes on from the
            # last optimiser output, with the pool of every iteration so far
            self.log(f"continuing from iteration {state.iteration} (stopped by its --max-iterations) "
                     f"up to {self.s.max_iterations}")
            state.iteration += 1
            state.step, state.stop_reason = "start", ""
            state.save(self.state_path)
        if state.step == "done":
            self.log(f"already finished ({state.stop_reason}); tuned config in {self.dir}")
            return state
        while True:
            k = state.iteration
            if state.step == "start":
                if os.path.exists(self.kbest_path(k)):
                    self.log(f"iteration {k}: reusing {self.kbest_path(k)}")
                    seconds = 0.0
                else:
                    seconds = self.decode(k, state.weights)
                state.step = "decoded"
                state.history = [h for h in state.history if h["iteration"] != k]
                state.history.append(dict(iteration=k, decode_seconds=seconds))
                state.save(self.state_path)
            if state.step == "decoded":
                info = self.absorb(k)
                state.history[-1].update(info)
                state.step = "pooled"
                state.save(self.state_path)
                self.log(f"iteration {k}: dev BLEU {info['dev_bleu']:.2f} (decoder 1-best); "
                         f"pool {info['pool_size']} hypotheses")
            if state.step == "pooled":
                t0 = time.time()
                new = self.optimise(state)
                res = self._last
                write_weights(self.path(f"run{k}.weights.out"), new)
                entry = state.history[-1]
                entry.update(pool_bleu_before=res.initial_bleu, pool_bleu_after=res.bleu,
                             optimise_seconds=time.time() - t0, weights=new,
                             finished=time.strftime("%Y-%m-%d %H:%M:%S"))
                entry.setdefault("decode_seconds", 0.0)
                self.append_log(entry)
                labels = [l for l, _ in self.pool().labels]
                converged = weights_converged(state.weights, new, labels, self.s.min_change)
                self.log(f"iteration {k}: {self.s.algorithm} pool BLEU "
                         f"{res.initial_bleu:.2f} -> {res.bleu:.2f} in "
                         f"{entry['optimise_seconds']:.1f}s")
                state.best_starts = (state.best_starts + [new])[-3:]
                state.weights = new
                if converged:
                    state.stop_reason = (f"no weight changed by {self.s.min_change} after "
                                         f"iteration {k}")
                elif k >= self.s.max_iterations:
                    state.stop_reason = f"{LIMIT_REASON} {self.s.max_iterations}"
                if state.stop_reason:
                    state.step = "optimised"
                else:
                    state.iteration = k + 1
                    state.step = "start"
                state.save(self.state_path)
            if state.step == "optimised":
                it, dev, best = best_decoded(state, self.initial_state().weights)
                write_weights(self.path("weights.last.txt"), state.weights)
                write_weights(self.path("weights.best.txt"), best)
                chosen = state.weights if self.s.final_weights == "last" else best
                final = self.write_final(chosen)
                state.step = "done"
                state.save(self.state_path)
                which = ("the last optimiser output" if self.s.final_weights == "last" else
                         f"the best decoded weights (iteration {it}, dev BLEU {dev:.2f})")
                self.log(f"done: {state.stop_reason}; tuned config {final} with {which}")
                return state
