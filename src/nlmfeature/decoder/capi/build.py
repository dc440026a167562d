"""Build step for ``libnlmfeature.so`` (the C ABI), used by ``setup.py``.

``make_build_ext()`` returns a ``build_ext`` command that, after the Cython extensions,
compiles ``nlmfeature/decoder/capi/nlmfeature.c`` into ``nlmfeature/lib/libnlmfeature.so`` (hidden
visibility, only ``nlm_*`` exported, linked against the building Python's shared libpython
with an rpath) and copies ``nlmfeature.h`` to ``nlmfeature/include/``.  With ``--inplace``
(editable installs) both land in the source tree; otherwise in the build directory, from
where they are installed with the package.  ``nlmfeature config`` prints where they are.

This file is loaded by path (the package itself is not importable before it is built).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

CAPI_DIR = os.path.dirname(os.path.abspath(__file__))
LIB_NAME = "libnlmfeature.so"
SOURCES = ["nlmfeature.c"]
HEADERS = ["nlmfeature.h", "nlm_vtable.h"]
#: what decoders include (copied to the package's include/): the C API and the C++ client the
#: Moses and Moses2 features share
PUBLIC_HEADERS = ["nlmfeature.h", "nlmfeature_client.h"]


#: Cython directives of every extension (setup.py; tests that compile a variant)
CYTHON_DIRECTIVES = {"language_level": 3, "boundscheck": False, "wraparound": False, "cdivision": True,
                     "initializedcheck": False}


def sanitizers() -> list:
    """``NLMFEATURE_SANITIZE=address,undefined`` (or ``thread``): the sanitizers to build the
    extensions and libnlmfeature with (see docs/sanitizers.md); [] when unset."""
    names = [n.strip() for n in os.environ.get("NLMFEATURE_SANITIZE", "").split(",") if n.strip()]
    known = {"address", "undefined", "thread", "leak"}
    if set(names) - known:
        raise SystemExit(f"NLMFEATURE_SANITIZE: unknown sanitizers {sorted(set(names) - known)} "
                         f"(known: {', '.join(sorted(known))})")
    return names


def compile_args(portable: bool = None) -> list:
    """C compiler flags of the Cython extensions.  ``NLMFEATURE_PORTABLE=1`` (or
    ``portable=True``) leaves out ``-march=native`` (binaries for other CPUs);
    ``NLMFEATURE_SANITIZE`` adds sanitizer instrumentation (and -O1 -g)."""
    if portable is None:
        portable = bool(os.environ.get("NLMFEATURE_PORTABLE"))
    # -g0: Python's own flags ask for debug information, which made the compile of the
    # (large, generated) extensions ~40% slower; symbols for profilers are kept anyway
    args = ["-O3", "-g0", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
            "-fno-signed-zeros", "-fopenmp", "-Wno-unused-function", "-Wno-psabi"]
    if not portable:
        args.append("-march=native")
    san = sanitizers()
    if san:
        args += ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=" + ",".join(san)]
        if "undefined" in san:
            args.append("-fno-sanitize-recover=undefined")
    return args


def link_args() -> list:
    """Linker flags of the Cython extensions."""
    san = sanitizers()
    return ["-fopenmp"] + (["-fsanitize=" + ",".join(san)] if san else [])


def _python_link_args() -> list:
    """Linker arguments for the shared libpython of this interpreter."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ver = sysconfig.get_config_var("LDVERSION") or sysconfig.get_config_var("VERSION")
    args = []
    if libdir:
        args += [f"-L{libdir}", f"-Wl,-rpath,{libdir}"]
    args += [f"-lpython{ver}", "-ldl", "-lpthread", "-lm"]
    return args


def build_python() -> str:
    """The interpreter libnlmfeature starts when its process has none: the one building it,
    by the path it was started with.  Inside a virtualenv that is the venv's ``bin/python``
    (a symlink whose real path is the base interpreter: resolving it would start the base
    Python, with the base site-packages and numpy instead of the venv's)."""
    exe = sys.executable
    if not os.path.isabs(exe):
        exe = os.path.abspath(exe)
    return exe


def _newer(target: str, sources: list) -> bool:
    if not os.path.exists(target):
        return True
    t = os.path.getmtime(target)
    return any(os.path.getmtime(s) > t for s in sources)


def build_library(package_dir: str, temp_dir: str, force: bool = False, verbose: bool = False) -> str:
    """Compile and link ``libnlmfeature.so`` into ``package_dir/lib``; returns its path."""
    lib_dir = os.path.join(package_dir, "lib")
    inc_dir = os.path.join(package_dir, "include")
    os.makedirs(lib_dir, exist_ok=True)
    os.makedirs(inc_dir, exist_ok=True)
    for header in PUBLIC_HEADERS:
        shutil.copy2(os.path.join(CAPI_DIR, header), os.path.join(inc_dir, header))
    target = os.path.join(lib_dir, LIB_NAME)
    sources = [os.path.join(CAPI_DIR, s) for s in SOURCES + HEADERS]
    # the library embeds the interpreter that builds it: another one (a venv) or other
    # sanitizers mean a rebuild even when the sources are older
    stamp = json.dumps({"python": build_python(), "sanitize": sanitizers()})
    stamp_path = target + ".build"
    old_stamp = open(stamp_path).read() if os.path.exists(stamp_path) else ""
    if not force and old_stamp == stamp and not _newer(target, sources + [__file__]):
        return target
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        print("warning: this Python has no shared libpython; libnlmfeature.so (the C library for "
              "decoders) is not built", file=sys.stderr)
        return ""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    os.makedirs(temp_dir, exist_ok=True)
    version_script = os.path.join(temp_dir, "libnlmfeature.map")
    with open(version_script, "w") as f:
        f.write("{ global: nlm_*; local: *; };\n")
    tmp = os.path.join(temp_dir, LIB_NAME + ".tmp")
    san = sanitizers()
    cmd = cc + [
        "-shared", "-fPIC", "-O2", "-g", "-std=gnu99", "-Wall", "-fvisibility=hidden",
        *(["-O1", "-fno-omit-frame-pointer", "-fsanitize=" + ",".join(san)] if san else []),
        f"-I{sysconfig.get_paths()['include']}", f"-I{CAPI_DIR}",
        f"-DNLM_BUILD_PYTHON={json.dumps(build_python())}",
        os.path.join(CAPI_DIR, "nlmfeature.c"), "-o", tmp,
        f"-Wl,--version-script={version_script}", "-Wl,-soname," + LIB_NAME,
    ] + _python_link_args()
    if verbose:
        print(" ".join(shlex.quote(c) for c in cmd))
    subprocess.check_call(cmd)
    os.replace(tmp, target)
    with open(stamp_path, "w") as f:
        f.write(stamp)
    return target


def make_build_ext():
    """The ``build_ext`` command class of ``setup.py`` (Cython extensions + the C library)."""
    from setuptools.command.build_ext import build_ext

    class BuildExtWithCAPI(build_ext):
        def finalize_options(self) -> None:
            """Compile the extensions side by side, one per core, by whichever path the build
            comes (``pip install``, ``pip install -e`` or ``setup.py build_ext``): pip's
            editable builds re-create this command without ``setup()``'s options, and
            compiled the extensions one after another."""
            super().finalize_options()
            if not self.parallel:
                self.parallel = os.cpu_count() or 1

        def build_extensions(self) -> None:
            """The largest generated sources first: the cores finish together instead of one
            compiling the largest extension alone at the end."""
            def size(ext) -> int:
                return sum(os.path.getsize(s) for s in ext.sources if os.path.exists(s))
            self.extensions = sorted(self.extensions, key=size, reverse=True)
            super().build_extensions()

        def copy_file(self, infile, outfile, *args, **kwargs):
            """Replace built modules by rename, never by rewriting them in place: a decoder or
            Python process that has the old module mapped keeps a valid copy instead of
            crashing when ``build_ext --inplace`` runs under it."""
            if not str(outfile).endswith(".so") or os.path.isdir(outfile):
                return super().copy_file(infile, outfile, *args, **kwargs)
            tmp = f"{outfile}.tmp{os.getpid()}"
            result = super().copy_file(infile, tmp, *args, **kwargs)
            os.replace(tmp, outfile)
            return (outfile, result[1]) if isinstance(result, tuple) else result

        def run(self) -> None:
            super().run()
            if self.inplace or getattr(self, "editable_mode", False):
                package_dir = os.path.dirname(os.path.dirname(CAPI_DIR))
            else:
                package_dir = os.path.join(self.build_lib, "nlmfeature")
            build_library(package_dir, self.build_temp, force=bool(self.force),
                          verbose=bool(self.verbose))

    return BuildExtWithCAPI
