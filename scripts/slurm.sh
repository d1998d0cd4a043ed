#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for the `slurm` tests and `cluster=slurm` runs.
#
#   scripts/slurm.sh up     # install slurm-wlm + munge from Debian (first use), start munged, slurmctld, slurmd
#   scripts/slurm.sh down   # stop the three daemons this script started (by their pid files)
#   scripts/slurm.sh status # is a controller answering, and with which node
#
# Root only (apt, /etc/slurm, daemons). The node declares SLURM_CPUS CPUs (default 8) whatever the
# machine has: `SlurmdParameters=config_overrides` lets slurmd accept more than it finds, so a 2-core VM
# can hold a 2-task job with CPUs to spare. Accounting is off and process tracking is linuxproc (no
# cgroups: containers often have none), so nothing here needs systemd.
set -euo pipefail

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
MARK="# written by accelpact scripts/slurm.sh"
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm
CPUS=${SLURM_CPUS:-8}
NODE=$(hostname -s)

die() { echo "slurm.sh: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "needs root (apt-get, /etc/slurm, daemons); run it as root or with sudo"; }

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
    return
  fi
  command -v apt-get >/dev/null || die "no apt-get: install slurm-wlm and munge with your distribution's packages"
  echo "slurm.sh: installing slurm-wlm and munge (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d: the packages' postinst must not try to start services (no systemd in a container);
  # this script starts the daemons itself.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' >$policy; chmod +x $policy; made_policy=1; fi
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
  [ $made_policy = 1 ] && rm -f $policy
  return 0
}

write_conf() {
  mkdir -p $CONF_DIR $STATE $SPOOL $LOGS
  if [ -e $CONF ] && ! grep -qF "$MARK" $CONF; then
    die "$CONF exists and was not written by this script; move it away or start your own cluster"
  fi
  cat >$CONF <<CONF
$MARK
ClusterName=accelpact
SlurmctldHost=$NODE
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
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=1024 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
}

start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key; \
    else dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
  fi
  chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

up() {
  need_root
  local t0=$SECONDS
  install
  write_conf
  start_munge
  alive /run/slurmctld.pid || slurmctld
  alive /run/slurmd.pid || slurmd
  for _ in $(seq 60); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
      echo "slurm.sh: up in $((SECONDS - t0)) s: $(sinfo -h -o '%P %D node(s) %c CPUs %T')"
      return 0
    fi
    sleep 1
  done
  tail -n 20 $LOGS/slurmctld.log $LOGS/slurmd.log >&2 || true
  die "slurmctld/slurmd did not report an idle node within 60 s (logs above)"
}

stop_pidfile() {
  local f=$1
  alive "$f" || return 0
  local pid; pid=$(cat "$f")
  kill "$pid"
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

down() {
  need_root
  stop_pidfile /run/slurmd.pid
  stop_pidfile /run/slurmctld.pid
  stop_pidfile /run/munge/munged.pid
  echo "slurm.sh: down"
}

status() {
  sinfo -h -o '%P %D node(s) %c CPUs %T' 2>/dev/null || { echo "slurm.sh: no controller answering"; return 1; }
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: scripts/slurm.sh up|down|status" ;;
esac
