"""The ``nlmfeature`` command line: one subcommand per module, one error handler.

Each module listed in :data:`COMMAND_MODULES` defines ``register(subparsers)``, which adds
its subparser(s) and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and
returning an exit status).  Adding a command means adding one module and one line here.

``nlmfeature-rescore``, ``nlmfeature-tune`` and ``nlmfeature-eval`` are aliases of
``nlmfeature rescore|tune|eval``: the same parser-building function of each module builds
both, and both go through :func:`run`, the one error handler:

* exit 0 on success, 1 when a command reports a negative finding (e.g. ``cache --verify``
  found bad files), 2 for a user error (bad option, bad or missing input, as argparse does),
  130 on Ctrl-C or SIGTERM;
* a user error is one line ``PROG: error: MESSAGE`` on standard error (the message names the
  file, and the line when there is one), never a traceback;
* a closed standard output (``nlmfeature score ... | head``) ends the command quietly.

Conventions every command follows (``tests/test_cli.py`` checks them on the parsers):
``-m`` is always an *input* model, ``-o`` always an output path, ``-q/--quiet`` turns off
progress and informational messages, and ``--help`` explains every flag.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from typing import Iterator, List, Optional, Tuple

from nlmfeature.errors import NLMFeatureError

#: Modules (relative to the package) that contribute subcommands, in ``--help`` order.
COMMAND_MODULES: List[str] = [
    ".commands.demo",
    ".commands.score",
    ".commands.info",
    ".commands.convert",
    ".commands.ensemble",
    ".commands.bench",
    ".commands.config",
    ".commands.cache",
    ".commands.cluster",
    ".commands.corpus",
    ".commands.perplexity",
    ".commands.train",
    ".commands.querylog",
    ".commands.rescore",
    ".commands.eval",
    ".commands.tune",
    ".mt.prepare",
]

#: the help of the ``-q`` flag added to commands that do not define their own
QUIET_HELP = "no progress or informational messages on standard error"

#: exit statuses
EXIT_OK, EXIT_NEGATIVE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="nlmfeature",
        description="Feed-forward neural language models for machine-translation decoders. "
                    "Every command explains its flags with --help.",
        epilog="nlmfeature-rescore, nlmfeature-tune and nlmfeature-eval are aliases of "
               "'nlmfeature rescore', 'nlmfeature tune' and 'nlmfeature eval'.")
    add_version(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name, __package__).register(sub)
    return finish(parser)


def add_version(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give ``parser`` a ``--version`` flag (the package version); returns ``parser``."""
    from nlmfeature import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    return parser


def subparsers(parser: argparse.ArgumentParser) -> Iterator[Tuple[List[str], str, argparse.ArgumentParser]]:
    """(command path, help, parser) of every subcommand below ``parser``, depth first, each
    once (aliases such as ``optimize`` are skipped)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                name = choice.dest
                sp = action.choices[name]
                yield [name], choice.help or "", sp
                for path, text, deeper in subparsers(sp):
                    yield [name] + path, text, deeper


def leaves(parser: argparse.ArgumentParser) -> Iterator[Tuple[List[str], str, argparse.ArgumentParser]]:
    """The subcommands of :func:`subparsers` that run something (have no subcommands)."""
    for path, text, sp in subparsers(parser):
        if not any(isinstance(a, argparse._SubParsersAction) for a in sp._actions):
            yield path, text, sp


def finish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every runnable (sub)parser the shared conventions: ``-q/--quiet`` when it has no
    quiet flag of its own, and its program name for error messages.  Returns ``parser``."""
    runnable = [([], parser)] if not any(isinstance(a, argparse._SubParsersAction)
                                       for a in parser._actions) else []
    runnable += [(path, sp) for path, _, sp in leaves(parser)]
    for _, sp in runnable:
        if "-q" not in sp._option_string_actions and "--quiet" not in sp._option_string_actions:
            sp.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
        sp.set_defaults(prog_name=sp.prog)
    return parser


def error(prog: str, message: str) -> None:
    """Print ``PROG: error: MESSAGE`` on standard error (one line per message line)."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)


def warn(prog: str, message: str) -> None:
    """Print ``PROG: warning: MESSAGE`` on standard error."""
    print(f"{prog}: warning: {message}", file=sys.stderr, flush=True)


def _os_error_message(exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else ""
    text = exc.strerror or str(exc)
    return f"{where}: {text}" if where else text


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run(parser: argparse.ArgumentParser, argv: Optional[List[str]] = None) -> int:
    """Parse ``argv`` with ``parser`` and run the chosen command: the one error handler of
    every nlmfeature command (see the module docstring for the exit statuses)."""
    args = parser.parse_args(argv)
    prog = getattr(args, "prog_name", parser.prog)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    if main_thread:
        # `kill` stops like Ctrl-C: children are stopped, outputs written atomically are kept
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return int(args.func(args) or 0)
    except NLMFeatureError as exc:
        error(prog, str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        hint = getattr(args, "interrupt_hint", None)
        error(prog, "interrupted" + (f" ({hint})" if hint else ""))
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `nlmfeature score ... | head`
        try:  # no "Exception ignored ... BrokenPipeError" when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
            FileExistsError) as exc:
        # a path the user gave that cannot be opened: the file and the reason, no traceback
        error(prog, _os_error_message(exc))
        return EXIT_USAGE
    except MemoryError:
        error(prog, "out of memory (try a smaller --batch-size / --chunk-size or fewer --jobs)")
        return EXIT_USAGE
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``nlmfeature`` console script."""
    return run(build_parser(), argv)


# -- nlmfeature-rescore, nlmfeature-tune, nlmfeature-eval -----------------------------------------
def _alias(module: str, argv: Optional[List[str]]) -> int:
    parser = importlib.import_module(module, __package__).build_parser()
    return run(finish(add_version(parser)), argv)


def rescore_main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``nlmfeature-rescore`` (= ``nlmfeature rescore``)."""
    return _alias(".mt.rescore", argv)


def tune_main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``nlmfeature-tune`` (= ``nlmfeature tune``)."""
    return _alias(".mt.tuning.cli", argv)


def eval_main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``nlmfeature-eval`` (= ``nlmfeature eval``)."""
    return _alias(".mt.evaluate", argv)


# -- the README's command table ---------------------------------------------------------------
README_BEGIN = "<!-- command table: generated by `python3 -m nlmfeature.cli --readme README.md`; do not edit -->"
README_END = "<!-- end of command table -->"


#: flags the synopsis shows by their short form, even when optional: model, input, output
_SHOWN_SHORT = ("-m", "-i", "-o")


def _synopsis(path: List[str], sp: argparse.ArgumentParser) -> str:
    parts = ["nlmfeature"] + path
    optional = False
    for a in sp._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        meta = a.metavar or a.dest.upper()
        if not a.option_strings:
            parts.append(f"[{meta}]" if a.nargs in ("?", "*") else
                         f"{meta} [{meta} ...]" if a.nargs == "+" else meta)
            continue
        short = [o for o in a.option_strings if o in _SHOWN_SHORT]
        if not a.required and not short or a.nargs == 0:
            optional = optional or not a.required
            if a.required:
                parts.append(max(a.option_strings, key=len))
            continue
        flag = short[0] if short else max(a.option_strings, key=len)
        parts.append(f"{flag} {meta}" if a.required else f"[{flag} {meta}]")
    if optional:
        parts.append("[options]")
    return " ".join(parts)


def command_table(parser: Optional[argparse.ArgumentParser] = None) -> str:
    """The README's markdown table of commands, generated from the parsers."""
    parser = parser or build_parser()
    rows = ["| command | what it does |", "|---|---|"]
    for path, text, sp in leaves(parser):
        syn = _synopsis(path, sp).replace("|", "\\|")
        rows.append(f"| `{syn}` | {text.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def update_readme(path: str, check: bool = False) -> bool:
    """Write :func:`command_table` between the markers of ``path``; returns whether the file
    was current.  With ``check`` the file is not written."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if README_BEGIN not in text or README_END not in text:
        raise NLMFeatureError(f"{path}: the command-table markers are missing "
                              f"({README_BEGIN!r} ... {README_END!r})")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    new = f"{head}{README_BEGIN}\n{command_table()}{README_END}{tail}"
    if new == text:
        return True
    if not check:
        from nlmfeature.io.atomicfile import atomic_write_text

        atomic_write_text(path, new)
    return False


def _readme_main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="python3 -m nlmfeature.cli",
                                description="Regenerate the command table of a README from "
                                            "the parsers (between its markers).")
    p.add_argument("--readme", required=True, metavar="FILE", help="the README to update")
    p.add_argument("--check", action="store_true",
                   help="do not write; exit 1 if the table is not current")
    p.set_defaults(func=lambda a: 0 if update_readme(a.readme, a.check) or not a.check else 1)
    return run(finish(p), argv)


if __name__ == "__main__":
    if any(a == "--readme" or a.startswith("--readme=") for a in sys.argv[1:]):
        sys.exit(_readme_main(sys.argv[1:]))
    sys.exit(main())
