"""Print requirements from pyproject.toml for tools/setup.sh, for each argument: ``build``
(the build system's) or an optional extra (``test``, ``kenlm``, ``plot``, ``torch``), which
comes with the package's own dependencies."""
import os
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def requirements(groups):
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        meta = tomllib.load(f)
    project = meta["project"]
    out = []
    for g in groups:
        if g == "build":
            out += meta["build-system"]["requires"]
            continue
        if g not in project["optional-dependencies"]:
            sys.exit(f"requirements.py: pyproject.toml has no extra {g!r}")
        out += project["optional-dependencies"][g] + project["dependencies"]
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    print(" ".join(requirements(sys.argv[1:])))
