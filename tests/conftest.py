import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))

from helpers import BACKGROUND, background_build  # noqa: E402


def pytest_collection_finish(session):
    """Start the slow builds of the collected test modules (those with ``start_build``) in
    the background, once per test run (pytest-xdist's workers share them): a compiler on the
    second core while the other tests run."""
    if session.config.option.collectonly:
        return
    for module in {item.module for item in session.items if hasattr(item, "module")}:
        start = getattr(module, "start_build", None)
        if start is not None:
            background_build(session.config, module.__name__, start, wait=False)


def pytest_sessionfinish(session, exitstatus):
    """A build this process started may still serve the other worker of the run: it is waited
    for, and stopped only when the run was interrupted."""
    for proc in BACKGROUND.values():
        if proc.poll() is None:
            if exitstatus == 2:     # interrupted: the script and what it started
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line saying how many decoder tests (marker ``decoder``) ran, so that their
    absence (no MOSES_ROOT / CDEC_ROOT) shows in every CI log."""
    counts = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for rep in terminalreporter.stats.get(outcome, []):
            if "decoder" in getattr(rep, "keywords", {}) and getattr(rep, "when", "call") in ("call", "setup"):
                counts[outcome] = counts.get(outcome, 0) + 1
    if counts:
        text = ", ".join(f"{n} {k}" for k, n in counts.items())
        hint = " (set MOSES_ROOT / CDEC_ROOT to run them)" if counts.get("skipped") else ""
        terminalreporter.write_line(f"decoder tests (need a built Moses / cdec): {text}{hint}")
