#!/bin/sh
# Moses decoding with the joint model (docs/joint.md, "Inside Moses"): KenLM alone, + NLM,
# + NNJM, + NLM + NNJM, each with the weights MERT found for that feature set in
# tools/joint_rescore.py (WORKDIR/tuned.{nlm,nnjm,nlm+nnjm}); prints BLEU and the sum of
# Moses' per-sentence "Translation took" times (loading excluded) per configuration.
#
#   tools/joint_decode.sh MOSES_BIN RESCORE_WORKDIR JOINT.nlm LM.nlm SRC REF OUTDIR [THREADS]
#
# MOSES_BIN must have NLMFeature and NLMJointFeature compiled in (moses_ff/README.md).
set -eu
MOSES=$1; R=$2; JOINT=$3; LM=$4; SRC=$5; REF=$6; OUT=$7; THREADS=${8:-2}
SYS=${SYS:-/work/shared/data/moses/multi30k-de-en}
mkdir -p "$OUT"
[ -f "$OUT/lm.bin" ] || "${KENLM_BIN:-/root/.cache/nlmfeature/kenlm/bin}/build_binary" "$SYS/lm.en.5g.arpa.gz" "$OUT/lm.bin" >/dev/null
sed -e "s#MODEL_DIR/lm.en.5g.arpa.gz#$OUT/lm.bin#" -e "s#MODEL_DIR/#$SYS/#" "$SYS/moses.tuned.ini" > "$OUT/kenlm.ini"
for cfg in nlm nnjm nlm+nnjm; do
  {
    sed -n '1,/^\[weight\]/p' "$OUT/kenlm.ini" | grep -v '^\[weight\]'
    case $cfg in nlm|nlm+nnjm) echo "NLMFeature name=NLM path=$LM";; esac
    case $cfg in nnjm|nlm+nnjm) echo "NLMJointFeature name=NNJM path=$JOINT";; esac
    echo; echo "[weight]"; cat "$R/tuned.$cfg"
  } > "$OUT/$cfg.ini"
done
for cfg in kenlm nlm nnjm nlm+nnjm; do
  "$MOSES" -f "$OUT/$cfg.ini" -i "$SRC" -threads "$THREADS" > "$OUT/$cfg.out" 2> "$OUT/$cfg.log"
  t=$(grep -o "Translation took [0-9.]* seconds" "$OUT/$cfg.log" | awk '{s += $3} END {print s}')
  echo "$cfg decode_seconds=$t $(python3 -m nlmfeature.mt.tuning.cli bleu "$OUT/$cfg.out" --ref "$REF" | head -1)"
done
