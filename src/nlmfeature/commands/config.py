"""``nlmfeature config``: where the C library and header are (like ``python3-config``).

    cc $(nlmfeature config --cflags) decoder.c $(nlmfeature config --libs)

prints the flags in the order they are asked for, on one line.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict

from nlmfeature.errors import NLMFeatureError

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB_NAME = "libnlmfeature.so"


def paths() -> Dict[str, str]:
    """libdir, includedir, library and header paths of this installation."""
    libdir = os.path.join(PACKAGE_DIR, "lib")
    includedir = os.path.join(PACKAGE_DIR, "include")
    return {"libdir": libdir, "includedir": includedir,
            "library": os.path.join(libdir, LIB_NAME),
            "header": os.path.join(includedir, "nlmfeature.h")}


def values() -> Dict[str, str]:
    """What each flag prints."""
    p = paths()
    return {
        "libdir": p["libdir"],
        "includedir": p["includedir"],
        "cflags": f"-I{p['includedir']}",
        "libs": f"-L{p['libdir']} -lnlmfeature -Wl,-rpath,{p['libdir']}",
        "library": p["library"],
        "header": p["header"],
        "abi-version": "1",
    }


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config", help="print the C library's compiler and linker flags",
        description="Print where libnlmfeature.so and nlmfeature.h are installed, like python3-config. "
                    "Flags are printed in the order given, separated by spaces. Example: "
                    "cc $(nlmfeature config --cflags) my.c $(nlmfeature config --libs)")
    flags = [
        ("--libdir", "libdir", "directory holding libnlmfeature.so"),
        ("--includedir", "includedir", "directory holding nlmfeature.h"),
        ("--cflags", "cflags", "compiler flags (-I<includedir>)"),
        ("--libs", "libs", "linker flags (-L<libdir> -lnlmfeature -Wl,-rpath,<libdir>)"),
        ("--library", "library", "full path of libnlmfeature.so"),
        ("--header", "header", "full path of nlmfeature.h"),
        ("--abi-version", "abi-version", "the C interface version (NLM_ABI_VERSION)"),
    ]
    for flag, key, text in flags:
        p.add_argument(flag, dest="items", action="append_const", const=key, help=text)
    p.set_defaults(func=run, items=None)


def run(args: argparse.Namespace) -> int:
    if not args.items:
        print("nlmfeature config: give at least one of --libdir --includedir --cflags --libs "
              "--library --header --abi-version", file=sys.stderr)
        return 2
    p = paths()
    if not os.path.exists(p["library"]):
        raise NLMFeatureError(
            f"{p['library']} does not exist: the C library was not built; rebuild the package "
            "(pip install . or python setup.py build_ext --inplace)")
    v = values()
    print(" ".join(v[k] for k in args.items))
    return 0
