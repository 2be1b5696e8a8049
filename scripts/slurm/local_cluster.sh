#!/usr/bin/env bash
# A one-machine Slurm (slurmctld + slurmd + munge) for tests and CI; needs root.
#
#   scripts/slurm/local_cluster.sh install          apt-get install slurm + munge (Debian)
#   scripts/slurm/local_cluster.sh start DIR        config, state and logs in DIR; prints
#                                                   `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm/local_cluster.sh stop DIR         stop what `start` started (pid files)
#
# `start` writes DIR/slurm.conf naming this host as controller and only node, starts
# munged if no munge daemon answers, then slurmctld and slurmd, and waits for the node
# to be idle (addresses are 127.0.0.1: no name resolution needed; ports from Slurm's 6817 on,
# the first free ones, so a cluster left running elsewhere is not the one the tests reach).
# `stop` only kills the pids recorded in DIR.
set -euo pipefail
cmd=${1:?usage: local_cluster.sh install | start DIR | stop DIR}

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
     && command -v munged >/dev/null; then
    echo "slurm and munge already installed"; return 0
  fi
  # No daemon may start from the packages' init scripts (no init system here): policy-rc.d.
  local policy=/usr/sbin/policy-rc.d added=0
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; added=1; fi
  trap '[ "$added" = 1 ] && rm -f "$policy"' RETURN
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

# The first port from $1 on that nothing on this host accepts connections at. A cluster left
# running (another test run's) holds Slurm's default ports: our slurmctld would die at its bind
# while sinfo and sbatch went on talking to that one.
free_port() {
  local port=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  echo "$port"
}

start() {
  local dir=$1 host cpus ctld_port slurmd_port
  mkdir -p "$dir"/state "$dir"/spool
  dir=$(cd "$dir" && pwd)
  host=$(hostname -s)
  cpus=$(nproc)
  if ! munge_ok; then
    if [ ! -s /etc/munge/munge.key ]; then
      mkdir -p /etc/munge
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    munged --force --pid-file="$dir/munged.pid" 2>/dev/null || munged --force
    [ -s "$dir/munged.pid" ] || pgrep -n -x munged > "$dir/munged.pid"
    for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
    munge_ok || { echo "munged did not start" >&2; exit 1; }
  fi
  ctld_port=$(free_port 6817)
  slurmd_port=$(free_port $((ctld_port + 1)))
  cat > "$dir/slurm.conf" <<CONF
ClusterName=moebackend
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -i
  slurmd
  for _ in $(seq 100); do
    state=$(sinfo -h -o %T 2>/dev/null | head -n1 || true)
    case "$state" in idle*|mixed*|alloc*) break ;; esac
    sleep 0.2
  done
  sinfo
  case "$state" in idle*|mixed*|alloc*) ;; *) echo "node not ready (state '$state'); see $dir/*.log" >&2; exit 1 ;; esac
  echo "export SLURM_CONF=$dir/slurm.conf"
}

stop() {
  local dir=$1 name pid
  for name in slurmd slurmctld munged; do
    [ -s "$dir/$name.pid" ] || continue
    pid=$(cat "$dir/$name.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/$name.pid"
  done
}

case "$cmd" in
  install) install_packages ;;
  start) start "${2:?start DIR}" ;;
  stop) stop "${2:?stop DIR}" ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
