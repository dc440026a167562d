"""``nlmfeature info``: describe a model file (architecture, sizes, checksum, vocabulary)."""
from __future__ import annotations

import argparse
import os
import sys

from nlmfeature.io.jsonout import dumps_json
from nlmfeature.core.model import load


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="describe a model file (architecture, sizes, checksum; "
                                   "--vocab lists the vocabulary)",
                       description="Print the architecture, sizes and checksum of a model; "
                                   "verifies the file's checksum.  memory_bytes is the memory a "
                                   "process that loads the model holds for it (huge-page copies of "
                                   "the rows, the packed direct weights), beside the Python runtime "
                                   "and the decoder's sessions; NLMFEATURE_HUGE_PAGES=0 reads the "
                                   "rows from the shared page cache instead.")
    p.add_argument("model", help="nlmfeature model file (.nlm)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--vocab", action="store_true", help="list the vocabulary (id<TAB>word) instead")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model = load(args.model)
    if args.vocab:
        for i, w in enumerate(model.vocab):
            sys.stdout.write(f"{i}\t{w}\n")
        return 0
    info = model.describe()
    info["file_bytes"] = os.path.getsize(args.model)
    # what a decoder process holds of it (beside the Python runtime and its sessions)
    info["memory_bytes"] = model.native.own_bytes
    if args.json:
        print(dumps_json(info, indent=2))
        return 0
    for key, value in info.items():
        if key == "metadata" and not value:
            continue
        print(f"{key:20s} {value}")
    return 0
