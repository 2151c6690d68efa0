#!/usr/bin/env bash
# Tear down a cluster made by up.sh: every process in its namespaces (Ray nodes, SeaweedFS) by
# PID, the namespaces, the bridge, the S3 data; logs stay in STATE. Safe to run twice, and run
# by the watchdog when the owner of the cluster dies.
#   down.sh STATE
set -uo pipefail
. "$(dirname "$0")/lib.sh"
STATE=$1
[ -f "$STATE/cluster.env" ] || { log "$STATE: no cluster"; exit 0; }
. "$STATE/cluster.env"
exec 9>"$STATE/.down.lock"
flock 9   # the watchdog and the owner may both get here
t0=$SECONDS
# the nodes' Ray logs live in their private /tmp, gone with them: keep a copy
for k in $(seq 1 "$NODES"); do bash "$HERE/node.sh" "$STATE" logs "$k"; done
teardown_names "$X"
rm -rf "$STATE/s3/data"
log "cluster tdmn$X down in $((SECONDS - t0)) s"
