"""Progress on standard error: plain lines (no carriage returns) in log files, nothing with -q."""
from __future__ import annotations

import io
import os
import subprocess
import sys


from helpers import DATA, kbest_vocab_model, make_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KBEST = os.path.join(DATA, "kbest", "moses-multi30k-dev10.100best.gz")
ENV = dict(os.environ, PYTHONPATH=ROOT)


# -- progress in log files ---------------------------------------------------------------------------
def test_progress_is_plain_lines_when_not_a_terminal(monkeypatch):
    from nlmfeature.io.progress import PlainProgress, progress

    buf = io.StringIO()
    bar = progress(total=10, desc="work", unit="item", file=buf)
    assert isinstance(bar, PlainProgress)
    bar.interval = 0.0
    for _ in range(10):
        bar.update(1)
    bar.close()
    out = buf.getvalue()
    assert "\r" not in out and out.count("\n") == 11
    assert out.splitlines()[0].startswith("work: 1/10 item (10.0%)")
    assert out.splitlines()[-1].startswith("work: done, 10/10 item (100.0%)")
    quiet = io.StringIO()
    with progress(total=3, desc="short", file=quiet) as b:   # shorter than one interval: silent
        b.update(3)
    assert quiet.getvalue() == ""


def test_rescore_progress_in_a_log_file(tmp_path):
    model = make_model(tmp_path)
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", model, "-i",
                            KBEST, "-o", str(tmp_path / "o.gz"), "--chunk-size", "100"],
                           stderr=f, cwd=ROOT, timeout=300,
                           env=dict(ENV, NLMFEATURE_PROGRESS_INTERVAL="0"))
    assert r.returncode == 0
    text = log.read_text()
    assert "\r" not in text and "\x1b" not in text
    progress_lines = [l for l in text.splitlines() if l.startswith("rescoring: ")]
    assert len(progress_lines) >= 5 and "hyp/s" in progress_lines[0]
    # -q: no progress and no summary; what is left on stderr are warnings (here: none)
    r = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", kbest_vocab_model(tmp_path, KBEST),
                        "-i", KBEST, "-o", str(tmp_path / "q.gz"), "--chunk-size", "100", "-q"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env=dict(ENV, NLMFEATURE_PROGRESS_INTERVAL="0"))
    assert r.returncode == 0 and r.stderr == ""


