"""``nlmfeature eval``: the parser and the work are :mod:`nlmfeature.evaluate`'s (also the
``nlmfeature-eval`` alias)."""
from __future__ import annotations

import argparse

from ..evaluate import build_parser


def register(sub: argparse._SubParsersAction) -> None:
    build_parser(sub)
