"""What every ``nlmfeature`` command shares: the flag types and ranges, the conventions
:func:`finish` gives each parser, and :func:`run`, the one error handler.

* exit 0 on success, 1 when a command reports a negative finding (e.g. ``cache --verify``
  found bad files), 2 for a user error (bad option, bad or missing input, as argparse does),
  130 on Ctrl-C or SIGTERM;
* a user error is one line ``PROG: error: MESSAGE`` on standard error (the message names the
  file, and the line when there is one), never a traceback;
* a closed standard output (``nlmfeature score ... | head``) ends the command quietly.

Conventions every command follows (``tests/test_cli.py`` checks them on the parsers):
``-m`` is always an *input* model, ``-o`` always an output path, ``-q/--quiet`` turns off
progress and informational messages, and ``--help`` explains every flag.

Guards :func:`finish` and :func:`run` give every command, before it does any work:

* every numeric flag is checked against its range (:class:`Number`): a command states a
  flag's real range with ``type=Number(int, lo, hi)`` (or :data:`THREADS`); a plain
  ``type=int`` gets the default range (0 or the flag's negative default .. 2**31-1), a plain
  ``type=float`` must be finite.  NaN, infinities and out-of-range values are usage errors
  naming the flag (exit 2);
* no output may be one of the command's inputs or another of its outputs, by name or through
  links (:func:`check_outputs`): outputs are the ``-o`` flags and the flags named in
  :data:`OUTPUT_DESTS`; inputs are every other path argument that exists.

A command module defines ``build_parser(sub=None)`` (its parser, as a subcommand of ``sub``
or standalone), ``register(sub)`` and, for the commands that also have a console script of
their own, ``main(argv)`` (:func:`standalone`).
"""
from __future__ import annotations

import argparse
import errno
import math
import os
import signal
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from nlmfeature.errors import NLMFeatureError

#: the help of the ``-q`` flag added to commands that do not define their own
QUIET_HELP = "no progress or informational messages on standard error"

#: exit statuses
EXIT_OK, EXIT_NEGATIVE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


#: largest int a plain ``type=int`` flag takes (sizes and ids are int32 in the scorer)
MAX_INT = (1 << 31) - 1
#: most threads or worker processes a command starts: 4 per core, at most 256
MAX_THREADS = min(256, 4 * (os.cpu_count() or 1))


#: largest magnitude a float flag takes (no setting means anything beyond it)
MAX_FLOAT = 1e15


class Number:
    """An argparse ``type``: an int or a finite float in ``[lo, hi]`` (None: as far as
    :data:`MAX_INT` / :data:`MAX_FLOAT` on that side).  ``Number(int, 1, MAX_THREADS)``;
    ``Number(float, 0, None, lo_open=True)`` for a positive float.  The error names the
    range, argparse names the flag."""

    def __init__(self, kind: type = int, lo: Optional[float] = None, hi: Optional[float] = None,
                 lo_open: bool = False) -> None:
        limit = MAX_INT if kind is int else MAX_FLOAT
        lo = -limit if lo is None else lo
        hi = limit if hi is None else hi
        self.kind, self.lo, self.hi, self.lo_open = kind, lo, hi, lo_open
        self.__name__ = kind.__name__          # argparse's "invalid int value: 'x'"

    def range_text(self) -> str:
        if self.kind is float:
            return f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"
        return f"{self.lo}..{self.hi}"

    def accepts(self, value: float) -> bool:
        """Whether ``value`` (a number) is in range."""
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if value < self.lo or (self.lo_open and value == self.lo):
            return False
        return value <= self.hi

    def __call__(self, text: str) -> Any:
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"invalid {self.kind.__name__} value: {text!r}") from None
        if not self.accepts(value):
            what = "a finite number" if self.kind is float else "an integer"
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: {what} in "
                                             f"{self.range_text()}")
        return value

    def __repr__(self) -> str:
        return f"Number({self.kind.__name__}, {self.range_text()})"


#: ``type=`` of a thread or worker-process count
THREADS = Number(int, 1, MAX_THREADS)


def size_bytes(text: str) -> str:
    """``type=`` of a size flag (``500M``, ``4G``; :func:`nlmfeature.io.sizes.parse_size`):
    the bytes as a decimal string, the way the Moses and cdec features'
    ``persistent-cache-max`` takes them; a bad size is a usage error."""
    from nlmfeature.io.sizes import parse_size

    try:
        return str(parse_size(text))
    except NLMFeatureError as e:
        raise argparse.ArgumentTypeError(str(e)) from None

#: destinations of the flags that name outputs, besides every ``-o``
OUTPUT_DESTS = frozenset({"output", "out", "model_out", "one_best", "save_pool", "output_1best",
                          "json", "plot", "json_out"})


#: the runnable parser of each program name (``nlmfeature train``), for :func:`check_outputs`
_COMMAND_PARSERS: Dict[str, argparse.ArgumentParser] = {}


#: ranges of plain ``type=int`` flags by destination, in every command
NAMED_RANGES = {"threads": THREADS, "jobs": THREADS, "seed": Number(int, 0, (1 << 32) - 1)}


def _default_number(action: argparse.Action) -> Optional[Number]:
    """The range a plain ``type=int`` / ``type=float`` flag gets (see the module doc)."""
    if action.type is int and action.dest in NAMED_RANGES:
        return NAMED_RANGES[action.dest]
    if action.type is int:
        d = action.default
        lo = min(0, d) if isinstance(d, int) and not isinstance(d, bool) else 0
        return Number(int, lo, MAX_INT)
    if action.type is float:
        return Number(float)
    return None


def is_output(action: argparse.Action) -> bool:
    """Whether a flag names an output file (``-o``, or a destination in :data:`OUTPUT_DESTS`)."""
    if action.choices is not None or action.nargs == 0:    # a choice or a switch: no path
        return False
    return "-o" in action.option_strings or action.dest in OUTPUT_DESTS


def _paths(value: Any) -> List[str]:
    """The path-like strings of an argument value (a string or a list of them)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return [os.fspath(v) for v in items
            if isinstance(v, (str, os.PathLike)) and os.fspath(v) not in ("", "-")]


def _same(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (:class:`NLMFeatureError`) an output that is one of the command's inputs or
    another output, by name, through links or hard links, before anything is read or
    written: writing it would destroy the input or the other output."""
    outputs: List[Tuple[str, str]] = []
    inputs: List[Tuple[str, str]] = []
    for a in parser._actions:
        if a.dest in (argparse.SUPPRESS, "help") or not hasattr(args, a.dest):
            continue
        flag = max(a.option_strings, key=len) if a.option_strings else a.dest.upper()
        for path in _paths(getattr(args, a.dest)):
            (outputs if is_output(a) else inputs).append((flag, path))
    for i, (oflag, out) in enumerate(outputs):
        for iflag, inp in inputs:
            if os.path.exists(inp) and _same(out, inp):
                raise NLMFeatureError(f"{out}: {oflag} would overwrite the input {iflag} {inp}; "
                                      "write the output to another file")
        for oflag2, out2 in outputs[:i]:
            if _same(out, out2):
                raise NLMFeatureError(f"{out}: {oflag} and {oflag2} name the same file; give "
                                      "each output its own path")


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


class _OneLineErrors(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (``PROG: error: MESSAGE``), like
    every other error of the command, instead of the usage text and then the message."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def finish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every runnable (sub)parser the shared conventions: ``-q/--quiet`` when it has no
    quiet flag of its own, and its program name for error messages.  Returns ``parser``."""
    runnable = [([], parser)] if not any(isinstance(a, argparse._SubParsersAction)
                                       for a in parser._actions) else []
    runnable += [(path, sp) for path, _, sp in leaves(parser)]
    for sp in [parser] + [sp for _, _, sp in subparsers(parser)]:
        if type(sp) is argparse.ArgumentParser:
            sp.__class__ = _OneLineErrors
    for _, sp in runnable:
        if "-q" not in sp._option_string_actions and "--quiet" not in sp._option_string_actions:
            sp.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
        for a in sp._actions:      # every numeric flag gets a range
            number = _default_number(a)
            if number is not None:
                a.type = number
        sp.set_defaults(prog_name=sp.prog)
        _COMMAND_PARSERS[sp.prog] = sp
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


#: errors of the environment, not of the program: one line, exit 2, never a traceback
_ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO,
                                 errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.ELOOP,
                                 errno.EMFILE, errno.ENFILE, errno.ENXIO, errno.ENODEV,
                                 errno.ETXTBSY, errno.EBUSY})


def _drop_stdout() -> None:
    """Point standard output at /dev/null: what is still buffered for a closed pipe or a full
    disk would fail again when Python flushes it at exit ("Exception ignored ...")."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


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
        command_parser = _COMMAND_PARSERS.get(prog)
        if command_parser is not None:
            check_outputs(command_parser, args)
        status = int(args.func(args) or 0)
        sys.stdout.flush()       # (a full disk behind standard output fails here, not at exit)
        return status
    except NLMFeatureError as exc:
        error(prog, str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        hint = getattr(args, "interrupt_hint", None)
        error(prog, "interrupted" + (f" ({hint})" if hint else ""))
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `nlmfeature score ... | head`
        _drop_stdout()
        return EXIT_OK
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
            FileExistsError) as exc:
        # a path the user gave that cannot be opened: the file and the reason, no traceback
        error(prog, _os_error_message(exc))
        return EXIT_USAGE
    except MemoryError:
        error(prog, "out of memory (try a smaller --batch-size / --chunk-size or fewer --jobs)")
        return EXIT_USAGE
    except OSError as exc:
        if exc.errno not in _ENVIRONMENT_ERRNOS:
            raise
        # a full disk, a read-only directory, a quota: the file and the reason; outputs are
        # written atomically, so what was there before is intact
        hint = (" (nothing was replaced: earlier outputs are intact; free some space and run "
                "again)" if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "")
        error(prog, _os_error_message(exc) + hint)
        _drop_stdout()
        return EXIT_USAGE
    except Exception as exc:
        from concurrent.futures.process import BrokenProcessPool

        if not isinstance(exc, BrokenProcessPool):
            raise
        error(prog, "a worker process died (killed, or out of memory?); output files were not "
                    "replaced: run again, with fewer --jobs if memory is short")
        return EXIT_USAGE
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def standalone(build_parser: Callable[[], argparse.ArgumentParser],
               argv: Optional[List[str]] = None) -> int:
    """Run a command module's parser on its own (``nlmfeature-rescore``, or a command called
    from Python): ``--version``, the conventions of :func:`finish`, the error handler :func:`run`."""
    return run(finish(add_version(build_parser())), argv)


def command(module: Any) -> Callable[[List[str]], int]:
    """``nlmfeature SUBCOMMAND ...`` of one command module, to call from Python: the returned
    function takes the arguments as the console script does (``["train", "-i", ...]``) and
    runs them through :func:`run` (``command(commands.train)(["train", ...])``)."""
    def call(argv: List[str]) -> int:
        parser = argparse.ArgumentParser(prog="nlmfeature")
        sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        sub.required = True
        module.register(sub)
        return run(finish(parser), argv)

    return call
