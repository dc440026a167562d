"""Tuning of decoder feature weights on k-best lists: MERT, batch MIRA and PRO.

- :mod:`.data`: the k-best pool (features + BLEU statistics per hypothesis, merged across
  iterations, saved as .npz);
- :mod:`.mert`, :mod:`.mira`, :mod:`.pro`: the optimisers;
- :mod:`.driver`: the decoder-in-the-loop driver (Moses, cdec), resumable; it writes the
  decoders' configs with :mod:`nlmfeature.mt.moses` and :mod:`nlmfeature.mt.cdec`;
- :mod:`.cli`: the ``nlmfeature-tune`` command.

:func:`optimise_pool` runs one optimiser by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np

from nlmfeature.mt.tuning.data import PoolArrays

ALGORITHMS = ("mert", "mira", "pro")


@dataclass
class TuneResult:
    """Weights found (L1-normalised), BLEU (0..100) of the re-ranked pool before and after."""

    algorithm: str
    weights: np.ndarray
    bleu: float
    initial_bleu: float
    detail: object


def optimise_pool(arrays: PoolArrays, algorithm: str, initial: np.ndarray,
                  extra_starts: Sequence[np.ndarray] = (), settings: Optional[dict] = None,
                  progress: bool = False, log: Optional[Callable[[str], None]] = None
                  ) -> TuneResult:
    """Run ``algorithm`` (mert, mira or pro) from ``initial`` weights over ``arrays``.

    ``settings`` are fields of :class:`.mert.MertOptions`, :class:`.mira.MiraOptions` or
    :class:`.pro.ProOptions` (unknown keys are ignored, so one dict can serve all three).
    """
    settings = dict(settings or {})
    if algorithm == "mert":
        from nlmfeature.mt.tuning import mert

        opts = mert.MertOptions(**_pick(mert.MertOptions, settings))
        res = mert.optimise(arrays, [initial, *extra_starts], opts, progress, log)
        return TuneResult("mert", res.weights, res.bleu, res.initial_bleu, res)
    if algorithm == "mira":
        from nlmfeature.mt.tuning import mira

        opts = mira.MiraOptions(**_pick(mira.MiraOptions, settings))
        res = mira.optimise(arrays, initial, opts, progress, log)
        return TuneResult("mira", res.weights, res.bleu, res.initial_bleu, res)
    if algorithm == "pro":
        from nlmfeature.mt.tuning import pro

        opts = pro.ProOptions(**_pick(pro.ProOptions, settings))
        res = pro.optimise(arrays, initial, opts, progress, log)
        return TuneResult("pro", res.weights, res.bleu, res.initial_bleu, res)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")


def _pick(cls, settings: dict) -> dict:
    names = set(cls.__dataclass_fields__)
    return {k: v for k, v in settings.items() if k in names and v is not None}


__all__: List[str] = ["ALGORITHMS", "TuneResult", "optimise_pool"]
