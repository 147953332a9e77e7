#!/usr/bin/env bash
# A single-node Slurm cluster on 127.0.0.1 for the slow tier's Slurm test (tests/flows/test_slurm.py), and for trying
# the sbatch templates here on one machine. Needs Debian's slurm-wlm and munge (`apt-get install slurm-wlm munge`,
# which scripts/test.sh --slow does as root when they are missing) and root (slurmd runs jobs as their users).
#
#   bash scripts/slurm/local-cluster.sh start DIR   # munged, slurmctld, slurmd; config and logs in DIR; prints the
#                                                   # SLURM_CONF to export for sbatch, squeue, scontrol
#   bash scripts/slurm/local-cluster.sh stop DIR
set -euo pipefail
action="${1:?start or stop}"
dir="$(mkdir -p "${2:?a directory}" && cd "$2" && pwd)"
conf="$dir/slurm.conf"
stop() {
  for pid in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true
  done
  sleep 1
}
if [ "$action" = stop ]; then stop; exit 0; fi
[ "$(id -u)" = 0 ] || { echo "local-cluster.sh: run as root (slurmd starts jobs as their users)" >&2; exit 2; }
for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || { echo "local-cluster.sh: $tool is missing: apt-get install slurm-wlm munge" >&2; exit 2; }
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mkdir -p "$dir/state" "$dir/spool"
# cred_expire (default 120 s) is also how long a requeued job waits before it may start again, and the scheduler's
# full passes run every 60 s (backfill's every 30 s) by default: a preempted job would idle minutes before its second
# start. One node, a handful of jobs: short intervals cost nothing here. A real cluster keeps its own settings.
host="$(hostname -s)"
cat >"$conf" <<CONF
ClusterName=trainflow
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobRequeue=1
KillWait=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
munged --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" \
  --seed-file="$dir/munged.seed" --force
slurmctld -f "$conf"
slurmd -f "$conf"
export SLURM_CONF="$conf"
for _ in $(seq 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qx idle; then echo "SLURM_CONF=$conf"; exit 0; fi
  sleep 1
done
echo "local-cluster.sh: the node did not come up; the logs are in $dir" >&2
tail -20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
exit 1
