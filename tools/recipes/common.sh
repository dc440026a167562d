# shared settings of the recipe scripts (sourced)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
NBEST=${NBEST:-$(cd "$REPO/.." && pwd)/shared/data/nbest/moses-multi30k-de-en}
[ -d "$NBEST" ] || NBEST=/work/shared/data/nbest/moses-multi30k-de-en
OUT=${OUT:-/tmp/nlmfeature-recipes}
mkdir -p "$OUT"
cd "$REPO"
