"""``nlmfeature cache``: inspect, prune or clear a persistent tuning cache directory."""
from __future__ import annotations

import argparse
import os

from nlmfeature.io.jsonout import dumps_json
from nlmfeature.commands.base import size_bytes
from nlmfeature.errors import NLMFeatureError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache", help="inspect, prune or clear a persistent tuning cache directory",
        description="A persistent cache directory (persistent-cache=DIR on a decoder feature line, "
                    "--persistent-cache DIR in the tools) holds one file of n-gram scores per "
                    "(model checksum, sentence id). This command summarises it (--stats, the "
                    "default), deletes least recently used files beyond a size (--prune), or "
                    "deletes its cache files (--clear). Only cache files are ever deleted.")
    p.add_argument("directory", help="the persistent cache directory")
    act = p.add_mutually_exclusive_group()
    act.add_argument("--stats", action="store_true",
                     help="print files, bytes and entries per model checksum (default action)")
    act.add_argument("--clear", action="store_true",
                     help="delete all cache files (or only those of --model)")
    act.add_argument("--prune", metavar="SIZE", type=size_bytes,
                     help="delete least recently used files until the directory is under 80%% of "
                          "SIZE, if it exceeds SIZE (e.g. 500M, 2G)")
    p.add_argument("--model", "-m", metavar="MODEL",
                   help="with --clear or --stats: only this model (a model file or its 16-hex-digit "
                        "checksum)")
    p.add_argument("--verify", action="store_true",
                   help="with --stats: read every file and check its checksum, listing bad files")
    p.add_argument("--json", action="store_true", help="with --stats: machine-readable output")
    p.set_defaults(func=run)


def _model_checksum(arg):
    if arg is None:
        return None
    if os.path.exists(arg):
        from nlmfeature.core.modelfile import file_checksum
        return file_checksum(arg)
    if len(arg) == 16 and all(c in "0123456789abcdef" for c in arg.lower()):
        return arg.lower()
    raise NLMFeatureError(f"--model {arg}: neither a model file nor a 16-hex-digit checksum")


def run(args: argparse.Namespace) -> int:
    from nlmfeature.decoder import pcache

    checksum = _model_checksum(args.model)
    if args.clear:
        if not os.path.isdir(args.directory):
            raise NLMFeatureError(f"{args.directory}: no such cache directory")
        n = pcache.clear(args.directory, checksum)
        print(f"deleted {n} cache files from {args.directory}")
        return 0
    if args.prune:
        left, n = pcache.prune(args.directory, int(args.prune))
        print(f"deleted {n} cache files; {left} bytes left in {args.directory}")
        return 0
    if not os.path.isdir(args.directory):
        raise NLMFeatureError(f"{args.directory}: no such cache directory")
    st = pcache.directory_stats(args.directory, verify=args.verify)
    if checksum:
        st.models = {k: v for k, v in st.models.items() if k == checksum}
    if args.json:
        print(dumps_json(st.as_dict(), indent=2))
        return 0
    print(f"directory        {st.directory}")
    print(f"files            {st.files}")
    print(f"bytes            {st.bytes}")
    print(f"entries          {st.entries}")
    if st.temporary_files:
        print(f"temporary files  {st.temporary_files} (left by interrupted writers; --prune or --clear removes them)")
    for cs, m in sorted(st.models.items()):
        print(f"model {cs}  files {m['files']}  bytes {m['bytes']}  entries {m['entries']}")
    for bad in st.invalid:
        print(f"invalid: {bad}")
    return 1 if st.invalid else 0
