"""tools/setup.sh: the install stamp follows the build sources, and a second run only checks."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- a second set-up run only checks ------------------------------------------------------------------
def _copy_build_inputs(dst):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import install_stamp

    for rel in install_stamp.build_inputs(ROOT):
        os.makedirs(os.path.dirname(os.path.join(dst, rel)) or dst, exist_ok=True)
        shutil.copy(os.path.join(ROOT, rel), os.path.join(dst, rel))
    return install_stamp


def test_install_stamp_follows_the_build_sources(tmp_path):
    st = _copy_build_inputs(str(tmp_path))
    root = str(tmp_path)
    assert any(p.endswith(".pyx") for p in st.build_inputs(root)) and "setup.py" in st.build_inputs(root)
    assert "no record" in st.why_not_current(root)
    st.record(root)
    before = st.stamp(root)
    os.makedirs(tmp_path / "nlmfeature", exist_ok=True)
    (tmp_path / "nlmfeature" / "model.py").write_text("# python sources need no rebuild\n")
    assert st.stamp(root) == before
    # the copy is not the installed package, so it is never "current"
    assert "not this checkout" in st.why_not_current(root) or "does not import" in st.why_not_current(root)
    pyx = next(p for p in st.build_inputs(root) if p.endswith(".pyx"))
    with open(os.path.join(root, pyx), "a") as f:
        f.write("\n# changed\n")
    assert st.stamp(root) != before
    assert "changed" in st.why_not_current(root)


def test_second_setup_run_only_checks():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import install_stamp

    reason = install_stamp.why_not_current(ROOT)
    if reason:
        pytest.skip(f"tools/setup.sh has not installed this checkout ({reason})")
    r = subprocess.run(["bash", "tools/setup.sh"], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert "nothing to rebuild" in r.stderr and "installing" not in r.stderr

