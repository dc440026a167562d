"""``nlmfeature tune``: the parsers and the work are :mod:`nlmfeature.mt.tuning.cli`'s (also the
``nlmfeature-tune`` alias)."""
from __future__ import annotations

import argparse

from nlmfeature.mt.tuning.cli import build_parser


def register(sub: argparse._SubParsersAction) -> None:
    build_parser(sub)
