"""``nlmfeature convert``: import NPLM text models; re-write models (tables, float16)."""
from __future__ import annotations

import argparse

from nlmfeature.core.architecture import drop_tables, precompute_tables
from nlmfeature.errors import NLMFeatureError
from nlmfeature.io.atomicfile import check_output
from nlmfeature.core.model import save
from nlmfeature.core.modelfile import read_model
from nlmfeature.training.nplm import read_nplm
from nlmfeature.io.textio import check_input, read_head


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="import an NPLM text model (identical scores) or re-write a "
                                                   "model (tables, float16)",
                       description="Convert INPUT to an nlmfeature model file OUTPUT (written atomically). "
                                   "NPLM text models (from trainNeuralNetwork) keep NPLM's scores exactly.")
    p.add_argument("input", nargs="?", help="source model (or -i)")
    p.add_argument("output", nargs="?", help="nlmfeature model file to write (or -o)")
    p.add_argument("-i", "--input", dest="input_flag", metavar="INPUT", help="source model")
    p.add_argument("-o", "--output", dest="output_flag", metavar="OUTPUT",
                   help="nlmfeature model file to write")
    p.add_argument("--from", dest="fmt", choices=["auto", "nplm", "nlm"], default="auto",
                   help="source format: nplm (text), nlm (nlmfeature), auto (detect; default)")
    p.add_argument("--no-tables", action="store_true",
                   help="do not store precomputed first-layer tables (smaller file, slower scoring)")
    p.add_argument("--float16", action="store_true",
                   help="store embeddings, output weights, direct-feature weights and tables as "
                        "float16: half the file, and half the memory of those arrays in a decoder "
                        "where the CPU has F16C (the scorer reads them as stored; tables, and all of "
                        "them without F16C, are widened to float32 at load).  Scores within "
                        "float16's rounding of the float32 model's")
    p.add_argument("--normalise", action="store_true",
                   help="NPLM import: use an exact softmax output instead of NPLM's unnormalised scores")
    p.set_defaults(func=run)


def _detect(path: str) -> str:
    check_input(path)                 # not a directory, FIFO or device
    head = read_head(path, 8)
    return "nplm" if head.startswith(b"\\config") else "nlm"


def run(args: argparse.Namespace) -> int:
    for name in ("input", "output"):
        given = [v for v in (getattr(args, name), getattr(args, f"{name}_flag")) if v]
        if len(given) != 1:
            raise NLMFeatureError(f"give the {name} model once: as {name.upper()} or with "
                                  f"-{name[0]}")
        setattr(args, name, given[0])
    check_output(args.output, "output model")
    fmt = _detect(args.input) if args.fmt == "auto" else args.fmt
    if fmt == "nplm":
        header, arrays = read_nplm(args.input, normalise=args.normalise, tables=False)
    else:
        header, arrays, _ = read_model(args.input)
        arrays = {k: v for k, v in arrays.items()}
    if args.no_tables:
        drop_tables(header, arrays)
    else:
        precompute_tables(header, arrays)
    checksum = save(args.output, header, arrays, half=args.float16)
    print(f"wrote {args.output} (checksum {checksum})")
    return 0
