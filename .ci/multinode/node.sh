#!/usr/bin/env bash
# One Ray node of the cluster up.sh made: network namespace tdmnX-nK plus its own mount
# namespace, held by an "anchor" process (`ip netns exec` alone makes a new mount namespace on
# every call). The node sees a private /tmp (Ray's session dir, the unpacked --working-dir, HOME,
# trak_dist's input cache) and /dev/shm (its object store), and an empty read-only tmpfs where
# the checkout is. The rest of / is shared read-mostly, as an image's would be: the Python of
# $VENV, the system. Nodes reach each other, the client and S3 only over the bridge.
#
#   node.sh STATE start K head|worker   # node K (10.231.X.1K); the head is node 1
#   node.sh STATE kill K raylet|all     # SIGKILL its raylet (a crashed node manager) or every
#                                       # process of the node (a lost machine)
#   node.sh STATE stop K                # SIGTERM, then SIGKILL, every process of the node
#   node.sh STATE exec K CMD...         # run CMD inside node K (its namespaces and environment)
#   node.sh STATE wait-alive N          # until the GCS lists N alive nodes
#   node.sh STATE logs K                # node K's Ray logs -> STATE/nodes/nK-logs.tgz
set -euo pipefail
. "$(dirname "$0")/lib.sh"
load_state "$1"
CMD=$2
shift 2
RUN=$STATE/nodes
mkdir -p "$RUN"

node_env() {  # the environment of every process on node $1 (nothing from the caller's)
  local k=$1
  local e=(HOME=/tmp/home PATH="$VENV/bin:/usr/local/bin:/usr/bin:/bin" LANG=C.UTF-8 TMPDIR=/tmp
    RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$RAY_AUTH_TOKEN" RAY_USAGE_STATS_ENABLED=0
    AWS_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY"
    AWS_ENDPOINT_URL="$S3_ENDPOINT" AWS_REGION=us-east-1)
  if [ "$k" = 1 ] && [ "$FAST_HEALTH" = 1 ]; then
    # the GCS declares a node dead after 3 missed 1 s health checks (~3 s; default ~15 s)
    e+=(RAY_health_check_period_ms=1000 RAY_health_check_failure_threshold=3
      RAY_health_check_timeout_ms=1000)
  fi
  printf '%s\n' "${e[@]}"
}

in_node() {  # in_node K CMD...: run CMD inside node K
  local k=$1
  shift
  local a
  a=$(cat "$RUN/n$k.anchor")
  mapfile -t envs < <(node_env "$k")
  nsenter -t "$a" -m -n -u --wd=/tmp -- env -i "${envs[@]}" "$@"
}

case "$CMD" in
start)
  K=$1 ROLE=$2
  NS=$PREFIX-n$K IP=$NET.$((10 + K))
  [ -z "$(ns_pids "$NS")" ] || die "node $K is running (node.sh $STATE stop $K first)"
  # its own UTS namespace too: a host name per node (tdmnX-nK), as workers report it
  setsid ip netns exec "$NS" unshare --mount --uts --propagation private -- bash -c '
    set -e
    hostname "$1"
    if [ -d "$0" ]; then mount -t tmpfs -o size=1m,ro,mode=0555 tdmn-hide "$0"; fi
    mount -t tmpfs -o size=4g tdmn-tmp /tmp
    mount -t tmpfs -o size=1g tdmn-shm /dev/shm
    mkdir -p /tmp/home
    exec sleep infinity' "$HIDE" "$NS" </dev/null >"$RUN/n$K.anchor.log" 2>&1 &
  A=$!
  echo "$A" > "$RUN/n$K.anchor"
  for i in $(seq 100); do  # until the anchor is in its own mount namespace, mounts done
    if [ "$(readlink "/proc/$A/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ] &&
      nsenter -t "$A" -m -- mountpoint -q /dev/shm 2>/dev/null; then break; fi
    kill -0 "$A" 2>/dev/null || { cat "$RUN/n$K.anchor.log" >&2; die "node $K: anchor exited"; }
    sleep 0.1
  done
  args=(--node-ip-address="$IP" --num-cpus=1 --object-store-memory=200000000
    --memory=4294967296 --resources="{\"node$K\": 1}" --disable-usage-stats)
  if [ "$ROLE" = head ]; then
    args=(--head --port=6379 --dashboard-host="$IP" --dashboard-port=8265
      --include-dashboard=true "${args[@]}")
  else
    args=(--address="$HEAD_IP:6379" "${args[@]}")
  fi
  t0=$(date +%s%N)
  # `ray start` gives a raylet 30 s (hard-coded) to register with the GCS; on a loaded 2-core
  # machine a head has missed that. Then: end what it started (not the anchor), try again.
  for attempt in 1 2 3; do
    in_node "$K" "$VENV/bin/ray" start "${args[@]}" >"$RUN/n$K.start.log" 2>&1 && break
    tail -3 "$RUN/n$K.start.log" >&2
    [ "$attempt" = 3 ] && die "node $K: ray start failed 3 times ($RUN/n$K.start.log)"
    log "node $K: ray start failed (attempt $attempt); stopping what it started, again"
    stop_pids "$(ns_pids "$NS" | tr ' ' '\n' | grep -vx "$A" | tr '\n' ' ')"
  done
  log "node $K ($ROLE, $IP) started in $(elapsed "$t0")"
  ;;
kill)
  K=$1 WHAT=$2
  NS=$PREFIX-n$K
  pids=()
  for p in $(ns_pids "$NS"); do
    comm=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    if [ "$WHAT" = all ] || [ "$comm" = raylet ]; then pids+=("$p"); fi
  done
  [ ${#pids[@]} -gt 0 ] || die "node $K: nothing to kill ($WHAT)"
  kill -KILL "${pids[@]}"
  log "node $K: SIGKILL $WHAT (${pids[*]})"
  echo "${pids[*]}"
  ;;
stop)
  K=$1
  stop_pids "$(ns_pids "$PREFIX-n$K")"
  log "node $K stopped"
  ;;
exec)
  K=$1
  shift
  in_node "$K" "$@"
  ;;
logs)
  K=$1
  a=$(cat "$RUN/n$K.anchor" 2>/dev/null) && kill -0 "$a" 2>/dev/null || exit 0
  nsenter -t "$a" -m -- tar -C /tmp/ray/session_latest -cz logs >"$RUN/n$K-logs.tgz" 2>/dev/null ||
    true
  ;;
wait-alive)
  N=$1
  for i in $(seq 120); do
    alive=$(in_node 1 "$VENV/bin/python" -c '
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/nodes?view=summary",
                             headers={"Authorization": "Bearer " + sys.argv[2]})
nodes = json.load(urllib.request.urlopen(req, timeout=5))["data"]["summary"]
print(sum(n["raylet"]["state"] == "ALIVE" for n in nodes))' "http://$HEAD_IP:8265" \
      "$RAY_AUTH_TOKEN" 2>/dev/null || echo 0)
    [ "$alive" = "$N" ] && { log "$N nodes alive"; exit 0; }
    sleep 1
  done
  die "the GCS lists $alive alive nodes, not $N, after 120 s"
  ;;
*) die "usage: node.sh STATE start|kill|stop|exec|wait-alive ..." ;;
esac
