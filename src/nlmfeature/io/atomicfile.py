"""Writing files: the one atomic writer of the package, and the check of an output path.

A file is written to a temporary name in the target's directory, flushed, fsync'ed and
renamed over the target (``os.replace``) only when the writer is closed cleanly; on any
failure (an exception, ``KeyboardInterrupt``, :meth:`AtomicFile.discard`) the temporary file
is removed.  A reader (or a crash) sees the old file or the new one, never half of one, and a
failed run leaves nothing behind.

:func:`check_output` checks an output path *before* the work starts (an output that is a
directory, lies in a missing directory or cannot be created fails at once, with a message
naming it, instead of after an hour of training or rescoring).

Temporary files are named ``.NAME.<pid>.XXXX.tmp`` after the writing process: a writer that
was killed (SIGKILL, a power cut) leaves one behind, and the next write of an output of that
name removes it once its process is gone (:func:`remove_stale`).
"""
from __future__ import annotations

import contextlib
import gzip
import io
import os
import stat
import sys
import tempfile
from typing import IO, BinaryIO, Iterator, Optional

from nlmfeature.errors import NLMFeatureError

#: zlib level of the .gz files written (4: about 3x faster than gzip's 9, ~10% larger)
GZIP_LEVEL = 4


class OutputError(NLMFeatureError):
    """An output path cannot be written (a directory, in a missing directory, no permission)."""


def _stream_target(path: str) -> bool:
    """Whether ``path`` is an existing character device or FIFO (``/dev/null``,
    ``/dev/stdout``, a named pipe): written directly, since it cannot be replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def check_output(path: str, what: str = "output", stream: bool = False) -> None:
    """Raise :class:`OutputError` unless a file can be written at ``path`` (``-``, standard
    output, always can; with ``stream``, so can an existing character device or FIFO such as
    ``/dev/null``, which :func:`open_output` writes directly).  Call it before the work that
    produces the file.  Nothing is left behind: the check creates and removes a temporary
    file in the target directory."""
    if path == "-":
        return
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"an output path must be a str, not {type(path).__name__}")
    path = os.fspath(path)
    if stream and _stream_target(path):
        if not os.access(path, os.W_OK):
            raise OutputError(f"{what} {path}: not writable")
        return
    if not path or path.endswith(os.sep):
        raise OutputError(f"{what} {path!r}: not a file name")
    try:
        st: Optional[os.stat_result] = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"{what} {path}: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{what} {path} is a directory; give a file name")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{what} {path} exists and is not a regular file (an atomic write "
                          "would replace it; this output cannot go to a device or pipe)")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise OutputError(f"{what} {path}: the directory {directory} does not exist; create it "
                          "first")
    try:
        remove_stale(path)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".check", dir=directory)
    except OSError as exc:
        raise OutputError(f"{what} {path}: cannot write in {directory}: "
                          f"{exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(tmp)


def temp_prefix(path: str) -> str:
    """The name prefix of this process's temporary files for ``path``:
    ``.NAME.<pid>.`` -- the process id lets a later run tell a dead writer's leftovers
    (:func:`remove_stale`) from a live writer's file."""
    return f".{os.path.basename(path)}.{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def remove_stale(path: str) -> int:
    """Delete the temporary files that writers of ``path`` (any output of its name in its
    directory) left when they were killed (``.NAME.<pid>.*`` whose process is gone);
    returns how many.  A live writer's file is never touched."""
    directory = os.path.dirname(os.path.abspath(path))
    lead = f".{os.path.basename(path)}."
    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(lead):
            continue
        pid = name[len(lead):].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        full = os.path.join(directory, name)
        try:
            if stat.S_ISREG(os.lstat(full).st_mode):
                os.unlink(full)
                removed += 1
        except OSError:
            pass
    return removed


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class AtomicFile(io.BufferedWriter):
    """Binary file written to a temporary name next to ``path``; a clean :meth:`close` (or
    ``with`` exit) flushes, fsyncs and renames it over ``path``; an exception inside ``with``,
    a failing close or :meth:`discard` removes it instead.  The new file gets the usual
    permissions (0666 minus the umask).  Seekable, as a plain file."""

    def __init__(self, path: str, suffix: str = ".tmp") -> None:
        if os.path.exists(path) and not os.path.isfile(path):
            raise OutputError(f"{path} exists and is not a regular file: an atomic write would "
                              "replace it")
        directory = os.path.dirname(os.path.abspath(path))
        remove_stale(path)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=suffix, dir=directory)
        try:
            super().__init__(io.FileIO(fd, "wb"), buffer_size=1 << 16)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        self.target = path
        self.tmp = tmp
        self._failed = False

    def discard(self) -> None:
        """Do not create the target: closing removes the temporary file."""
        self._failed = True

    def write(self, data) -> int:  # type: ignore[override]
        try:
            return super().write(data)
        except OSError as exc:
            _name(exc, self.target)
            raise

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as exc:
            _name(exc, self.target)
            raise

    def __exit__(self, exc_type, exc, tb):  # type: ignore[override]
        if exc_type is not None:
            self._failed = True
            _name(exc, self.target)
        return super().__exit__(exc_type, exc, tb)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self._failed:
                self.flush()
                os.fsync(self.fileno())
        except BaseException as exc:
            self._failed = True
            _name(exc, self.target)
            raise
        finally:
            try:
                super().close()
            finally:
                if self._failed:
                    if os.path.exists(self.tmp):
                        os.unlink(self.tmp)
                else:
                    install(self.tmp, self.target, synced=True)


def _name(exc: BaseException, path: str) -> None:
    """Give a failed write's OSError (a full disk: ENOSPC, EFBIG) the output's name, which
    the error message then shows."""
    if isinstance(exc, OSError) and exc.filename is None:
        exc.filename = path


def install(tmp: str, target: str, synced: bool = False) -> None:
    """Move the finished file ``tmp`` (in ``target``'s directory) over ``target``: fsync
    (unless ``synced``), usual permissions, ``os.replace``; ``tmp`` is removed on failure.
    For files another program wrote (e.g. KenLM's ``lmplz``)."""
    try:
        if not synced:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str, suffix: str = ".tmp") -> Iterator[BinaryIO]:
    """``with atomic_open(path) as f:`` a binary :class:`AtomicFile` (see there)."""
    f = AtomicFile(path, suffix)
    with f:
        yield f


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_text_if_changed(path: str, text: str) -> bool:
    """Write ``text`` (UTF-8) to ``path`` atomically unless the file already holds exactly it,
    so that its modification time says when its content last changed (what was made from it
    stays valid); returns whether it wrote."""
    data = text.encode("utf-8")
    try:
        if os.path.getsize(path) == len(data):
            with open(path, "rb") as f:
                if f.read() == data:
                    return False
    except OSError:
        pass
    atomic_write_bytes(path, data)
    return True


class _TextOutput(io.TextIOWrapper):
    """UTF-8 text (gzip-compressed for ``compress``) written through an :class:`AtomicFile`."""

    def __init__(self, path: str, compress: bool) -> None:
        raw = AtomicFile(path)
        self._raw_file = raw
        binary: IO[bytes] = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                          compresslevel=GZIP_LEVEL) if compress else raw
        super().__init__(binary, encoding="utf-8", newline="\n")

    def discard(self) -> None:
        """Do not create the target file (see :meth:`AtomicFile.discard`)."""
        self._raw_file.discard()

    def __exit__(self, exc_type, exc, tb):  # type: ignore[override]
        if exc_type is not None:
            self._raw_file.discard()
            _name(exc, self._raw_file.target)
        return super().__exit__(exc_type, exc, tb)

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()       # flushes (and ends the gzip stream)
        except BaseException as exc:
            self._raw_file.discard()
            _name(exc, self._raw_file.target)
            raise
        finally:
            self._raw_file.close()


class _StdText(io.TextIOWrapper):
    """UTF-8 text view of standard output whose ``close`` only flushes."""

    _detached = False

    def discard(self) -> None:
        pass

    def close(self) -> None:
        if not self._detached:
            self.flush()
            self.detach()
            self._detached = True

    @property
    def closed(self) -> bool:  # type: ignore[override]
        return self._detached or super().closed


class _StdBytes:
    """Standard output's binary buffer behind a ``close`` that only flushes."""

    def __init__(self, buf: IO[bytes]) -> None:
        self._buf = buf

    def write(self, data: bytes) -> int:
        return self._buf.write(data)

    def discard(self) -> None:
        pass

    def close(self) -> None:
        self._buf.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _DirectBytes(_StdBytes):
    """A device or FIFO written directly (closing closes it)."""

    def close(self) -> None:
        self._buf.close()


class _DirectText(io.TextIOWrapper):
    """Text written directly to a device or FIFO (nothing to discard)."""

    def discard(self) -> None:
        pass


def open_output(path: str, binary: bool = False):
    """An output file written atomically: UTF-8 text (``.gz``: gzip-compressed), or raw bytes
    with ``binary`` (for writers that compress their own gzip members: concatenated members
    form one valid ``.gz`` file).  ``-`` is standard output (flushed, not closed); an existing
    character device or FIFO (``/dev/null``, a named pipe) is written directly.  Use it in
    ``with`` or call ``discard()`` before ``close()`` on failure.  Raises
    :class:`OutputError` when the file cannot be created."""
    if path == "-":
        if binary:
            return _StdBytes(sys.stdout.buffer)
        if not hasattr(sys.stdout, "buffer"):   # replaced by a text-only stream (tests)
            return sys.stdout
        return _StdText(sys.stdout.buffer, encoding="utf-8", newline="\n")
    if _stream_target(path):
        try:
            raw = open(path, "wb")
        except OSError as exc:
            raise OutputError(f"{path}: cannot open for writing: {exc.strerror or exc}") from None
        if binary:
            return _DirectBytes(raw)
        if path.endswith(".gz"):
            raw = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                compresslevel=GZIP_LEVEL)
        return _DirectText(raw, encoding="utf-8", newline="\n")
    check_output(path)
    try:
        return AtomicFile(path) if binary else _TextOutput(path, path.endswith(".gz"))
    except OSError as exc:
        raise OutputError(f"{path}: cannot open for writing: {exc.strerror or exc}") from None


def replace_block(path: str, begin: str, end: str, content: str, heading: str = "") -> None:
    """Replace the text between the marker lines ``begin`` and ``end`` of a text file with
    ``content`` (atomically); a file without the markers gets ``heading``, the markers and the
    content appended (a missing file is created)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    a = text.find(begin)
    b = text.find(end, a) if a >= 0 else -1
    if a < 0 or b < 0:
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        text = text + sep + (heading + "\n\n" if heading else "") + begin + "\n" + end + "\n"
        a = text.find(begin)
        b = text.find(end, a)
    atomic_write_text(path, text[:a] + begin + "\n" + content.rstrip("\n") + "\n" + text[b:])
