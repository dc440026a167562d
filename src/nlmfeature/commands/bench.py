"""``nlmfeature bench``: benchmarks that print figures (query speed, training speed)."""
from __future__ import annotations

import argparse
import importlib

#: modules that add a ``bench`` sub-subcommand through ``register(bench_subparsers)``
BENCH_MODULES = ["..bench.query", "..bench.train", "..bench.mt", "..bench.memory", "..bench.scale",
                 "..bench.systems"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (query speed, training speed, memory against quality)",
                       description="Benchmarks on the shared real data; they print tables "
                                   "(or JSON with --json).")
    bench_sub = p.add_subparsers(dest="bench", metavar="BENCHMARK")
    bench_sub.required = True
    for name in BENCH_MODULES:
        try:
            mod = importlib.import_module(name, __package__)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.endswith(name.lstrip(".")):
                continue  # that benchmark is not part of this installation
            raise
        mod.register(bench_sub)
