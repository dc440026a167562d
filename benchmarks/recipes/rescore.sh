#!/bin/bash
# rescore.sh NAME MODEL...: add the models' features to dev iterations 1-4 and test, MERT seeds 1-3 on dev,
# rerank test with each; NAME=base tunes without the neural features (MODEL only serves the reranking call)
set -e
. "$(dirname "$0")/common.sh"
NAME=$1; shift
M=(); for m in "$@"; do M+=(-m "$m"); done
O=$OUT/rs/$NAME; mkdir -p "$O"
if [ "$NAME" = base ]; then
  LISTS=(); for it in 1 2 3 4; do LISTS+=(--nbest "$NBEST/dev.iter$it.100best.gz"); done
  INIT=$NBEST/dev.iter1.moses.ini
else
  LISTS=()
  for it in 1 2 3 4; do
    python3 -m nlmfeature.cli rescore "${M[@]}" -i "$NBEST/dev.iter$it.100best.gz" -o "$O/dev$it.gz" -j 1 --batch-size 32768 -q
    LISTS+=(--nbest "$O/dev$it.gz")
  done
  python3 - "$O" $# "$NBEST/dev.iter1.moses.ini" <<'PY'
import sys
from nlmfeature.mt.weights import read_weights, write_weights
o, n, ini = sys.argv[1], int(sys.argv[2]), sys.argv[3]
w = read_weights(ini)
for i in range(n):
    w[f"NLM{i}"] = [0.05]
write_weights(o + "/init.weights", w)
PY
  INIT=$O/init.weights
fi
for s in 1 2 3; do
  python3 -m nlmfeature.cli tune optimise "${LISTS[@]}" --ref "$NBEST/dev.ref.en.gz" --init "$INIT" \
      --algorithm mert --seed $s --jobs 1 --out "$O/w$s" --quiet
  python3 -m nlmfeature.cli rescore "${M[@]}" -i "$NBEST/test.tuned.100best.gz" --weights "$O/w$s" \
      --one-best "$O/test$s.1best" -j 1 --batch-size 32768 -q
done
