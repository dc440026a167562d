"""The ``nlmfeature`` command line: one subcommand per module.

Each module listed in :data:`COMMAND_MODULES` defines ``register(subparsers)``, which adds
its subparser(s) and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and
returning an exit status).  Adding a command means adding one module and one line here.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from .errors import NLMFeatureError

#: Modules (relative to the package) that contribute subcommands, in ``--help`` order.
COMMAND_MODULES: List[str] = [
    ".demo",
    ".commands.score",
    ".commands.info",
    ".commands.convert",
    ".commands.bench",
    ".commands.config",
    ".commands.cache",
    ".commands.cluster",
    ".commands.perplexity",
    ".commands.train",
    ".commands.querylog",
    ".prepare",
]


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="nlmfeature",
        description="Feed-forward neural language models for machine-translation decoders.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name, __package__).register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``nlmfeature`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except NLMFeatureError as exc:
        print(f"nlmfeature {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `nlmfeature score ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
