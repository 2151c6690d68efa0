# Shared by the scripts in .ci/multinode/ (sourced, not run). One cluster = one state directory
# $STATE holding `cluster.env` (its names and addresses) and its logs; nothing of it lives in the
# checkout. Names are derived from the network index X, claimed atomically as the directory
# $CLAIMS/X, so two clusters on one machine (two CI runs, two engineers) never collide:
#   bridge tdmnX (10.231.X.1/24), netns tdmnX-s3 (.10: SeaweedFS), tdmnX-n1..N (.11..: Ray nodes)
# No default route, no forwarding, no NAT: packets go only between these addresses.
# Requires root, iproute2 (`ip netns`), util-linux (`unshare`, `nsenter`), curl.

CLAIMS=/run/trak-dist-multinode
SUBNET_BASE=10.231
# the checkout, hidden from every node (an empty read-only tmpfs over it): code reaches the
# nodes only through `ray job submit --working-dir`, as on a cloud cluster
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

log() { printf '[multinode %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
elapsed() { local ms=$((($(date +%s%N) - $1) / 1000000)); printf '%d.%03d s' $((ms / 1000)) $((ms % 1000)); }

# load_state STATE: the variables up.sh wrote (X, NET, BRIDGE, NODES, HEAD_IP, S3_IP, ...)
load_state() {
  STATE=$1
  [ -f "$STATE/cluster.env" ] || die "$STATE/cluster.env not found: not a cluster state directory"
  # shellcheck disable=SC1091
  . "$STATE/cluster.env"
}

# ns_pids NS: every process in network namespace NS (empty when it is gone)
ns_pids() { ip netns pids "$1" 2>/dev/null | tr '\n' ' '; }

# stop_pids "PIDS": SIGTERM, up to 5 s, then SIGKILL what is left; by PID, nothing else
stop_pids() {
  local pids=$1 left p i
  [ -n "${pids// }" ] || return 0
  kill -TERM $pids 2>/dev/null || true
  for i in $(seq 50); do
    left=""
    for p in $pids; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  kill -KILL $left 2>/dev/null || true
}

# wait_http URL [NETNS] [TRIES]: until URL answers with any HTTP status (0.2 s apart)
wait_http() {
  local url=$1 ns=${2:-} tries=${3:-300} code i cmd=()
  [ -n "$ns" ] && cmd=(ip netns exec "$ns")
  for i in $(seq "$tries"); do
    code=$("${cmd[@]}" curl -s -o /dev/null -m 2 -w '%{http_code}' "$url" || true)
    [ "$code" != "000" ] && return 0
    sleep 0.2
  done
  return 1
}

# teardown_names X: stop every process in the tdmnX-* namespaces (Ray nodes, SeaweedFS) by PID,
# delete the namespaces and the bridge, release the claim. Works from the names alone, so a run
# that died before writing its state is cleaned up too. Never `ray stop` (it would end every
# Ray on the machine, other users' included).
teardown_names() {
  local x=$1 ns pids="" i p alive
  # SIGKILL at once: everything of the cluster is thrown away, nothing needs a clean exit
  for ns in $(ip netns list | awk -v p="tdmn$x-" 'index($1, p) == 1 {print $1}'); do
    pids="$pids $(ns_pids "$ns")"
  done
  [ -z "${pids// }" ] || kill -KILL $pids 2>/dev/null || true
  for i in $(seq 100); do  # zombies of killed processes hold their namespace a moment
    alive=0
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for ns in $(ip netns list | awk -v p="tdmn$x-" 'index($1, p) == 1 {print $1}'); do
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link show "tdmn$x" >/dev/null 2>&1 && ip link del "tdmn$x"
  # the kernel frees a namespace and its veth pair asynchronously after its last process exits
  for i in $(seq 100); do
    ip -br link | grep -q "^tdmn$x-" || break
    sleep 0.1
  done
  rm -rf "${CLAIMS:?}/$x"
}
