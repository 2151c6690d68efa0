#!/usr/bin/env bash
# The GPU check (issue 28): every GPU path of trak_dist, one markdown report.
#
#   make device-wheels                                   # here, once: .device/gpu (travels)
#   bash benchmarks/device_check.sh OUTDIR               # on a lent GPU machine, ≤ 8 min
#   bash benchmarks/device_check.sh --cpu-dry-run OUTDIR # here: every section at tiny sizes
#   bash benchmarks/device_check.sh OUTDIR --only kernel,projection
#
# On the device tool: command `bash benchmarks/device_check.sh "$OUT"`, carry [".device/gpu"],
# timeout_s 540 (cuda_ext/README.md, "The GPU check"). The report is OUTDIR/device_check.md,
# with device_check.json (every number) and device_check.log (the whole output) beside it.
# benchmarks/device/__main__.py says what runs; the sections are benchmarks/device/*.py.
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
for arg in "$@"; do
  if [ "$arg" = --cpu-dry-run ]; then dry=1; fi
done
if [ "$dry" = 1 ]; then
  PY=${PY:-.venv/bin/python}          # make install-test's venv, the image's stand-in
elif [ -z "${PY:-}" ] && [ -x /opt/torch/.venv/bin/python3 ]; then
  PY=/opt/torch/.venv/bin/python3     # the lent machines' Python with their CUDA torch
else
  PY=${PY:-python3}
fi
export PYTHONUNBUFFERED=1
exec "$PY" -m benchmarks.device "$@"
