#!/usr/bin/env bash
# A single-node SLURM (Debian's slurm-wlm 22.05) on 127.0.0.1 for the `slurm` tests, with slurmdbd
# + MariaDB so that `sacct` works (submitit reads job states from it). Root only; idempotent:
# daemons already running (live PID file) are left alone. Stop with .ci/slurm-down.sh.
set -euo pipefail
NODE=$(hostname -s)
CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024 ))
export DEBIAN_FRONTEND=noninteractive
PKGS="munge slurmctld slurmd slurm-client slurmdbd mariadb-server"
source "$(dirname "$0")/daemons.sh"   # alive PIDFILE NAME
# wait_for SECONDS LOG CMD...: poll CMD every 0.2 s; on timeout print the tail of LOG and fail.
wait_for() {
  local secs=$1 log=$2; shift 2
  for _ in $(seq $(( secs * 5 ))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "slurm-up: timed out after ${secs}s waiting for: $*" >&2
  tail -n 30 "$log" >&2 2>/dev/null || true
  return 1
}

if ! dpkg -s $PKGS >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
fi
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /run/mysqld
if [ ! -f /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
fi
chown munge:munge /run/munge
chown mysql:mysql /run/mysqld 2>/dev/null || true

# cred_expire=10: a requeued job waits out the credential lifetime (default 120 s) first.
# CR_Core_Memory needs DefMemPerCPU, or one job takes the node's memory; a trak-dist job runs
# torch and Ray, so the default is 4 GB per CPU.
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=4000
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${MEM} State=UNKNOWN
PartitionName=debug Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP
CONF

# Sockets and PID files of daemons that are not running are stale (an earlier boot left them):
# remove them, or a wait for "socket exists" returns before the new daemon listens.
if ! alive /run/munge/munged.pid munged; then
  rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
fi
if ! alive /run/mysqld/mysqld.pid mariadbd; then
  rm -f /run/mysqld/mysqld.pid /run/mysqld/mysqld.sock
  (runuser -u mysql -- /usr/sbin/mariadbd --socket=/run/mysqld/mysqld.sock \
     --pid-file=/run/mysqld/mysqld.pid --bind-address=127.0.0.1 >/var/log/slurm/mariadb.log 2>&1 &)
fi
wait_for 60 /var/log/slurm/mariadb.log mysqladmin --socket=/run/mysqld/mysqld.sock ping
mysql -uroot -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; \
  CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw'; \
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=slurmpw
CONF
chmod 600 /etc/slurm/slurmdbd.conf
if ! alive /run/slurmdbd.pid slurmdbd; then
  rm -f /run/slurmdbd.pid
  /usr/sbin/slurmdbd
fi
wait_for 30 /var/log/slurm/slurmdbd.log bash -c 'exec 3<>/dev/tcp/127.0.0.1/6819'
if ! alive /run/slurmctld.pid slurmctld; then
  rm -f /run/slurmctld.pid
  /usr/sbin/slurmctld -c   # -c: forget jobs of an earlier run
fi
if ! alive /run/slurmd.pid slurmd; then
  rm -f /run/slurmd.pid
  /usr/sbin/slurmd
fi
wait_for 30 /var/log/slurm/slurmctld.log bash -c 'sinfo -h -o %T | grep -qE "idle|mix"'
sinfo
