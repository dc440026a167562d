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
    # name, version, dependencies and scripts: pyproject.toml
    package_dir={"": "src"},
    packages=find_packages(where="src", include=["nlmfeature", "nlmfeature.*"]),
    package_data={"nlmfeature": ["data/*", "data/**/*", "decoder/capi/*.c", "decoder/capi/*.h", "decoder/capi/*.py", "lib/*.so", "include/*.h"]},
    # the command compiles the extensions side by side, one per core
    cmdclass={"build_ext": _build_ext()},
    ext_modules=_extensions(),
    zip_safe=False,
)
