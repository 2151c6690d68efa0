#!/usr/bin/env bash
# The image of docker/Dockerfile, really built and run (issue 20): no registry is reachable here,
# so a Debian 12 base made with debootstrap stands in for the nvidia/cuda and python images
# through the Dockerfile's base build args, and the kernel stage is skipped (no nvcc in it:
# CUDA_KERNEL=skip). Then, in containers of that image:
#   1. the default job `trak-dist` with no network, its report checked from the host;
#   2. `trak-dist serve` on 0.0.0.0 with a bearer token, published on the host's 127.0.0.1 only,
#      queried from the host (GET /health, POST /attribute with and without the token) and its
#      top-k compared with the top-k the job stored for the same target.
# It stops and removes its containers, images and storage at the end, and prints the timings.
#
#   sudo bash .ci/container-smoke.sh      # root: rootful podman, debootstrap; after make install-test
#
# Environment: HOST_PYTHON (runs the client and `pip download`, default .venv's python; it must be
# the Python version of the base, 3.11 for bookworm), TRAK_CONTAINER_CACHE (the debootstrap
# tarball, one per day, and the wheelhouse, one per dependency set; default
# /tmp/trak-container-cache), TRAK_CONTAINER_DRIVER (overlay, falling back to vfs when overlay
# does not work; or vfs), TRAK_CONTAINER_SUMMARY (a JSON file for the measurements), KEEP=1 keeps
# the work directory and the image.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HOST_PYTHON=${HOST_PYTHON:-$ROOT/.venv/bin/python}
CACHE=${TRAK_CONTAINER_CACHE:-/tmp/trak-container-cache}
DRIVER=${TRAK_CONTAINER_DRIVER:-overlay}
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TAG=trak-smoke-$$
IMAGE=localhost/trak-dist:$TAG
step() { printf '\n== container-smoke %4ds: %s\n' "$SECONDS" "$*"; }
fail() { echo "container-smoke: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (rootful podman with runc, debootstrap); run it with sudo"
[ -x "$HOST_PYTHON" ] || fail "HOST_PYTHON=$HOST_PYTHON is not executable: run make install-test first"
mkdir -p "$CACHE"
WORK=$(mktemp -d /tmp/trak-container-smoke.XXXXXX)

step "packages: podman, buildah, runc, debootstrap (Debian)"
pkgs=(podman buildah debootstrap runc conmon containernetworking-plugins iptables)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  }
fi
podman --version

# Storage and engine settings of our own: the graphroot under $WORK, runc (crun fails here with
# "cgroups in hybrid mode not supported") and ulimits a rootful container may set here.
configure() {
  mkdir -p "$WORK/storage/graph" "$WORK/storage/run"
  printf '[storage]\ndriver = "%s"\ngraphroot = "%s"\nrunroot = "%s"\n' \
    "$1" "$WORK/storage/graph" "$WORK/storage/run" > "$WORK/storage.conf"
}
cat > "$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_STORAGE_CONF="$WORK/storage.conf" CONTAINERS_CONF="$WORK/containers.conf"
configure "$DRIVER"

SERVE_NAME=
cleanup() {
  local rc=$?
  set +e
  [ -n "$SERVE_NAME" ] && podman rm -f "$SERVE_NAME" >/dev/null 2>&1
  if [ "${KEEP:-0}" = 1 ]; then
    echo "container-smoke: kept $WORK (CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF)"
  else
    local t0=$SECONDS
    # every container and image of our graphroot (not `podman system reset`: it would also remove
    # the machine's podman networks, which live outside the graphroot)
    podman rm -af >/dev/null 2>&1
    podman rmi -af >/dev/null 2>&1
    if findmnt -rn -o TARGET | grep "^$WORK/" >/dev/null; then
      echo "container-smoke: mounts left under $WORK: not removed" >&2
    else
      rm -rf --one-file-system "$WORK"
    fi
    echo "container-smoke: removed the containers, the image and its storage in $((SECONDS - t0))s"
  fi
  exit $rc
}
trap cleanup EXIT

step "the base: debootstrap --variant=minbase $SUITE (cached per day under $CACHE)"
BASE_TAR="$CACHE/debian-$SUITE-minbase-$(date -u +%Y%m%d).tar"
t0=$SECONDS
if [ ! -s "$BASE_TAR" ]; then
  rm -f "$CACHE"/debian-$SUITE-minbase-*.tar
  debootstrap --variant=minbase "$SUITE" "$WORK/rootfs" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 \
    || { tail -n 30 "$WORK/debootstrap.log"; fail "debootstrap failed"; }
  # debootstrap unmounts /proc and /sys of the rootfs when it succeeds; never tar or delete a
  # tree with a mount below it
  if findmnt -rn -o TARGET | grep "^$WORK/rootfs" >/dev/null; then
    fail "mounts left under $WORK/rootfs"
  fi
  tar -C "$WORK/rootfs" -cf "$BASE_TAR.part" .
  mv "$BASE_TAR.part" "$BASE_TAR"
  rm -rf --one-file-system "$WORK/rootfs"
  BASE_HOW="debootstrap"
else
  BASE_HOW="cached"
fi
BASE_S=$((SECONDS - t0))
echo "$BASE_HOW in ${BASE_S}s: $(du -h "$BASE_TAR" | cut -f1)"

import_base() {
  podman import -q "$BASE_TAR" localhost/trak-ci-debian:$SUITE >/dev/null
  podman run --rm --network none localhost/trak-ci-debian:$SUITE cat /etc/debian_version
}
if ! import_base && [ "$DRIVER" = overlay ]; then
  echo "container-smoke: the overlay driver does not work here; vfs instead (slower, ~2 GB more)"
  podman rmi -af >/dev/null 2>&1 || true
  rm -rf --one-file-system "$WORK/storage"
  DRIVER=vfs
  configure vfs
  import_base
fi

# The wheel stage's base: what python:3.12-slim-bookworm provides (Python and pip) on that Debian.
t0=$SECONDS
mkdir -p "$WORK/python-base"
cat > "$WORK/python-base/Containerfile" <<EOF
FROM localhost/trak-ci-debian:$SUITE
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip \
    && rm -rf /var/lib/apt/lists/*
EOF
podman build -q --pull=never -t localhost/trak-ci-python:$SUITE "$WORK/python-base" \
  > "$WORK/python-base.log" 2>&1 || { tail -n 30 "$WORK/python-base.log"; fail "the python base"; }
PY_BASE_S=$((SECONDS - t0))
PY_IN_BASE=$(podman run --rm --network none localhost/trak-ci-python:$SUITE \
  python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
PY_ON_HOST=$("$HOST_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$PY_IN_BASE" = "$PY_ON_HOST" ] || fail "the base has Python $PY_IN_BASE, HOST_PYTHON $PY_ON_HOST: \
the wheelhouse must be downloaded for the base's version (set HOST_PYTHON)"

# pip inside a container here fails on certificate verification (the host's network goes through
# its own CA), so the image's pip installs from wheels downloaded on the host: mounted read-only
# into the build's RUN steps with a pip.conf that points there (nothing of it stays in the image).
step "the wheelhouse: $TORCH_SPEC, trak_dist's dependencies and its build backend (pip download)"
mapfile -t DEPS < <(cd "$ROOT" && "$HOST_PYTHON" -c '
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))
extra = p["project"]["optional-dependencies"]["s3"]  # the image installs the s3 extra too
print("\n".join(p["project"]["dependencies"] + extra + p["build-system"]["requires"]))')
key=$(printf '%s\n' "$PY_ON_HOST" "$TORCH_SPEC" "${DEPS[@]}" | sha256sum | cut -c1-16)
WHEELS="$CACHE/wheels-$key"
t0=$SECONDS
if [ ! -f "$WHEELS/.complete" ]; then
  rm -rf "$CACHE"/wheels-*
  # shellcheck disable=SC2086  # TORCH_SPEC may carry pip flags, as in the Makefile
  "$HOST_PYTHON" -m pip download -q -d "$WHEELS" $TORCH_SPEC "${DEPS[@]}" \
    > "$WORK/pip-download.log" 2>&1 || { tail -n 30 "$WORK/pip-download.log"; fail "pip download failed"; }
  touch "$WHEELS/.complete"
fi
WHEELS_S=$((SECONDS - t0))
echo "$(find "$WHEELS" -name '*.whl' -o -name '*.tar.gz' | wc -l) files, $(du -sh "$WHEELS" | cut -f1), ${WHEELS_S}s"
printf '[global]\nno-index = true\nfind-links = /wheels\n' > "$WORK/pip.conf"

step "podman build: docker/Dockerfile on the Debian base, CUDA_KERNEL=skip"
t0=$SECONDS
podman build --pull=never -f "$ROOT/docker/Dockerfile" -t "$IMAGE" \
  --build-arg KERNEL_BASE=localhost/trak-ci-debian:$SUITE \
  --build-arg WHEEL_BASE=localhost/trak-ci-python:$SUITE \
  --build-arg BASE=localhost/trak-ci-debian:$SUITE \
  --build-arg CUDA_KERNEL=skip \
  --build-arg TORCH_SPEC="$TORCH_SPEC" \
  -v "$WHEELS:/wheels:ro" -v "$WORK/pip.conf:/etc/pip.conf:ro" \
  "$ROOT" > "$WORK/build.log" 2>&1 || { tail -n 60 "$WORK/build.log"; fail "podman build failed"; }
BUILD_S=$((SECONDS - t0))
grep -q "no CUDA kernel (CUDA_KERNEL=skip): the torch projection" "$WORK/build.log" \
  || fail "the image's final check did not report the missing kernel ($WORK/build.log)"
grep -E "^trak-dist [0-9]" "$WORK/build.log"
# the wheelhouse and its pip.conf were mounts of the build: nothing of them is in the image
podman run --rm --network none "$IMAGE" sh -c \
  '! ls /wheels/*.whl >/dev/null 2>&1 && ! grep -qs find-links /etc/pip.conf' \
  || fail "the build's wheelhouse or pip.conf stayed in the image"
SIZE_B=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "built in ${BUILD_S}s, $((SIZE_B / 1000000)) MB ($DRIVER storage: $(du -sh "$WORK/storage/graph" | cut -f1))"

# /data of both containers: a host directory owned by the image's user (uid 10001)
DATA="$WORK/data"
mkdir -p "$DATA"
chown 10001:10001 "$DATA"
# Ray keeps its object store in /dev/shm (64 MB in a container unless told)
RUN_OPTS=(--shm-size=1g -v "$DATA:/data")

step "the default job in the container: trak-dist (no network)"
t0=$SECONDS
podman run --rm --network none "${RUN_OPTS[@]}" "$IMAGE" \
  trak-dist progress=false hydra.run.dir=job > "$WORK/job.log" 2>&1 \
  || { tail -n 60 "$WORK/job.log"; fail "the default job failed in the container"; }
JOB_S=$((SECONDS - t0))
tail -n 5 "$WORK/job.log"
echo "default job: ${JOB_S}s"

step "trak-dist serve in the container on 0.0.0.0 with a token, published on 127.0.0.1"
TOKEN=$("$HOST_PYTHON" -c 'import secrets; print(secrets.token_hex(24))')
printf '%s\n' "$TOKEN" > "$DATA/serve_token"
chown 10001:10001 "$DATA/serve_token"
chmod 600 "$DATA/serve_token"
PORT=$("$HOST_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
SERVE_NAME=trak-serve-$$
t0=$SECONDS
podman run -d --name "$SERVE_NAME" "${RUN_OPTS[@]}" -p "127.0.0.1:$PORT:8000" "$IMAGE" \
  trak-dist serve serve.host=0.0.0.0 serve.token_file=/data/serve_token >/dev/null
export TOKEN PORT DATA SERVE_NAME
"$HOST_PYTHON" - <<'EOF' || { podman logs --tail 60 "$SERVE_NAME"; fail "the service in the container failed"; }
import json, os, subprocess, time

import numpy as np

from trak_dist.examples import digits
from trak_dist.serve import client
from trak_dist.store import FeatureStore

url, token = f"http://127.0.0.1:{os.environ['PORT']}/", os.environ["TOKEN"]
start = time.monotonic()
while not client.health(url, timeout=2.0):
    state = subprocess.run(["podman", "inspect", "-f", "{{.State.Status}}", os.environ["SERVE_NAME"]],
                           capture_output=True, text=True).stdout.strip()
    assert state == "running", f"the serve container is {state!r}"
    assert time.monotonic() - start < 300, "no /health after 300 s"
    time.sleep(1.0)
ready_s = time.monotonic() - start
# the token path: every route but /health needs it once the service binds beyond loopback
x, y = digits.target_set()[0]
target = [x.tolist(), int(y)]
try:
    client.attribute(url, [target], k=10)
except client.ServiceError as e:
    assert e.status == 401, e
else:
    raise AssertionError("POST /attribute without the token was answered")
t = time.monotonic()
[result] = client.attribute(url, [target], k=10, token=token)
first_ms = 1000 * (time.monotonic() - t)
times = []
for _ in range(5):
    t = time.monotonic()
    client.attribute(url, [target], k=10, token=token)
    times.append(1000 * (time.monotonic() - t))
pro, opp = result["proponents"], result["opponents"]
assert len(pro) == 10 and len(opp) == 10, result
assert all(a[1] >= b[1] for a, b in zip(pro, pro[1:])) and pro[0][1] > opp[0][1], result
# the same target's top-k as the job in the first container stored it (tests/serve's tolerance:
# the job featurised targets 64 at a time, the service one by one)
report = json.load(open(os.path.join(os.environ["DATA"], "job", "trak_report.json")))
assert report["rows_computed"] == {"train": 3 * 1500, "target": 3 * 297}, report["rows_computed"]
store = FeatureStore.open(os.path.join(os.environ["DATA"], "trak_store.zarr"), mode="r")
[variant] = store.score_variants("targets")
stored = store.score_set("targets", variant).read_topk()
scale = max(float(np.abs(stored[f"{kind}_val"]).max()) for kind in ("proponents", "opponents"))
for kind in ("proponents", "opponents"):
    assert [i for i, _ in result[kind]] == stored[f"{kind}_idx"][0].tolist(), (kind, result)
    np.testing.assert_allclose([s for _, s in result[kind]], stored[f"{kind}_val"][0],
                               rtol=1e-4, atol=1e-4 * scale)
info = client.request(url, "/info", token=token)
assert (info["train_size"], info["checkpoints"]) == (1500, 3), info
summary = {"serve_ready_s": round(ready_s, 1), "attribute_first_ms": round(first_ms, 1),
           "attribute_ms_median": round(sorted(times)[2], 1), "n": info["train_size"],
           "top_proponent": pro[0], "top_opponent": opp[0]}
print(json.dumps(summary))
open(os.path.join(os.environ["DATA"], "serve_summary.json"), "w").write(json.dumps(summary))
EOF

step "Ctrl-C stops the service: SIGINT, then exit status 0"
podman kill -s INT "$SERVE_NAME" >/dev/null
STATUS=$(timeout 120 podman wait "$SERVE_NAME") || fail "the service did not stop within 120 s"
podman logs "$SERVE_NAME" > "$WORK/serve.log" 2>&1
[ "$STATUS" = 0 ] || { tail -n 30 "$WORK/serve.log"; fail "the service exited with $STATUS"; }
grep -q "trak-dist serve: stopping" "$WORK/serve.log" || fail "no 'stopping' line in its log"
SERVE_S=$((SECONDS - t0))

step "passed"
"$HOST_PYTHON" - "$DATA/serve_summary.json" <<EOF | tee "${TRAK_CONTAINER_SUMMARY:-/dev/null}"
import json, sys
summary = {"base": "$BASE_HOW", "base_s": $BASE_S, "python_base_s": $PY_BASE_S,
           "wheels_s": $WHEELS_S, "storage_driver": "$DRIVER",
           "build_s": $BUILD_S, "image_mb": round($SIZE_B / 1e6), "job_s": $JOB_S,
           "serve_total_s": $SERVE_S, **json.load(open(sys.argv[1])), "total_s": $SECONDS}
print(json.dumps(summary))
EOF
