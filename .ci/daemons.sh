# Sourced by slurm-up.sh and slurm-down.sh.
# A PID file left by an earlier boot can name a PID that is now another process: a daemon is
# alive only when the PID's command name matches too and it is not a zombie (PID 1 in a container
# may not reap).
alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  grep -qx "$2" "/proc/$pid/comm" 2>/dev/null && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$pid/stat"
}
