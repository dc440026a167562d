"""An ``NLMFEATURE_PORTABLE=1`` build (no -march=native) keeps exact log-probabilities:
normalised outputs still sum to one (a float running sum in the
softmax normaliser lost 2e-6 without wide vectors).  Builds the scorer extension with the
portable flags of nlmfeature/decoder/capi/build.py into a copy of the package, in the
background from the start of the session (conftest.py)."""
from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

from helpers import background_build, start_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def _build_mod():
    spec = importlib.util.spec_from_file_location("_nlm_capi_build", os.path.join(ROOT, "src", "nlmfeature", "decoder", "capi", "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def start_build(directory: str) -> subprocess.Popen:
    """Start building the portable scorer into a copy of the package in ``directory``: Cython
    (as setup.py runs it) then the C compiler, in one background process.  conftest.py starts
    it when the test run starts, so that it runs beside the other tests."""
    build = _build_mod()
    d = os.path.join(directory, "portable")
    shutil.copytree(os.path.join(ROOT, "src", "nlmfeature"), os.path.join(d, "nlmfeature"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    generated = os.path.join(d, "_scorer.c")
    # compiled as the module nlmfeature._scorer (its pxd lives under cython/nlmfeature)
    cython = [sys.executable, "-m", "cython", "-3", "-I", os.path.join(ROOT, "cython"), "-o", generated,
              *[a for k, v in build.CYTHON_DIRECTIVES.items() if k != "language_level"
                for a in ("-X", f"{k}={v}")],
              os.path.join(ROOT, "cython", "nlmfeature", "_scorer.pyx")]
    flags = build.compile_args(portable=True)
    assert "-march=native" not in flags
    target = os.path.join(d, "nlmfeature", f"_scorer{sysconfig.get_config_var('EXT_SUFFIX')}")
    cc = shlex.split(os.environ.get("CC", "cc")) + [
        "-shared", "-fPIC", *flags, "-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION",
        f"-I{sysconfig.get_paths()['include']}", f"-I{np.get_include()}",
        f"-I{os.path.join(ROOT, 'cython')}", f"-I{os.path.join(ROOT, 'cython', 'nlmfeature')}",
        generated, "-o", target + ".tmp", *build.link_args()]
    script = f"{shlex.join(cython)} && {shlex.join(cc)} && mv {shlex.quote(target + '.tmp')} {shlex.quote(target)}"
    return start_script(directory, script)


@pytest.fixture(scope="module")
def portable_package(request):
    return os.path.join(background_build(request.config, __name__, start_build), "portable")


CHECK = r'''
import sys, numpy as np
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import nlmfeature, nlmfeature._scorer as sc
assert sc.__file__.startswith(sys.argv[1]), sc.__file__
from helpers import BROWN_VALID, make_model, read_lines
worst = 0.0
for out in ("softmax", "class", "tree"):
    path = make_model(sys.argv[3], f"{out}.nlm", order=5, min_count=1, output=out, classes=40,
                      arch="nplm", word_width=10, hidden=24, hidden_layers=[12])
    m = nlmfeature.load(path)
    V = len(m.vocab)
    s = m.session()
    for line in read_lines(BROWN_VALID, 8)[::2]:
        ctx, _ = m.sentence_ngrams(line)
        for c in ctx[:: max(1, len(ctx) // 2)]:
            cc = np.ascontiguousarray(np.repeat(c[None], V, axis=0))
            total = np.exp(s.score_padded(cc, np.arange(V, dtype=np.int32))).sum()
            worst = max(worst, abs(total - 1))
print(V, worst)
'''


def test_portable_build_sums_to_one(portable_package, tmp_path):
    p = subprocess.run([sys.executable, "-c", CHECK, portable_package, os.path.join(ROOT, "tests"), str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    V, worst = p.stdout.split()
    assert int(V) > 5000  # a vocabulary large enough for a float running sum to drift
    assert float(worst) < 1e-6, worst
