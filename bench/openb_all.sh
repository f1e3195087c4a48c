#!/usr/bin/env bash
# Every openb workload present x {random, best-fit, fgd, fence-pack} through bench/openb.py, then
# a markdown table of GPU allocation % at 130% arrived: ours beside the published FGD means.
#
#   bash bench/openb_all.sh                      # seeds 42..51, all cores, -> bench/openb_results.md
#   SEEDS=42..43 JOBS=2 OUT=/tmp/t.md bash bench/openb_all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TRACES=${TRACES:-../shared/traces}
SEEDS=${SEEDS:-42..51}
JOBS=${JOBS:-$(nproc)}
OUT=${OUT:-bench/openb_results.md}
POLICIES=${POLICIES:-"random best-fit fgd fence-pack"}
LOGS=$(mktemp -d)
workloads=$(ls "$TRACES"/alibaba-gpu-v2023/openb_pod_list_*.csv | sed 's/.*openb_pod_list_//; s/\.csv$//')
for w in $workloads; do for p in $POLICIES; do echo "$w $p"; done; done |
  xargs -P "$JOBS" -L 1 sh -c 'PYTHONPATH=src python bench/openb.py --workload "$0" --policy "$1" \
    --seeds "'"$SEEDS"'" --traces "'"$TRACES"'" > "'"$LOGS"'/$0.$1.log" 2>&1 || true'
python - "$LOGS" "$TRACES" "$SEEDS" "$POLICIES" > "$OUT" <<'PY'
import csv, sys
from pathlib import Path
logs, traces, seeds, policies = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4].split()
pub = {}
with open(traces / "fgd-expected-results" / "summary_by_workload_policy.csv") as f:
    for r in csv.DictReader(f):
        pub[(r["workload"].removeprefix("openb_pod_list_"), r["sc_policy"])] = float(r["alloc_pct_at_130"])
name = {"random": "01-Random", "best-fit": "05-BestFit", "fgd": "06-FGD", "fence-pack": "06-FGD"}
def ours(w, p):
    f = logs / f"{w}.{p}.log"
    last = f.read_text().strip().splitlines()[-1] if f.is_file() else ""
    return float(last.split()[0].split("=")[1]) if last.startswith("alloc_pct_at_130=") else float("nan")
ws = sorted({f.name.split(".")[0] for f in logs.glob("*.log")})
print(f"GPU allocation % at 130% arrived, mean of seeds {seeds} (ours) vs the published mean of seeds 42..51.\n")
head = " | ".join(f"{p} ours | pub" for p in policies)
print(f"| workload | {head} | fence-pack − pub FGD |")
print("|---" * (2 * len(policies) + 2) + "|")
for w in ws:
    cells = []
    for p in policies:
        cells += [f"{ours(w, p):.2f}", f"{pub.get((w, name[p]), float('nan')):.2f}"]
    gain = ours(w, "fence-pack") - pub.get((w, "06-FGD"), float("nan"))
    print(f"| {w} | {' | '.join(cells)} | {gain:+.2f} |")
PY
echo "wrote $OUT (logs in $LOGS)"
