#!/bin/bash
# train.sh NAME [flags]: train OUT/NAME.nlm on the Multi30k English side (dev held out), then its perplexity
set -e
. "$(dirname "$0")/common.sh"
NAME=$1; shift
env OMP_WAIT_POLICY=passive python3 -m nlmfeature.cli train --train "$NBEST/train.tok.lc.en.gz" \
    --test-set "$NBEST/dev.ref.en.gz" --model-out "$OUT/$NAME.nlm" --threads 1 "$@" --no-progress --no-resume \
    > "$OUT/$NAME.log" 2>&1
tail -1 "$OUT/$NAME.log"
python3 "$HERE/ppl.py" "$OUT/$NAME.nlm" "$NBEST/test.ref.en.gz" "$NBEST/dev.ref.en.gz" "$NBEST/train.tok.lc.en.gz" \
    | tee "$OUT/$NAME.ppl"
