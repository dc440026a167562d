import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

from helpers import BACKGROUND  # noqa: E402


def pytest_collection_finish(session):
    """Start the slow builds of the collected test modules (those with ``start_build``) in
    the background: a compiler on the second core while the other tests run."""
    if session.config.option.collectonly:
        return
    for module in {item.module for item in session.items if hasattr(item, "module")}:
        start = getattr(module, "start_build", None)
        if start is not None and module.__name__ not in BACKGROUND:
            directory = tempfile.mkdtemp(prefix="nlmfeature-build-")
            BACKGROUND[module.__name__] = start(directory)
            BACKGROUND[module.__name__].directory = directory


def pytest_sessionfinish(session, exitstatus):
    for proc in BACKGROUND.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(getattr(proc, "directory", ""), ignore_errors=True)


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
