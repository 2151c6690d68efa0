#!/usr/bin/env bash
# The cluster's S3 server: SeaweedFS (`weed mini`: master, volume, filer and S3 gateway in one
# process) in its own network namespace, with an identity file (no anonymous identity: an
# unsigned request gets 403), the bucket made at start, no telemetry.
#
#   s3.sh STATE start    # (again after stop: same data, same address)
#   s3.sh STATE stop     # every process of the S3 namespace, by PID (an outage, for the tests)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
load_state "$1"
NS=$PREFIX-s3
DIR=$STATE/s3
case "$2" in
start)
  mkdir -p "$DIR/data"
  cat > "$DIR/s3.json" <<JSON
{"identities": [{"name": "trak",
  "credentials": [{"accessKey": "$AWS_ACCESS_KEY_ID", "secretKey": "$AWS_SECRET_ACCESS_KEY"}],
  "actions": ["Read", "List", "Tagging", "Write"]}]}
JSON
  chmod 600 "$DIR/s3.json"
  t0=$(date +%s%N)
  # -ip/-ip.bind pinned: the defaults are eth0's address and 0.0.0.0. -master.telemetry=false:
  # the default posts statistics to telemetry.seaweedfs.com. No webdav, admin UI, iceberg, lance.
  setsid ip netns exec "$NS" "$WEED" mini -dir="$DIR/data" -ip="$S3_IP" -ip.bind="$S3_IP" \
    -s3.port="$S3_PORT" -master.telemetry=false -s3.config="$DIR/s3.json" -bucket="$BUCKET" \
    -webdav=false -admin.ui=false -s3.port.iceberg=0 -s3.port.lance=0 \
    -filer.localSocket="$DIR/filer.sock" -s3.localSocket="$DIR/s3.sock" \
    >>"$DIR/weed.log" 2>&1 </dev/null &
  # ready: the bucket exists once an unsigned request for it is refused (403), not 404/503
  for i in $(seq 600); do
    code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$S3_ENDPOINT/$BUCKET" || true)
    [ "$code" = 403 ] && break
    sleep 0.1
  done
  [ "$code" = 403 ] || { tail -20 "$DIR/weed.log" >&2; die "S3 at $S3_ENDPOINT not ready (HTTP $code)"; }
  log "S3 $S3_ENDPOINT up in $(elapsed "$t0"); an unsigned request gets $code"
  ;;
stop)
  stop_pids "$(ns_pids "$NS")"
  log "S3 stopped"
  ;;
*) die "usage: s3.sh STATE start|stop" ;;
esac
