"""compare.py NAME [BASE]: test2016 BLEU of MERT seeds 1-3 of NAME against BASE's (default base),
paired bootstrap p per seed, and the mean difference."""
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(os.path.dirname(here))
shared = os.environ.get("NLMFEATURE_SHARED") or os.path.join(os.path.dirname(repo), "shared")
nbest = os.environ.get("NBEST") or os.path.join(shared, "data", "nbest", "moses-multi30k-de-en")
out = os.environ.get("OUT", "/tmp/nlmfeature-recipes")
name, base = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "base")
diffs, parts = [], []
for s in (1, 2, 3):
    r = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "eval", "--ref", os.path.join(nbest, "test.ref.en.gz"),
                        "--tokenize", "none", "--metrics", "bleu", "--bootstrap", "1000", "--json",
                        f"{out}/rs/{base}/test{s}.1best", f"{out}/rs/{name}/test{s}.1best"],
                       capture_output=True, text=True, cwd=repo, check=True)
    c = json.loads(r.stdout)["comparisons"][0]
    diffs.append(c["difference"])
    parts.append(f"seed {s}: {c['baseline']:.2f} -> {c['system']:.2f} ({c['difference']:+.2f}, p = {c['p_value']:.3f})")
print(f"{name}: " + " | ".join(parts) + f" | mean {sum(diffs) / len(diffs):+.2f}")
