#!/usr/bin/env bash
# Sanitizer runs of the native code (extensions + libnlmfeature), see docs/sanitizers.md.
#
#   tools/sanitize.sh asan [DIR]   AddressSanitizer + UndefinedBehaviorSanitizer: builds a copy
#                                  of this checkout in DIR (default /tmp/nlmfeature-asan) with
#                                  NLMFEATURE_SANITIZE=address,undefined and runs the scorer,
#                                  model-file, C API, cache, k-best and boundary tests under it
#   tools/sanitize.sh tsan [DIR]   ThreadSanitizer: builds with NLMFEATURE_SANITIZE=thread and
#                                  runs tests/c/test_capi.c scoring from 8 threads (plain and
#                                  with a persistent cache), twice
#
# The copy keeps the normal in-place build of this checkout untouched.  Python itself is not
# instrumented: the ASan runtime is preloaded (LD_PRELOAD), leak checking is off (the
# interpreter keeps memory until exit by design).  Exit status 0 = no sanitizer report.
set -euo pipefail
mode=${1:?usage: tools/sanitize.sh asan|tsan [DIR]}
src="$(cd "$(dirname "$0")/.." && pwd)"
case $mode in
  asan) san=address,undefined ;;
  tsan) san=thread ;;
  *) echo "usage: tools/sanitize.sh asan|tsan [DIR]" >&2; exit 2 ;;
esac
dir=${2:-/tmp/nlmfeature-$mode}
shift; [ $# -gt 0 ] && shift  # the rest: extra pytest arguments
mkdir -p "$dir"
# the sources (tracked and new files), not the build products
(cd "$src" && git ls-files -co --exclude-standard | tar -cf - -T -) | tar -xf - -C "$dir"
cd "$dir"
echo "== building with NLMFEATURE_SANITIZE=$san in $dir" >&2
NLMFEATURE_SANITIZE=$san python3 setup.py build_ext --inplace -q > build.log 2>&1 || { tail -30 build.log; exit 1; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
if [ "$mode" = asan ]; then
  # the instrumented copy, not an installed nlmfeature (src/ layout: the package is in src/)
  export PYTHONPATH="$dir/src${PYTHONPATH:+:$PYTHONPATH}"
  python3 -c 'import importlib.util as u, sys; o = u.find_spec("nlmfeature").origin; sys.exit(0 if o.startswith(sys.argv[1]) else "the sanitizer copy is not the package imported: " + o)' "$dir/src"
  export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1:verify_asan_link_order=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  python3 -m pytest -q -x -p no:cacheprovider tests/test_scorer.py tests/test_modelfile.py tests/test_capi.py \
    tests/test_pcache.py tests/test_kbest.py tests/test_boundary.py tests/test_nplm.py tests/test_joint.py "$@" 2>&1 | tee asan.log
  status=${PIPESTATUS[0]}
  if grep -q -e "ERROR: AddressSanitizer" -e "runtime error:" asan.log; then status=1; fi
  exit $status
fi
# tsan: the C test program from 8 threads.  Python steps run on the normal build of the
# source checkout (a Python process cannot dlopen the TSan runtime); the program itself
# carries the runtime and loads the instrumented library and extensions.
cc -O1 -g -fsanitize=thread -I"$dir/src/nlmfeature/include" tests/c/test_capi.c -o test_capi_tsan \
  -L"$dir/src/nlmfeature/lib" -Wl,-rpath,"$dir/src/nlmfeature/lib" -lnlmfeature -lpthread -lm
(cd "$src" && PYTHONPATH="$src/src" python3 - "$dir" <<'PY'
import sys
sys.path.insert(0, "tests")
from helpers import make_model, read_lines, BROWN_VALID
d = sys.argv[1]
make_model(d, "tsan-class.nlm", order=4, output="class", classes=30, min_count=4)
make_model(d, "tsan-unnorm.nlm", order=5, min_count=4)
open(d + "/tsan-text.txt", "w").write("\n".join(read_lines(BROWN_VALID, 60)) + "\n")
PY
)
export TSAN_OPTIONS="halt_on_error=0 report_signal_unsafe=0 history_size=4"
status=0
for m in tsan-class.nlm tsan-unnorm.nlm; do
  for extra in "" "--pcache tsan-pcache"; do
    echo "== test_capi score $m --threads 8 $extra" >&2
    # the cache is used for every model (the policy would skip it for the unnormalised one)
    NLMFEATURE_PERSISTENT_CACHE=always ./test_capi_tsan score $m tsan-text.txt --threads 8 $extra \
      > /dev/null 2> tsan.err || status=1
    grep -v '^stats ' tsan.err || true
    if grep -q "WARNING: ThreadSanitizer" tsan.err; then status=1; fi
  done
done
exit $status
