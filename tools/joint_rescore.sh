#!/bin/sh
# Rescoring gain of the joint model on Multi30k de-en (docs/joint.md, "Rescoring"):
# decode dev and test2016 with the KenLM-tuned Moses system (100-best with word alignments),
# add NLM (target-only) and NNJM (joint) features, tune reranking weights by MERT on dev for
# each feature set, and report test2016 BLEU of the reranked 1-best.
#
#   tools/joint_rescore.sh MOSES_BIN WORKDIR JOINT.nlm LM.nlm DATA_DIR
#
# MOSES_BIN: any moses-cmd (no nlmfeature feature needed); WORKDIR: where lists and weights go;
# DATA_DIR holds dev.de, dev.en, test.de, test.en (tokenised, lowercased); the Moses system is
# /work/shared/data/moses/multi30k-de-en with its MERT-tuned (KenLM alone) weights.
set -eu
MOSES=$1; W=$2; JOINT=$3; LM=$4; DATA=$5
SYS=${SYS:-/work/shared/data/moses/multi30k-de-en}
THREADS=${THREADS:-2}
PY=${PYTHON:-python3}
mkdir -p "$W"
if [ ! -f "$W/lm.bin" ]; then
  "${KENLM_BIN:-/root/.cache/nlmfeature/kenlm/bin}/build_binary" "$SYS/lm.en.5g.arpa.gz" "$W/lm.bin" >/dev/null
fi
sed -e "s#MODEL_DIR/lm.en.5g.arpa.gz#$W/lm.bin#" -e "s#MODEL_DIR/#$SYS/#" "$SYS/moses.tuned.ini" > "$W/moses.ini"
for set in dev test; do
  if [ ! -f "$W/$set.100best.gz" ]; then
    "$MOSES" -f "$W/moses.ini" -i "$DATA/$set.de" -threads "$THREADS" -n-best-list "$W/$set.100best" 100 \
      -print-alignment-info-in-n-best true > "$W/$set.1best" 2> "$W/$set.decode.log"
    gzip -f "$W/$set.100best"
  fi
  $PY -m nlmfeature.rescore -q -m "$LM" -m "$JOINT" --name NLM --name NNJM --source "$DATA/$set.de" \
    -i "$W/$set.100best.gz" -o "$W/$set.resc.100best.gz"
done
# initial weights: the tuned ones plus 0.1 for each new feature; features absent from a
# configuration are dropped from its lists' weights (weight 0)
grep -v '^#' "$W/moses.ini" | sed -n '/^\[weight\]/,$p' | grep '=' > "$W/w.kenlm"
{ cat "$W/w.kenlm"; echo "NLM= 0.1"; } > "$W/w.nlm"
{ cat "$W/w.kenlm"; echo "NNJM= 0.1"; } > "$W/w.nnjm"
{ cat "$W/w.kenlm"; echo "NLM= 0.1"; echo "NNJM= 0.1"; } > "$W/w.both"
echo "config dev-BLEU(reranked) test-BLEU(reranked)"
for cfg in kenlm nlm nnjm both; do
  case $cfg in
    kenlm) drop='NLM= |NNJM= ';; nlm) drop='NNJM= ';; nnjm) drop='NLM= ';; both) drop='@@none@@';;
  esac
  for set in dev test; do  # the list without the features this configuration leaves out
    $PY - "$W/$set.resc.100best.gz" "$W/$set.$cfg.100best.gz" "$drop" <<'EOF'
import gzip, re, sys
src, dst, drop = sys.argv[1:]
pat = re.compile(r" (%s)\S+" % drop)
with gzip.open(src, "rt", encoding="utf-8") as f, gzip.open(dst, "wt", encoding="utf-8") as g:
    for line in f:
        p = line.split(" ||| ")
        p[2] = pat.sub("", p[2])
        g.write(" ||| ".join(p))
EOF
  done
  $PY -m nlmfeature.tuning.cli optimise --quiet --nbest "$W/dev.$cfg.100best.gz" --init "$W/w.$cfg" \
    --ref "$DATA/dev.en" --out "$W/tuned.$cfg" --output-1best "$W/dev.$cfg.1best" --jobs "$THREADS" > /dev/null
  $PY - "$W/test.$cfg.100best.gz" "$W/tuned.$cfg" "$W/test.$cfg.1best" <<'EOF'
import sys
from nlmfeature.kbest import read_kbest
from nlmfeature.weights import read_weights
kb, wpath, out = sys.argv[1:]
w = read_weights(wpath)
best = {}
for h in read_kbest(kb):
    s = sum(a * b for lbl, vals in h.features for a, b in zip(w.get(lbl) or [0.0] * len(vals), vals))
    if h.sid not in best or s > best[h.sid][0]:
        best[h.sid] = (s, h.text)
with open(out, "w", encoding="utf-8") as f:
    for sid in range(max(best) + 1):
        f.write(best.get(sid, (0, ""))[1] + "\n")
EOF
  d=$($PY -m nlmfeature.tuning.cli bleu "$W/dev.$cfg.1best" --ref "$DATA/dev.en" | head -1)
  t=$($PY -m nlmfeature.tuning.cli bleu "$W/test.$cfg.1best" --ref "$DATA/test.en" | head -1)
  echo "$cfg | $d | $t"
done
