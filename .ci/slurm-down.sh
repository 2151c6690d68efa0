#!/usr/bin/env bash
# Stop what .ci/slurm-up.sh started, by PID file, in reverse order. A PID file whose PID is now
# another program (a stale file from an earlier boot) is removed without killing anything.
source "$(dirname "$0")/daemons.sh"   # alive PIDFILE NAME
for entry in /run/slurmd.pid:slurmd /run/slurmctld.pid:slurmctld /run/slurmdbd.pid:slurmdbd \
             /run/mysqld/mysqld.pid:mariadbd /run/munge/munged.pid:munged; do
  f=${entry%%:*} name=${entry##*:}
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  if alive "$f" "$name"; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  fi
  rm -f "$f"
done
