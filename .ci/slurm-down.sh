#!/usr/bin/env bash
# Stop what .ci/slurm-up.sh started, by PID file, in reverse order.
for f in /run/slurmd.pid /run/slurmctld.pid /run/slurmdbd.pid /run/mysqld/mysqld.pid \
         /run/munge/munged.pid; do
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  rm -f "$f"
done
