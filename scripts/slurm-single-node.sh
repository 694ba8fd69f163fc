#!/usr/bin/env bash
# Start a single-node Slurm (Debian's slurmctld + slurmd + munge) on this machine, as root,
# for the srun test. Idempotent: a running cluster is left alone. `stop` tears it down.
#   scripts/slurm-single-node.sh [start|stop]
set -euo pipefail
action=${1:-start}
conf_dir=/etc/slurm
state=/var/spool/bcl-slurm
if [ "$action" = stop ]; then
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  exit 0
fi
missing=()
command -v slurmctld >/dev/null 2>&1 || missing+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || missing+=(slurmd)
command -v srun >/dev/null 2>&1 || missing+=(slurm-client)
command -v munged >/dev/null 2>&1 || missing+=(munge)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
if srun -N1 -n1 -t 1 true >/dev/null 2>&1; then
  exit 0
fi
host=$(hostname -s)
cpus=$(nproc)
mkdir -p "$conf_dir" "$state/ctld" "$state/d" /var/log/slurm /run/munge
cat >"$conf_dir/slurm.conf" <<CONF
ClusterName=bcl
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=/run/bcl-slurmctld.pid
SlurmdPidFile=/run/bcl-slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=bcl Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
if ! pgrep -x munged >/dev/null; then
  [ -s /etc/munge/munge.key ] || mungekey --create --force >/dev/null 2>&1 || \
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
  chown munge:munge /etc/munge/munge.key /run/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
  runuser -u munge -- munged --force 2>/dev/null || munged --force
fi
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 60); do
  if srun -N1 -n1 -t 1 true >/dev/null 2>&1; then
    exit 0
  fi
  scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
  sleep 1
done
echo "slurm did not start within 60 s; logs:" >&2
tail -20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
