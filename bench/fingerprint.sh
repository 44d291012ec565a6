#!/usr/bin/env bash
# Write the JSON outputs a refactoring must leave unchanged into DIR (default .fingerprint/):
# every scenario of ../shared/scenarios under each policy and the FIFO baseline, three chaos runs,
# and a short trace replay. Compare two runs with `diff -r DIR1 DIR2`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.fingerprint}
gputask=${GPUTASK:-.venv/bin/gputask}
trace=${TRACE_DIR:-../shared/data/alibaba-gpu-v2023/csv}
mkdir -p "$out"
for f in ../shared/scenarios/*.yaml; do
  for p in packing fgd bestfit firstfit fifo; do
    "$gputask" scenario run "$f" --output json --policy "$p" > "$out/$(basename "$f" .yaml).$p.json"
  done
done
for seed in 1 2 3; do
  "$gputask" scenario chaos --nodes 40 --tasks 400 --seed "$seed" --load 1 --write "$out/chaos.$seed.yaml" > "$out/chaos.$seed.json"
  "$gputask" scenario run "$out/chaos.$seed.yaml" --output json > "$out/chaos.$seed.run.json"
done
if [ -d "$trace" ]; then
  "$gputask" simulate --trace-dir "$trace" --seeds 42-43 --output json --policy packing --policy bestfit \
    --policy fgd > "$out/simulate.json"
fi
echo "wrote $(ls "$out" | wc -l) files into $out"
