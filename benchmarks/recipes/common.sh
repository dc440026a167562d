# shared settings of the recipe scripts (sourced)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# the benchmark data: $NBEST, else $NLMFEATURE_SHARED/data/..., else ../shared beside the checkout
SHARED=${NLMFEATURE_SHARED:-$(cd "$REPO/.." && pwd)/shared}
NBEST=${NBEST:-$SHARED/data/nbest/moses-multi30k-de-en}
OUT=${OUT:-/tmp/nlmfeature-recipes}
mkdir -p "$OUT"
cd "$REPO"
