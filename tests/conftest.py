import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


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
