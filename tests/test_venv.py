"""libnlmfeature built inside a virtualenv starts that venv's interpreter (its sys.prefix,
its site-packages and numpy), not the base Python the venv was made from.

The package is installed into a fresh ``python -m venv`` with ``pip install
--no-build-isolation`` from a copy of this checkout whose build directory holds the Cython
extensions this checkout imports (newer than their sources), so pip's build reuses them and
compiles only libnlmfeature.
A ``.pth`` probe in the venv's site-packages records the embedded interpreter's sys.prefix:
``site`` runs it only if the library really started the venv's Python."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_VALID, background_build, start_script, make_model, read_lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "tests", "c", "test_capi.c")

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "NLMFEATURE"))}
    env.update(PATH="/usr/bin:/bin", HOME="/nonexistent", **extra)
    return env


def start_build(directory: str) -> subprocess.Popen:
    """Copy the checkout into ``directory`` and start making the venv and installing the copy
    into it, in one background process (conftest.py starts it when the test run starts)."""
    d = os.path.join(directory, "venv")
    src = os.path.join(d, "src")
    os.makedirs(src)
    for name in ("setup.py", "pyproject.toml", "README.md", "src", "cython"):
        p = os.path.join(ROOT, name)
        if os.path.isdir(p):
            shutil.copytree(p, os.path.join(src, name), symlinks=True, ignore=shutil.ignore_patterns(
                "__pycache__", "*.egg-info", "lib", "include", "*.so.tmp*"))
        elif os.path.exists(p):
            shutil.copy2(p, os.path.join(src, name))
    # the extensions already built, dated after the generated C, itself after the Cython
    # sources: cythonize and build_ext find them up to date and compile none of them
    # (libnlmfeature is compiled: its stamp names another interpreter)
    now = time.time()
    for d_, _, files in os.walk(os.path.join(src, "cython")):
        for name in files:
            t = now - 5 if name.endswith((".c", ".cpp")) else now - 10
            os.utime(os.path.join(d_, name), (t, t))
    build_lib = os.path.join(src, "build", f"lib.{sysconfig.get_platform()}-{sys.implementation.cache_tag}",
                             "nlmfeature")
    os.makedirs(build_lib)
    package = os.path.dirname(nlmfeature.__file__)
    for name in os.listdir(package):
        if name.startswith("_") and name.endswith(sysconfig.get_config_var("EXT_SUFFIX")):
            shutil.copy(os.path.join(package, name), os.path.join(build_lib, name))
            os.utime(os.path.join(build_lib, name), (now, now))
    env_dir = os.path.join(d, "env")
    py = os.path.join(env_dir, "bin", "python")
    script = (f"{shlex.join([sys.executable, '-m', 'venv', '--system-site-packages', '--without-pip', env_dir])} && "
              f"{shlex.join([py, '-m', 'pip', 'install', '-q', '--no-build-isolation', '--no-deps', '--no-index', src])}")
    return start_script(directory, script, cwd=d)


@pytest.fixture(scope="module")
def venv(request):
    env_dir = os.path.join(background_build(request.config, __name__, start_build), "venv", "env")
    py = os.path.join(env_dir, "bin", "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "nlm_venv_probe.pth"), "w") as f:
        f.write("import os, sys; p = os.environ.get('NLM_VENV_PROBE'); "
                "p and open(p, 'w').write(sys.prefix + '\\n' + sys.executable)\n")
    return {"dir": env_dir, "python": py, "site": site}


def test_library_built_in_a_venv_runs_the_venvs_python(venv, tmp_path):
    py = venv["python"]
    # the installed package (not this checkout) answers: run from elsewhere
    flags = subprocess.run([py, "-m", "nlmfeature.cli", "config", "--cflags", "--libs"], capture_output=True,
                           text=True, check=True, cwd=str(tmp_path)).stdout
    assert venv["site"] in flags, flags
    exe = str(tmp_path / "test_capi")
    args = shlex.split(flags)
    subprocess.run(["cc", "-O1", *[a for a in args if not a.startswith("-l")], SOURCE, "-o", exe,
                    *[a for a in args if a.startswith("-l")], "-lpthread", "-lm"], check=True)
    model = make_model(tmp_path, "m.nlm", order=4, min_count=4)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(read_lines(BROWN_VALID, 10)) + "\n", encoding="utf-8")
    probe = tmp_path / "probe.txt"
    p = subprocess.run([exe, "score", model, str(text), "--threads", "2"], capture_output=True, text=True,
                       timeout=300, cwd=str(tmp_path), env=_clean_env(NLM_VENV_PROBE=str(probe)))
    assert p.returncode == 0, p.stderr
    assert probe.exists(), "the library did not start the venv's interpreter (its site-packages were not set up)"
    prefix, executable = probe.read_text().splitlines()
    assert os.path.realpath(prefix) == os.path.realpath(venv["dir"]), (prefix, executable)
    got = [[float(x) for x in line.split()] for line in p.stdout.splitlines()]
    m = nlmfeature.load(model)
    for a, line in zip(got, read_lines(str(text))):
        assert np.allclose(a, m.score_sentence(line), atol=1e-6)
    assert len(got) == 10
