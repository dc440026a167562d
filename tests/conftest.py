import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))

from helpers import BACKGROUND, background_build  # noqa: E402


#: test files by their cost (CPU seconds of a run), the costliest first.  pytest-xdist's
#: ``--dist loadfile`` hands a worker the next file when it runs out; in this order the long
#: files start early and short ones fill the end, so that the workers finish together (by
#: default it orders files by their number of tests, and a file of three long tests came
#: last).  Files not listed follow in their usual order; those that wait for a background
#: build (``start_build``) come last, when the build is done.  A stale list costs time only.
COSTLIEST_FIRST = (
    "test_torch_engine.py", "test_train.py", "test_bench_memory.py", "test_joint.py",
    "test_scorer.py", "test_parsers.py", "test_prepare.py", "test_robustness.py",
    "test_bench_mt.py", "test_cli_guards.py", "test_gradients.py", "test_kenlm_baseline.py",
    "test_eval.py", "test_tuning_driver.py", "test_capi.py", "test_cli.py", "test_bench_scale.py",
    "test_demo.py", "test_clusters.py", "test_moses.py", "test_pcache.py", "test_fuzz.py",
)


def pytest_configure(config):
    """pytest-xdist: hand out the files in the collection's order (see COSTLIEST_FIRST)."""
    if getattr(config.option, "loadscopereorder", None) is not None:
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):
    """Order the files as COSTLIEST_FIRST says (a stable sort: tests keep their order)."""
    rank = {name: i for i, name in enumerate(COSTLIEST_FIRST)}

    def cost_rank(item):
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "start_build"):
            return len(rank) + 1
        return rank.get(os.path.basename(str(item.fspath)), len(rank))

    items.sort(key=cost_rank)


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
