#!/bin/sh
# A one-node Slurm cluster on this machine, for tests and trying dsm under srun:
# munged, slurmctld and slurmd, each with its pid file, config, state and logs in DIR.
#
#   scripts/slurm-local.sh start DIR   # prints "export SLURM_CONF=DIR/slurm.conf" when up
#   scripts/slurm-local.sh stop DIR    # stops exactly the daemons started in DIR
#
# Needs root (slurmd starts tasks as the submitting user) and Debian's slurm-wlm and
# munge (installed here when missing, after apt-get update). Ports 16817/16818 unless
# SLURMCTLD_PORT/SLURMD_PORT say otherwise. The node takes its name and CPU count from
# `slurmd -C`; with 2 CPUs, `srun -n 4` needs --overcommit.
set -eu

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)

stop_pid_file() {
    f=$1
    [ -f "$f" ] || return 0
    pid=$(cat "$f" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        i=0
        while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

case "$cmd" in
stop)
    stop_pid_file "$dir/slurmd.pid"
    stop_pid_file "$dir/slurmctld.pid"
    stop_pid_file "$dir/munged.pid"
    exit 0
    ;;
start) ;;
*) usage ;;
esac

if [ "$(id -u)" -ne 0 ]; then
    echo "slurm-local.sh: needs root (slurmd runs tasks as their user)" >&2
    exit 3
fi
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
    ! command -v srun >/dev/null || ! command -v munged >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >"$dir/apt.log" 2>&1
    apt-get install -y --no-install-recommends slurm-wlm munge >>"$dir/apt.log" 2>&1 || {
        echo "slurm-local.sh: cannot install slurm-wlm and munge (see $dir/apt.log)" >&2
        exit 4
    }
fi

ctld_port=${SLURMCTLD_PORT:-16817}
slurmd_port=${SLURMD_PORT:-16818}
node_line=$(slurmd -C | head -n 1)
node=$(echo "$node_line" | sed -n 's/^NodeName=\([^ ]*\).*/\1/p')
cpus=$(echo "$node_line" | sed -n 's/.* CPUs=\([0-9]*\).*/\1/p')
[ -n "$node" ] && [ -n "$cpus" ] || { echo "slurm-local.sh: slurmd -C said: $node_line" >&2; exit 5; }

mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
chmod 700 "$dir/munge"
if [ ! -f "$dir/munge/munge.key" ]; then
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null
    chmod 400 "$dir/munge/munge.key"
fi
# --force: the socket directory is root's only, which munged otherwise refuses.
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"

cat >"$dir/slurm.conf" <<CONF
ClusterName=dsmlocal
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF

slurmctld -f "$dir/slurm.conf"
slurmd -f "$dir/slurm.conf"

# Up when the node is idle.
i=0
while :; do
    state=$(SLURM_CONF="$dir/slurm.conf" sinfo -h -n "$node" -o %t 2>/dev/null || true)
    case "$state" in idle*) break ;; esac
    i=$((i + 1))
    if [ $i -gt 150 ]; then
        echo "slurm-local.sh: node $node not idle after 30 s (state '$state'); logs in $dir" >&2
        exit 6
    fi
    sleep 0.2
done
echo "export SLURM_CONF=$dir/slurm.conf"
