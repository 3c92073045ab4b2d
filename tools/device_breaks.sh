#!/usr/bin/env bash
# issue 25's table on the device: benchmarks.break_table over every family (transformers,
# torchvision, timm), split over N processes (capture only, one CPU each), merged into
# $OUT/breaks.jsonl and $OUT/breaks.md. Usage: bash tools/device_breaks.sh [N] [seconds]
set -u
n=${1:-6}; limit=${2:-300}
out=${OUT:-/tmp}
names=$(python3 - <<'PY'
import sys
sys.argv = ["x"]
from benchmarks import break_table as b
print(",".join(b.DECODERS + b.ENCODERS + b.SEQ2SEQ + b.VISION + b._library_names()))
PY
)
IFS=, read -ra all <<< "$names"
for ((i = 0; i < n; i++)); do
  part=()
  for ((j = i; j < ${#all[@]}; j += n)); do part+=("${all[j]}"); done
  [ ${#part[@]} -eq 0 ] && continue
  (IFS=,; CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 timeout "$limit" python3 -m benchmarks.break_table \
     --models "${part[*]}" --out "$out/breaks_$i.jsonl" > "$out/breaks_$i.log" 2>&1) &
done
wait
cat "$out"/breaks_*.jsonl > "$out/breaks.jsonl"
python3 - "$out/breaks.jsonl" "$out/breaks.md" <<'PY'
import json, sys
from benchmarks import break_table as b
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
order = b.DECODERS + b.ENCODERS + b.SEQ2SEQ + b.VISION + b._library_names()
rows.sort(key=lambda r: (order.index(r["model"]) if r["model"] in order else 999, r["mode"]))
open(sys.argv[2], "w").write(b.markdown(rows))
print(f"{len(rows)} rows")
PY
