#!/usr/bin/env bash
# Starts a one-node Slurm cluster on this machine for p2ptrain's Slurm tests: Debian's slurmctld,
# slurmd and munge, configured for localhost (no cgroups, no accounting), with one partition
# `debug` of this machine's CPUs. Idempotent: does nothing but wait for the node when it is up.
#
#   scripts/slurm/local-cluster.sh start   # install (apt-get, as root), configure, start; wait idle
#   scripts/slurm/local-cluster.sh stop    # stop the daemons
#
# The node advertises more CPUs than the machine has (`CPUS` below, default 8) so that
# oversubscribed multi-rank jobs can be scheduled on a 2-core machine.
set -euo pipefail
action=${1:-start}
CPUS=${P2PTRAIN_SLURM_CPUS:-8}
CONF_DIR=/etc/slurm
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm

stop() {
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  pkill -x munged 2>/dev/null || true
}

if [ "$action" = stop ]; then
  stop
  exit 0
fi
[ "$action" = start ] || { echo "usage: $0 start|stop" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "local-cluster.sh: must run as root (it installs and starts daemons)" >&2; exit 2; }

need=()
for cmd in slurmctld slurmd sbatch munged; do command -v $cmd >/dev/null 2>&1 || need+=("$cmd"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "local-cluster.sh: installing slurmctld slurmd slurm-client munge"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null
fi

host=$(hostname -s)
mkdir -p "$CONF_DIR" "$STATE" "$SPOOL" "$LOGS" /run/munge /var/lib/munge /var/log/munge /etc/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0700 /etc/munge /var/lib/munge /var/log/munge
chmod 0400 /etc/munge/munge.key
chmod 0755 /run/munge

conf=$(mktemp)
cat > "$conf" <<CONF
# Written by p2ptrain's scripts/slurm/local-cluster.sh: a one-node test cluster.
ClusterName=p2ptrain-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
# Advertise CPUS even on a smaller machine (oversubscribed test jobs).
SlurmdParameters=config_overrides
JobRequeue=1
# Requeued jobs may start again at once (the default holds them for a while).
SchedulerParameters=nohold_on_prolog_fail
KillWait=10
# The daemons answer RPCs slowly while test jobs load a small machine: wait longer before giving
# up on one (a lost signal RPC would lose the job's USR1), and let jobs run at the niceness of the
# sbatch that submitted them (the tests submit at nice 10, leaving the daemons the CPU they need).
MessageTimeout=60
PropagatePrioProcess=1
MinJobAge=600
NodeName=$host CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
# No cgroup.conf: the linuxproc/none plugins need none.
if ! cmp -s "$conf" "$CONF_DIR/slurm.conf"; then
  stop
  sleep 1
  mv "$conf" "$CONF_DIR/slurm.conf"
  chmod 0644 "$CONF_DIR/slurm.conf"
else
  rm -f "$conf"
fi

pgrep -x munged >/dev/null || { runuser -u munge -- /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force; }
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd

for _ in $(seq 1 60); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  case "$state" in
    idle*|mixed*|allocated*) echo "local-cluster.sh: node $host is $state"; exit 0 ;;
    down*|drain*|inval*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 1
done
echo "local-cluster.sh: the node did not come up; logs:" >&2
tail -n 20 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" >&2 || true
exit 1
