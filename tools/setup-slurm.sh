#!/usr/bin/env bash
# Install and start a single-node Slurm cluster on this machine for the Slurm-backend tests:
# Debian's slurmctld, slurmd, slurm-client and munge; a munge key; a one-node slurm.conf (the node
# line from `slurmd -C`, named `localhost`, since the hostname differs); munged, slurmctld and
# `slurmd -N localhost` started as background daemons (no systemd); then waits until the node is
# idle. Idempotent: a second run with everything up changes nothing and returns at once.
# Needs root (apt-get, daemons); prints why and exits 0 if it cannot, so the Slurm tests then skip
# unless RSIM_REQUIRE_SLURM is set. Logs go to stderr.
set -euo pipefail
log() { echo "setup-slurm: $*" >&2; }

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
STATE=/var/lib/slurm
LOGS=/var/log/slurm
PARTITION=debug
# Slurm sees more CPUs than the machine has, so the tests' small jobs can run side by side.
CPUS=8

if [ "$(id -u)" != 0 ]; then
  log "not root; cannot install or start Slurm (the Slurm tests need it)"
  exit 0
fi

need() { command -v "$1" >/dev/null 2>&1; }
if ! need sbatch || ! need slurmctld || ! need slurmd || ! need munged; then
  if ! need apt-get; then log "no apt-get; install slurmctld, slurmd, slurm-client and munge yourself"; exit 0; fi
  log "installing slurmctld slurmd slurm-client munge"
  pkgs=(slurmctld slurmd slurm-client munge)
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; }
fi

# munge: a key readable by user munge only, then the daemon, run as munge.
if [ ! -s /etc/munge/munge.key ]; then
  log "writing a munge key"
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  rm -f /run/munge/munge.socket.2.lock
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || { log "munged does not answer"; exit 1; }
fi

# slurm.conf: written only when it would change (a changed file needs the daemons restarted).
node_line=$(slurmd -C | head -n 1 | sed -e 's/^NodeName=[^ ]*/NodeName=localhost/' -e "s/CPUs=[0-9]*/CPUs=$CPUS/" \
  -e 's/ Boards=[0-9]*//' -e 's/ SocketsPerBoard=[0-9]*//' -e 's/ CoresPerSocket=[0-9]*//' -e 's/ ThreadsPerCore=[0-9]*//')
mkdir -p "$CONF_DIR" "$STATE/slurmctld" "$STATE/slurmd" "$LOGS"
want="# Written by tools/setup-slurm.sh: a single-node test cluster.
ClusterName=rsim
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGS/jobcomp.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
EnforcePartLimits=ALL
ReturnToService=2
KillWait=2
OverTimeLimit=0
MinJobAge=300
$node_line State=UNKNOWN
PartitionName=$PARTITION Nodes=localhost Default=YES MaxTime=INFINITE State=UP"
restart=0
if [ "$(cat "$CONF" 2>/dev/null)" != "$want" ]; then
  log "writing $CONF"
  printf '%s\n' "$want" > "$CONF"
  restart=1
fi

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
if [ "$restart" = 1 ]; then
  for p in /run/slurmd.pid /run/slurmctld.pid; do
    if running "$p"; then kill "$(cat "$p")"; fi
  done
  for _ in $(seq 50); do running /run/slurmd.pid || running /run/slurmctld.pid || break; sleep 0.1; done
fi
if ! running /run/slurmctld.pid; then
  log "starting slurmctld"
  slurmctld
fi
if ! running /run/slurmd.pid; then
  log "starting slurmd -N localhost"
  slurmd -N localhost
fi

# Wait (bounded) until the node takes jobs; a node left down or drained by an earlier run is resumed.
deadline=$((SECONDS + 60))
while :; do
  state=$(sinfo -h -N -n localhost -o '%t' 2>/dev/null | head -n 1 || true)
  case "$state" in
    idle|mix|alloc) break ;;
    down*|drain*|drng*) scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true ;;
  esac
  if [ "$SECONDS" -ge "$deadline" ]; then
    log "the node did not become idle within 60 s (state: ${state:-unknown}); see $LOGS/slurmctld.log and $LOGS/slurmd.log"
    exit 1
  fi
  sleep 0.5
done
log "ready: node localhost is $state in partition $PARTITION"
