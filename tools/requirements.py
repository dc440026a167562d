"""Print requirements from pyproject.toml, one per argument word, for tools/setup.sh:
``build`` (the build system's), ``run`` (the package's dependencies) and any optional extra
(``test``, ``kenlm``, ``plot``, ``torch``); the package's dependencies come with every extra."""
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
        if g != "run":
            if g not in project["optional-dependencies"]:
                sys.exit(f"requirements.py: pyproject.toml has no extra {g!r}")
            out += project["optional-dependencies"][g]
        out += project["dependencies"]
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    print(" ".join(requirements(sys.argv[1:])))
