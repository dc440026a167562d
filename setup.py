"""Build script for nlmfeature.

Every ``cython/nlmfeature/NAME.pyx`` becomes the extension module ``nlmfeature.NAME``; adding a
Cython source needs no change here.  Set ``NLMFEATURE_PORTABLE=1`` to build without
``-march=native`` (for binaries that must run on other CPUs) and
``NLMFEATURE_SANITIZE=address,undefined`` (or ``thread``) for a sanitizer build
(docs/sanitizers.md).  Compiler flags live in ``nlmfeature/decoder/capi/build.py``.
"""
import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _capi_build():
    """nlmfeature/decoder/capi/build.py, loaded by path (the package is not importable before it is
    built): compiler flags and the build step of libnlmfeature.so."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_nlm_capi_build", os.path.join(HERE, "src", "nlmfeature", "decoder", "capi", "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _extensions() -> list:
    exts = []
    for pyx in sorted(glob.glob(os.path.join("cython", "nlmfeature", "*.pyx"))):
        name = os.path.splitext(os.path.basename(pyx))[0]
        exts.append(
            Extension(
                "nlmfeature." + name,
                [pyx],
                include_dirs=[numpy.get_include(), "cython"],
                extra_compile_args=_capi_build().compile_args(),
                extra_link_args=_capi_build().link_args(),
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            )
        )
    return cythonize(
        exts,
        include_path=["cython"],
        compiler_directives=_capi_build().CYTHON_DIRECTIVES,
        nthreads=os.cpu_count() or 1,
    )


def _build_ext():
    """build_ext that also builds libnlmfeature.so, the C ABI (see src/nlmfeature/decoder/capi/build.py)."""
    return _capi_build().make_build_ext()


setup(
    name="nlmfeature",
    version="0.1.0",
    description="Feed-forward neural language models as features for Moses and cdec",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    if os.path.exists(os.path.join(HERE, "README.md"))
    else "",
    long_description_content_type="text/markdown",
    package_dir={"": "src"},
    packages=find_packages(where="src", include=["nlmfeature", "nlmfeature.*"]),
    package_data={"nlmfeature": ["data/*", "data/**/*", "decoder/capi/*.c", "decoder/capi/*.h", "decoder/capi/*.py", "lib/*.so", "include/*.h"]},
    cmdclass={"build_ext": _build_ext()},
    # the extensions compile side by side, one per core
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
    ext_modules=_extensions(),
    python_requires=">=3.9",
    install_requires=["numpy>=1.24", "sacrebleu>=2.0", "sacremoses>=0.1", "tqdm>=4.0"],
    extras_require={"test": ["pytest>=7", "pytest-xdist>=3", "Cython>=3.0"], "kenlm": ["kenlm"], "plot": ["matplotlib>=3"],
                    # the PyTorch training engine (train --engine torch); pinned: this version's CPU wheel
                    "torch": ["torch==2.13.0"]},
    entry_points={
        "console_scripts": [
            "nlmfeature=nlmfeature.cli:main",
            "nlmfeature-tune=nlmfeature.cli:tune_main",
            "nlmfeature-rescore=nlmfeature.cli:rescore_main",
            "nlmfeature-eval=nlmfeature.cli:eval_main",
        ]
    },
    zip_safe=False,
)
