"""Benchmarks that print figures (`nlmfeature bench ...`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import List, Tuple

#: the source checkout (``src/nlmfeature/bench`` -> the repository root)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def shared_data(*parts: str) -> str:
    """A path in the shared data folder the benchmarks default to: ``$NLMFEATURE_SHARED``
    (the folder holding ``data/``) when set, else ``../shared`` beside the source checkout,
    else ``../shared`` beside the current directory (an installed package run from a
    checkout).  The path is returned even when it does not exist (the benchmark's file
    check then names it and the flag that replaces it)."""
    roots = [os.environ.get("NLMFEATURE_SHARED", ""), os.path.join(REPO, "..", "shared"),
             os.path.join(os.getcwd(), "..", "shared")]
    roots = [os.path.normpath(r) for r in roots if r]
    for root in roots:
        if os.path.isdir(os.path.join(root, "data")):
            return os.path.join(root, "data", *parts)
    return os.path.join(roots[0], "data", *parts)


def rss_of(cmd: List[str]) -> Tuple[float, int, str]:
    """(seconds, peak RSS bytes of this command alone, stdout): the command runs under
    ``/usr/bin/time``-like accounting: a fresh Python that forks it and reports wait4's rusage."""
    from nlmfeature.errors import NLMFeatureError

    code = ("import os,sys,json,time,subprocess\n"
            "t=time.time(); p=subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)\n"
            "out,err=p.communicate()\n"
            "import resource; r=resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "print(json.dumps({'rc':p.returncode,'rss':r.ru_maxrss*1024,'secs':time.time()-t,"
            "'out':out.decode('utf-8','replace'),'err':err.decode('utf-8','replace')[-3000:]}))\n")
    proc = subprocess.run([sys.executable, "-c", code, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    if proc.returncode != 0:
        raise NLMFeatureError(f"measuring {' '.join(cmd[:6])} failed:\n{proc.stderr[-2000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    if r["rc"] != 0:
        raise NLMFeatureError(f"{' '.join(cmd[:8])} ... failed (exit {r['rc']}):\n{r['err']}")
    return float(r["secs"]), int(r["rss"]), r["out"]
