#!/usr/bin/env bash
# The test suite on the device machine, in parts that each fit one device call (10 minutes).
# Usage (from the repo root on the device, after device-prep's wheel install):
#   bash tools/device_suite.sh A:230 B:330      # part:seconds, run one after another
# Each part writes $OUT/suite_<part>.log with -vv (pyproject's -q takes one v back), so a part killed at its limit still names
# every test that ran and failed (a -q run killed after [100%] prints nothing).
set -u
declare -A PARTS=(
  [A]="tests/capture tests/autograd tests/benchmarks tests/distributed tests/graph"
  [B]="tests/inductor tests/interop tests/meta tests/observe tests/runtime tests/workloads"
  [M]="tests/models --deselect tests/models/test_torchvision_timm.py"
  [C]="tests/ops tests/test_api.py tests/test_api_args.py tests/test_config.py tests/test_default_dtype_device.py tests/test_dynamic.py tests/test_eager_runs.py tests/test_hooks.py tests/test_layers.py tests/test_memory_refs.py tests/test_packaging.py tests/test_pipeline_driver.py tests/test_threads.py"
  [TV]="tests/models/test_torchvision_timm.py"
)
out=${OUT:-/tmp}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-device-cache}
for spec in "$@"; do
  part=${spec%%:*}; limit=${spec##*:}
  workers=${WORKERS:-16}
  [ "$part" = TV ] && workers=10
  echo "=== part $part (${PARTS[$part]}) limit ${limit}s -n $workers"
  start=$(date +%s)
  timeout "$limit" python3 -m pytest -n "$workers" -p no:cacheprovider -vv -rfE --tb=short \
    ${PARTS[$part]} > "$out/suite_$part.log" 2>&1
  rc=$?
  echo "part $part rc=$rc in $(( $(date +%s) - start ))s"
  grep -E '^(FAILED|ERROR) |passed|failed' "$out/suite_$part.log" | tail -15
  grep -cE ' PASSED ' "$out/suite_$part.log" | sed 's/^/PASSED lines: /'
  grep -E ' (FAILED|ERROR) ' "$out/suite_$part.log" | head -20
done
