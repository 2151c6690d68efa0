#!/usr/bin/env bash
# `make device-wheels`: prepares, here, everything a lent GPU machine (no network; Python 3.12,
# a CUDA torch, transformers, pytest, nvcc: benchmarks/device/image_packages.txt) lacks for
# benchmarks/device_check.sh:
#   .device/gpu/     the wheels of benchmarks/device/wheels.txt the image lacks, resolved for
#                    CPython 3.12 manylinux x86-64 (antlr4's runtime is an sdist on PyPI: its
#                    wheel is built here), and traker's fast_jl sdist (built there). Travels.
#   .device/dryrun/  the same distributions at the same versions for this Python: the CPU dry
#                    run (`device_check.sh --cpu-dry-run`) installs these. Never travels.
# Checks: the set is closed (every requirement met by the set or the image), under 60 MiB, and
# the working tree plus the set under the device tool's 64 MiB. Prints what must travel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DEV=.device
LIMIT_MIB=60
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
pip=("$PY" -m pip --disable-pip-version-check)

rm -rf "$DEV/gpu" "$DEV/dryrun" "$DEV/tmp"
mkdir -p "$DEV/tmp/built" "$DEV/tmp/gpu" "$DEV/tmp/dryrun"
echo "device-wheels: building the sdist-only wheels (antlr4-python3-runtime)"
grep -E '^antlr4-python3-runtime==' benchmarks/device/wheels.txt >"$DEV/tmp/sdist-only.txt"
"${pip[@]}" wheel -q --no-deps --no-binary=:all: -w "$DEV/tmp/built" -r "$DEV/tmp/sdist-only.txt"

echo "device-wheels: resolving benchmarks/device/wheels.txt for CPython 3.12 manylinux x86-64"
"${pip[@]}" download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 "${PLATFORMS[@]}" --find-links "$DEV/tmp/built" -d "$DEV/tmp/gpu" \
  -r benchmarks/device/wheels.txt
"$PY" -m benchmarks.device.wheels select "$DEV/tmp/gpu" "$DEV/gpu" --python 3.12

echo "device-wheels: the same set for this Python ($("$PY" -c 'import sys; print(sys.version.split()[0])'), the CPU dry run)"
"${pip[@]}" download -q --only-binary=:all: --find-links "$DEV/tmp/built" -d "$DEV/tmp/dryrun" \
  -r benchmarks/device/wheels.txt
"$PY" -m benchmarks.device.wheels select "$DEV/tmp/dryrun" "$DEV/dryrun" >/dev/null
"$PY" -m benchmarks.device.wheels same "$DEV/gpu" "$DEV/dryrun"

echo "device-wheels: the 3.12 set installs with --no-index into a clean target"
"${pip[@]}" install -q --no-index --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 "${PLATFORMS[@]}" --target "$DEV/tmp/target312" "$DEV"/gpu/*.whl

echo "device-wheels: traker's fast_jl sdist (built on the GPU machine by device_check.sh)"
# pip prepares an sdist's metadata before it saves it, and fast_jl's setup.py calls
# torch.utils.cpp_extension.CUDAExtension, which raises under a CPU-only torch; a stand-in
# module lets that step run. The file saved is PyPI's, checked against the hash in sdists.txt.
shim="$DEV/tmp/shim/torch/utils"
mkdir -p "$shim"
: >"$DEV/tmp/shim/torch/__init__.py"
: >"$shim/__init__.py"
cat >"$shim/cpp_extension.py" <<'EOF'
from setuptools import Extension
from setuptools.command.build_ext import build_ext as BuildExtension  # noqa: F401


def CUDAExtension(name, sources, *args, **kwargs):  # noqa: N802
    return Extension(name, sources)
EOF
PYTHONPATH="$PWD/$DEV/tmp/shim" "${pip[@]}" download -q --no-deps --no-binary=:all: --no-build-isolation \
  --require-hashes -d "$DEV/gpu" -r benchmarks/device/sdists.txt

rm -rf "$DEV/tmp"
echo "device-wheels: the set that travels"
"$PY" -m benchmarks.device.wheels summary "$DEV/gpu" --limit-mib "$LIMIT_MIB"
tree=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
set_bytes=$(du -sb "$DEV/gpu" | cut -f1)
total=$((tree + set_bytes))
"$PY" -c "import sys; t, s = (int(a) / 2**20 for a in sys.argv[1:]); print(f'device-wheels: working tree {t:.1f} MiB + set {s:.1f} MiB = {t + s:.1f} MiB of the 64 MiB that travel')" "$tree" "$set_bytes"
if [ "$total" -gt $((64 * 1048576)) ]; then
  echo "device-wheels: error: over the 64 MiB that travel with a device run" >&2
  exit 1
fi
cat <<'EOF'
device-wheels: ready. On a lent GPU machine (the device tool's `run`, from this checkout):
  command: bash benchmarks/device_check.sh "$OUT"
  carry:   [".device/gpu"]
  timeout_s: 540
EOF
