#!/usr/bin/env bash
# trak_dist as a user installs it (issue 13): build the sdist and the wheel (`python -m build`
# builds the wheel from the sdist, so both are checked), install the wheel into a fresh venv
# outside the checkout (torch first, pinned, then the wheel and its dependencies: nothing from the
# checkout's .venv), and from an empty directory run what a user runs: `import trak_dist`, the
# CLI's --version and --help, the embedded default job, a sweep, the SLURM launcher (--help, and a
# real array job when a SLURM is up), and `trak-dist build-cuda` when nvcc is here.
#
#   bash .ci/wheel-check.sh            # after `make install-test` (its .venv has `build`)
#
# Environment: PYTHON (the new venv's interpreter, default python3), TORCH_SPEC (default
# torch==2.13.0, as the Makefile's), BUILD_PYTHON (runs `python -m build`, default .venv's),
# KEEP=1 keeps the work directory. TRAK_DIST_REQUIRE_SLURM=1 (CI) fails instead of falling back
# to submitit's local executor when no SLURM node is idle.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
BUILD_PYTHON=${BUILD_PYTHON:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trak-wheel-check.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
step() { printf '\n== wheel-check %4ds: %s\n' "$SECONDS" "$*"; }
quiet() {  # run "$@" with its output in a log, shown only if it fails
  local log="$WORK/step.log"
  "$@" >"$log" 2>&1 || { local rc=$?; tail -n 60 "$log"; echo "wheel-check: failed ($rc): $*"; exit 1; }
}

step "python -m build: sdist, then the wheel from the sdist"
quiet "$BUILD_PYTHON" -m build --outdir "$WORK/dist" "$ROOT"
WHEEL=$(echo "$WORK"/dist/trak_dist-*.whl)
ls -l "$WORK"/dist

step "the wheel holds every tracked file of trak_dist/, launch/, conf/ and cuda_ext/"
git -C "$ROOT" ls-files trak_dist launch conf cuda_ext | "$PYTHON" -c '
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
where = {"trak_dist": "trak_dist", "launch": "trak_dist/launch", "conf": "trak_dist/conf",
         "cuda_ext": "trak_dist/cuda_ext"}
tracked = [line.strip() for line in sys.stdin if line.strip()]
missing = [f for f in tracked if where[f.split("/")[0]] + f[f.index("/"):] not in names]
assert tracked and not missing, f"not in the wheel: {missing}"
print(f"{len(tracked)} files in place")
' "$WHEEL"

step "a fresh venv: $TORCH_SPEC, then the wheel (submitit is a dependency: no extra)"
"$PYTHON" -m venv "$WORK/venv"
V="$WORK/venv/bin"
# --no-compile: byte-compiling all of torch up front made its install take 187 s instead of 58 s
# (one after the other on this shared 2-core machine); Python compiles what it imports anyway.
# Word splitting wanted: TORCH_SPEC may carry pip flags (--index-url …), as in the Makefile.
# shellcheck disable=SC2086
quiet "$V/python" -m pip install --no-compile $TORCH_SPEC
quiet "$V/python" -m pip install --no-compile "$WHEEL"

# From an empty directory, with nothing of the checkout reachable: no PYTHONPATH, no config or
# kernel override, and the venv's scripts first on PATH.
RUN="$WORK/run"
mkdir "$RUN"
cd "$RUN"
unset PYTHONPATH TRAK_DIST_CONF TRAK_DIST_CUDA_LIB RAY_ADDRESS VIRTUAL_ENV
export PATH="$V:$PATH" RAY_USAGE_STATS_ENABLED=0

step "import trak_dist with no conf/ nearby: the installed package and its bundled configs"
python - <<'EOF'
import sys
from pathlib import Path

import trak_dist
import trak_dist.cli

pkg = Path(trak_dist.__file__).parent
assert pkg.is_relative_to(sys.prefix), f"trak_dist imported from {pkg}, not from {sys.prefix}"
assert not Path("conf").exists()
assert trak_dist.cli.conf_dir() == pkg / "conf", trak_dist.cli.conf_dir()
print(f"trak_dist {trak_dist.__version__} from {pkg}")
EOF

step "trak-dist --version and --help"
want=$(cd "$ROOT" && "$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
got=$(trak-dist --version)
echo "$got"
fmt=$(python -c 'import trak_dist.store as s; print(s.FORMAT_VERSION)')
[ "$got" = "trak-dist $want (store format version $fmt)" ] || { echo "wheel-check: expected 'trak-dist $want (store format version $fmt)'"; exit 1; }
trak-dist --help > help.txt
grep -q "cluster: inprocess, local, ray, slurm" help.txt || { cat help.txt; exit 1; }

step "the embedded default job (proj_dim=64, one worker)"
quiet trak-dist proj_dim=64 lambda_reg=1e-2 progress=false cluster.num_workers=1 hydra.run.dir=job
python - <<EOF
import json
r = json.load(open("job/trak_report.json"))
assert r["rows_computed"] == {"train": 3 * 1500, "target": 3 * 297}, r["rows_computed"]
assert r["trak_dist_version"] == "$want" and r["store_format_version"] == $fmt, r
assert r["variants"][0]["proponent_label_agreement"] > 0.2, r["variants"]  # chance: 0.1
print("report:", {k: r[k] for k in ("n", "m", "checkpoints", "trak_dist_version")})
EOF

step "a sweep: -m proj_dim=32,64 on the same store (featurised already: nothing recomputed)"
quiet trak-dist -m proj_dim=32,64 lambda_reg=1e-2 progress=false cluster.num_workers=1 \
  hydra.sweep.dir=sweep
python - <<'EOF'
import json
from pathlib import Path

reports = [json.loads(p.read_text()) for p in sorted(Path("sweep").glob("*/trak_report.json"))]
assert sorted(r["variants"][0]["proj_dim"] for r in reports) == [32, 64], reports
assert all(sum(r["rows_computed"].values()) == 0 for r in reports)
assert Path("sweep/sweep_summary.md").is_file()
print(Path("sweep/sweep_summary.md").read_text())
EOF

step "the SLURM launcher: --help of both entries"
trak-dist-slurm --help | grep -q "{ray,array}"
python -m trak_dist.launch.slurm array --help | grep -q -- "--tasks"
idle=$(sinfo -h -o %T 2>/dev/null | grep -cE '^(idle|mix)' || true)
if [ "${idle:-0}" -gt 0 ]; then
  mode=(); what="on SLURM"
elif [ "${TRAK_DIST_REQUIRE_SLURM:-0}" = 1 ]; then
  echo "wheel-check: no idle SLURM node (TRAK_DIST_REQUIRE_SLURM=1)"; exit 1
else
  mode=(--local); what="with submitit's local executor (no idle SLURM node here)"
fi
step "the SLURM launcher starts: an array task and its reduce job $what, on a new store"
quiet trak-dist-slurm array --tasks 1 --time-min 10 --mem-gb 4 --folder slurm --wait "${mode[@]}" \
  -- store.path="$RUN/slurm.zarr" proj_dim=32 lambda_reg=1e-2 progress=false
python - <<'EOF'
import json
from pathlib import Path

r = json.loads(Path("slurm/report/trak_report.json").read_text())
assert r["variants"][0]["proj_dim"] == 32 and r["n"] == 1500, r
print("report:", Path("slurm/report/trak_report.md").resolve())
EOF

if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  step "trak-dist build-cuda: the kernel from the installed sources, where the package looks"
  # one architecture and its PTX: the sources and the lookup are what is checked here (the
  # default sm_80 + sm_90 build is tests/projection/test_cuda.py's), at half the compile time
  quiet trak-dist build-cuda --archs sm_80 --ptx-arch compute_80
  python -c '
import sys
from trak_dist.projection._cuda_lib import load_library
lib = load_library()
assert lib.path.is_relative_to(sys.prefix), lib.path
assert "archs sm_80 compute_80" in lib.build_info(), lib.build_info()
print(lib.path, lib.build_info())
'
else
  step "trak-dist build-cuda: skipped, no nvcc here"
fi

step "passed"
