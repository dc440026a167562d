"""``nlmfeature eval``: the parser and the work are :mod:`nlmfeature.mt.evaluate`'s (also the
``nlmfeature-eval`` alias)."""
from __future__ import annotations

import argparse

from nlmfeature.mt.evaluate import build_parser


def register(sub: argparse._SubParsersAction) -> None:
    build_parser(sub)
