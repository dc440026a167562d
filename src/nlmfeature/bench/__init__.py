"""Benchmarks that print figures (`nlmfeature bench ...`)."""
from __future__ import annotations

import os

#: the source checkout (``src/nlmfeature/bench`` -> the repository root)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def shared_data(*parts: str) -> str:
    """A path in the shared data folder the benchmarks default to: ``$NLMFEATURE_SHARED``
    (the folder holding ``data/``) when set, else ``../shared`` beside the source checkout,
    else ``../shared`` beside the current directory (an installed package run from a
    checkout).  The path is returned even when it does not exist (the benchmark's file
    check then names it and the flag that replaces it)."""
    roots = [os.environ.get("NLMFEATURE_SHARED", ""), os.path.join(REPO, "..", "shared"),
             os.path.join(os.getcwd(), "..", "shared")]
    roots = [os.path.normpath(r) for r in roots if r]
    for root in roots:
        if os.path.isdir(os.path.join(root, "data")):
            return os.path.join(root, "data", *parts)
    return os.path.join(roots[0], "data", *parts)
