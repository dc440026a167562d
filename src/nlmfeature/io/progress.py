"""Progress reports: the one progress helper of the package.

On a terminal, a tqdm bar.  When standard error is not a terminal (a log file, a pipe, a CI
job), plain lines at most every :data:`INTERVAL` seconds (``$NLMFEATURE_PROGRESS_INTERVAL``
overrides it; the first line comes after one interval, so short tasks print nothing) and
one final line for a task that printed any: no carriage returns in log files.

    with progress(total=len(items), desc="rescoring", unit="hyp") as bar:
        for item in items:
            ...
            bar.update(1)
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, Iterable, Iterator, Optional, TextIO

#: seconds between two plain progress lines (``$NLMFEATURE_PROGRESS_INTERVAL`` overrides it)
INTERVAL = 30.0


def _interval() -> float:
    try:
        return float(os.environ.get("NLMFEATURE_PROGRESS_INTERVAL", INTERVAL))
    except ValueError:
        return INTERVAL


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else \
        f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{seconds:.1f}s"


def _count(n: float) -> str:
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.1f}"


class PlainProgress:
    """tqdm's small interface (``update``, ``set_postfix``, ``close``) writing plain lines."""

    def __init__(self, total: Optional[float] = None, desc: str = "", unit: str = "it",
                 initial: float = 0, file: Optional[TextIO] = None,
                 interval: Optional[float] = None) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit.strip() or "it"
        self.n = initial
        self.start_n = initial
        self.file = file if file is not None else sys.stderr
        self.interval = _interval() if interval is None else interval
        self.t0 = time.monotonic()
        self.last = self.t0
        self.lines = 0
        self.postfix: Dict[str, Any] = {}
        self.closed = False

    def _line(self, final: bool = False) -> str:
        elapsed = time.monotonic() - self.t0
        rate = (self.n - self.start_n) / elapsed if elapsed > 0 else 0.0
        done = f"{_count(self.n)}/{_count(self.total)} {self.unit}" if self.total else \
            f"{_count(self.n)} {self.unit}"
        if self.total:
            done += f" ({100.0 * self.n / self.total:.1f}%)"
        speed = f"{rate:,.1f} {self.unit}/s" if rate >= 1 or rate == 0 else \
            f"{1 / rate:,.1f} s/{self.unit}"
        parts = [f"{self.desc + ': ' if self.desc else ''}{'done, ' if final else ''}{done}",
                 speed, f"elapsed {_duration(elapsed)}"]
        if not final and self.total and rate > 0 and self.n < self.total:
            parts.append(f"left ~{_duration((self.total - self.n) / rate)}")
        parts += [f"{k} {v}" for k, v in self.postfix.items()]
        return ", ".join(parts)

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self.lines += 1
            print(self._line(), file=self.file, flush=True)

    def set_postfix(self, values: Optional[Dict[str, Any]] = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        self.postfix = dict(values or {}, **kwargs)

    def close(self) -> None:
        if not self.closed and self.lines:
            print(self._line(final=True), file=self.file, flush=True)
        self.closed = True

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Off:
    """A disabled progress report."""

    def update(self, n: float = 1) -> None:
        pass

    def set_postfix(self, values: Optional[Dict[str, Any]] = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "_Off":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def progress(total: Optional[float] = None, desc: str = "", unit: str = "it",
             enabled: bool = True, initial: float = 0, leave: bool = True,
             unit_scale: bool = False, file: Optional[TextIO] = None):
    """A progress report on ``file`` (standard error by default): a tqdm bar on a terminal,
    plain periodic lines otherwise, nothing when not ``enabled``.  Use ``update(n)``,
    ``set_postfix(dict)`` and ``close()`` (or a ``with`` block)."""
    if not enabled:
        return _Off()
    stream = file if file is not None else sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, initial=initial, leave=leave,
                    unit_scale=unit_scale, file=stream, mininterval=0.5)
    return PlainProgress(total, desc, unit, initial, stream)


def iterate(items: Iterable, total: Optional[float] = None, desc: str = "", unit: str = "it",
            enabled: bool = True, leave: bool = True) -> Iterator:
    """``items`` with a progress report of one unit per item."""
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    bar = progress(total, desc, unit, enabled, leave=leave)
    try:
        for item in items:
            yield item
            bar.update(1)
    finally:
        bar.close()
