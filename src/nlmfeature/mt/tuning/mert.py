"""Minimum error rate training (Och 2003) over a k-best pool, as Moses' ``mert`` does it.

**Line search.**  Along the line ``w(x) = origin + x * direction`` each hypothesis' model score
is a line ``a + b*x`` (``a = f.origin``, ``b = f.direction``).  For every sentence the upper
envelope of its lines (sorted by slope, convex hull; :func:`nlmfeature._mert.envelope`) says
which hypothesis is the 1-best on which interval of x.  All sentences' breakpoints are merged
and swept from left to right, adding the BLEU-statistics difference of each change of 1-best,
so the corpus BLEU of every interval is known exactly; the best interval's midpoint is taken
(the first/last unbounded interval: 0.1 beyond its breakpoint; the origin itself when it lies
in a best interval, so that ties never move the weights).

**Search.**  Moses' default optimiser (``SimpleOptimizer``): from the current point, a line
search along every coordinate direction (plus ``random_directions`` random unit directions);
move to the best of these points; repeat until BLEU improves by no more than ``eps`` (Moses'
1e-4 on a 0..1 scale = 0.01 BLEU points).  This runs from every starting point: the given
initial weights (and any further given points, e.g. the previous iteration's best) and
``restarts`` random points drawn uniformly from ``random_range`` per dimension (Moses' default
range is [0, 1]).  The best final point is then refined by Moses' random-direction optimiser
(``polish``: line searches along random directions until that many in a row gain nothing;
0 turns it off and gives exactly Moses' procedure) and L1-normalised (scale does not change
the ranking).

BLEU is corpus BLEU of the re-ranked 1-best hypotheses from the cached statistics
(:func:`nlmfeature.mt.bleu.corpus_bleu`, equal to sacrebleu's).
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from nlmfeature import _mert
from nlmfeature.mt.bleu import corpus_bleu
from nlmfeature.mt.tuning.data import PoolArrays


@dataclass
class MertOptions:
    """Settings of :func:`optimise` (defaults as Moses' ``mert`` under ``mert-moses.pl``)."""

    restarts: int = 20                    #: random starting points besides the given ones
    random_directions: int = 0            #: random directions per round besides coordinates
    seed: int = 0                         #: seeds starting points and directions
    eps: float = 0.01                     #: stop when a round gains no more BLEU (0..100)
    random_range: Tuple[float, float] = (0.0, 1.0)  #: range of random starting weights
    max_rounds: int = 1000                #: safety cap on rounds per starting point
    jobs: int = 1                         #: worker processes for the starting points
    polish: int = 30                      #: random-direction refinement of the best point:
                                          #: stop after this many directions without gain


@dataclass
class StartResult:
    """Outcome of the search from one starting point."""

    start: np.ndarray
    point: np.ndarray
    bleu: float
    rounds: int
    line_searches: int


@dataclass
class MertResult:
    """Best point (L1-normalised), its BLEU and every start's outcome."""

    weights: np.ndarray
    bleu: float
    initial_bleu: float
    starts: List[StartResult] = field(default_factory=list)


def l1_normalise(w: np.ndarray) -> np.ndarray:
    """``w / sum(|w|)`` (``w`` itself when it is all zeros)."""
    norm = float(np.abs(w).sum())
    return w / norm if norm > 0 else w.copy()


class LineSearcher:
    """Exact line search and 1-best evaluation over one pool's arrays."""

    def __init__(self, arrays: PoolArrays) -> None:
        self.F = np.ascontiguousarray(arrays.features, dtype=np.float64)
        self.FT = np.ascontiguousarray(self.F.T)
        self.stats = np.ascontiguousarray(arrays.stats, dtype=np.int32)
        self.stats64 = self.stats.astype(np.int64)
        self.offsets = np.ascontiguousarray(arrays.offsets, dtype=np.int64)
        self.sentence = arrays.sentence_of_rows()
        self._coord_order: dict = {}
        # step beyond the last breakpoint when an unbounded interval is best (Moses: +0.1)
        self.left_step = 0.1
        self.right_step = 0.1

    @property
    def dim(self) -> int:
        return self.F.shape[1]

    def one_best(self, w: np.ndarray) -> np.ndarray:
        """Row of the model-best hypothesis of every sentence under weights ``w``."""
        return _mert.one_best(self.F, np.ascontiguousarray(w, dtype=np.float64), self.offsets)

    def bleu(self, w: np.ndarray) -> float:
        """Corpus BLEU (0..100) of the 1-best hypotheses under ``w``."""
        return float(corpus_bleu(self.stats64[self.one_best(w)].sum(axis=0)))

    def prepare(self) -> None:
        """Compute the per-sentence slope orders of all coordinate directions now (before
        worker processes fork, so that they share them)."""
        for d in range(self.dim):
            self._order(self.FT[d], d)

    def _order(self, slope: np.ndarray, coord: Optional[int]) -> np.ndarray:
        if coord is not None:
            order = self._coord_order.get(coord)
            if order is None:
                order = _mert.slope_order(np.ascontiguousarray(slope), self.offsets)
                self._coord_order[coord] = order
            return order
        return _mert.slope_order(np.ascontiguousarray(slope), self.offsets)

    def line_search(self, origin: np.ndarray, direction: np.ndarray,
                    intercepts: Optional[np.ndarray] = None, coord: Optional[int] = None
                    ) -> Tuple[float, float]:
        """Best step ``x`` along ``direction`` from ``origin`` and the BLEU there.

        ``intercepts`` (= ``F @ origin``) may be passed when several directions share an
        origin; ``coord`` marks ``direction`` as the unit vector of that coordinate (its sort
        order is then cached).
        """
        if intercepts is None:
            intercepts = _mert.matvec(self.F, np.ascontiguousarray(origin, dtype=np.float64))
        if coord is not None:
            slope = self.FT[coord]
            order = self._order(slope, coord)
            first, xs, old, new = _mert.envelope(slope, intercepts, self.offsets, order)
        else:
            slope = _mert.matvec(self.F, np.ascontiguousarray(direction, dtype=np.float64))
            first, xs, old, new = _mert.envelope_unsorted(slope, intercepts, self.offsets)
        base = self.stats64[first].sum(axis=0)
        if len(xs) == 0:
            return 0.0, float(corpus_bleu(base))
        by_x = np.argsort(xs, kind="stable")
        xs = xs[by_x]
        delta = self.stats64[new[by_x]] - self.stats64[old[by_x]]
        cum = np.cumsum(delta, axis=0)
        cum += base
        # Interval i (i = 0..B) lies between xs[i-1] and xs[i]; after equal breakpoints only
        # the last cumulative sum describes a non-empty interval.
        keep = np.ones(len(xs), dtype=bool)
        keep[:-1] = xs[1:] > xs[:-1]
        lefts = np.concatenate(([-np.inf], xs[keep]))
        all_stats = np.vstack((base[None, :], cum[keep]))
        rights = np.concatenate((xs[keep], [np.inf]))
        scores = corpus_bleu(all_stats)
        best = float(scores.max())
        winners = np.flatnonzero(scores >= best)
        # Prefer not to move: the origin's own interval when it is among the best.
        at_origin = winners[(lefts[winners] <= 0.0) & (rights[winners] >= 0.0)]
        if len(at_origin):
            return 0.0, best
        i = int(winners[0])
        lo, hi = lefts[i], rights[i]
        if np.isinf(lo):
            x = hi - self.left_step
        elif np.isinf(hi):
            x = lo + self.right_step
        else:
            x = 0.5 * (lo + hi)
        return float(x), best

    def polish(self, point: np.ndarray, patience: int, eps: float,
               rng: np.random.Generator) -> Tuple[np.ndarray, float, int]:
        """Moses' ``RandomDirectionOptimizer`` from ``point``: line searches along random unit
        directions, moving to each better point, until ``patience`` directions in a row gain
        no more than ``eps``.  Returns (point, BLEU, line searches)."""
        P = np.array(point, dtype=np.float64)
        score = self.bleu(P)
        quiet = searches = 0
        while quiet < patience:
            v = rng.standard_normal(self.dim)
            v /= np.linalg.norm(v)
            x, sc = self.line_search(P, v)
            searches += 1
            if sc > score and x != 0.0:
                Q = P + x * v
                new = self.bleu(Q)           # the true BLEU at the chosen point
                if new > score:
                    quiet = 0 if new - score > eps else quiet + 1
                    P, score = Q, new
                    continue
            quiet += 1
        return P, score, searches

    def optimise_from(self, start: np.ndarray, options: MertOptions, rng: np.random.Generator
                      ) -> StartResult:
        """Moses' ``SimpleOptimizer`` from ``start`` (see the module doc)."""
        P = np.array(start, dtype=np.float64)
        score = self.bleu(P)
        rounds = searches = 0
        D = self.dim
        while rounds < options.max_rounds:
            rounds += 1
            prev = score
            icpt = _mert.matvec(self.F, P)
            best_point, best_score = P, score
            directions: List[Tuple[Optional[int], np.ndarray]] = []
            for d in range(D):
                e = np.zeros(D)
                e[d] = 1.0
                directions.append((d, e))
            for _ in range(options.random_directions):
                v = rng.standard_normal(D)
                directions.append((None, v / np.linalg.norm(v)))
            for coord, direction in directions:
                x, sc = self.line_search(P, direction, icpt, coord)
                searches += 1
                if sc > best_score and x != 0.0:
                    best_score, best_point = sc, P + x * direction
            if best_point is not P:
                true = self.bleu(best_point)   # the true BLEU at the chosen point
                if true <= prev:               # (only rounding can make it lower): stop here
                    break
                P, score = best_point, true
            if score - prev <= options.eps:
                break
        return StartResult(np.array(start, dtype=np.float64), P, score, rounds, searches)


_WORKER: Optional[LineSearcher] = None


def _work(args) -> StartResult:
    start, options, seed = args
    assert _WORKER is not None
    return _WORKER.optimise_from(start, options, np.random.default_rng(seed))


def starting_points(initial: Sequence[np.ndarray], options: MertOptions, dim: int
                    ) -> List[np.ndarray]:
    """The given points followed by ``options.restarts`` seeded random points."""
    rng = np.random.default_rng(options.seed)
    lo, hi = options.random_range
    points: List[np.ndarray] = []
    for p in initial:       # drop repeated points (e.g. the previous best = the current weights)
        p = np.asarray(p, dtype=np.float64)
        if not any(np.array_equal(p, q) for q in points):
            points.append(p)
    points += [rng.uniform(lo, hi, size=dim) for _ in range(options.restarts)]
    return points


def optimise(arrays: PoolArrays, initial: Sequence[np.ndarray], options: MertOptions,
             progress: bool = False, log: Optional[Callable[[str], None]] = None) -> MertResult:
    """Run MERT from ``initial`` points (first = the current weights) plus random restarts."""
    global _WORKER
    searcher = LineSearcher(arrays)
    points = starting_points(initial, options, searcher.dim)
    initial_bleu = searcher.bleu(points[0])
    tasks = [(p, options, options.seed * 100003 + i + 1) for i, p in enumerate(points)]
    results: List[StartResult] = []
    bar = None
    if progress:
        from nlmfeature.io.progress import progress

        bar = progress(total=len(tasks), desc="MERT starts", unit="start", leave=False)
    jobs = max(1, min(options.jobs, len(tasks)))
    try:
        if jobs == 1:
            for t in tasks:
                results.append(searcher.optimise_from(t[0], t[1], np.random.default_rng(t[2])))
                if bar is not None:
                    bar.update(1)
        else:
            searcher.prepare()
            _WORKER = searcher
            ctx = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
                for r in ex.map(_work, tasks):
                    results.append(r)
                    if bar is not None:
                        bar.update(1)
    finally:
        _WORKER = None
        if bar is not None:
            bar.close()
    given = len(points) - options.restarts
    for i, r in enumerate(results):
        if log is not None:
            kind = "given" if i < given else "random"
            log(f"start {i} ({kind}): BLEU {r.bleu:.4f} after {r.rounds} rounds, "
                f"{r.line_searches} line searches")
    best = max(range(len(results)), key=lambda i: (results[i].bleu, -i))
    point, score = results[best].point, results[best].bleu
    if options.polish > 0:
        rng = np.random.default_rng(options.seed * 100003)
        polished, pscore, n = searcher.polish(point, options.polish, options.eps, rng)
        if log is not None:
            log(f"polish of start {best}: BLEU {score:.4f} -> {pscore:.4f} in {n} line searches")
        if pscore > score:
            point = polished
    w = l1_normalise(point)
    return MertResult(weights=w, bleu=searcher.bleu(w), initial_bleu=initial_bleu,
                      starts=results)
