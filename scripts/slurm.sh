#!/usr/bin/env bash
# A real multi-node Slurm cluster on this machine, for the `slurm` tests and `cluster=slurm` runs.
#
#   scripts/slurm.sh up     # install slurm-wlm + munge from Debian (first use), start munged, slurmctld and
#                           # SLURM_NODES slurmd (default 2), one per network-namespace host
#   scripts/slurm.sh down   # stop the daemons this script started (by their pid files), delete the namespaces
#   scripts/slurm.sh status # is a controller answering, and with which nodes
#
# Nodes: node i is the network namespace slurm-n<i>, running `slurmd -N slurm-n<i>`, with two links into
# a bridge namespace (slurm-br), as `cluster=local_hosts` builds its hosts: eth0 on the data network
# 10.250.0.0/24 (10.250.0.<i+1>; pin gloo to it with GLOO_SOCKET_IFNAME=eth0) and ctl0 on the control
# network 10.250.1.0/24 (10.250.1.<i+1>: the node's NodeAddr; Slurm, stores and the control channel use
# it). The root namespace joins the control network only (veth slurmctl0, 10.250.1.254), where
# slurmctld listens and from where srun/sbatch run; no namespace gets a default route, so nothing leaves
# the machine. /etc/hosts maps each node name to its control address (marked lines, removed by `down`).
# Where namespaces cannot be built (not root, no `ip netns`, a sandbox without them) it falls back to
# one node (this host, 127.0.0.1) and says so; SLURM_NODES=1 asks for that.
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
NODES=${SLURM_NODES:-2}
BR_NS=slurm-br
NODE_NS=slurm-n        # node i: namespace and node name slurm-n<i>
DATA_NET=10.250.0      # eth0: the data plane
CTL_NET=10.250.1       # ctl0: the control plane (NodeAddr, slurmctld, stores)
ROOT_IF=slurmctl0
ROOT_CTL=$CTL_NET.254
HOSTS_MARK="# accelpact slurm.sh node"
NODES_FILE=/run/accelpact-slurm-nodes  # how many namespace nodes are up (0: the one-node fallback)

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

node_lines() {  # NodeName lines and the partition's node list for $1 namespace nodes (0: this host)
  local n=$1 i names=""
  if [ "$n" = 0 ]; then
    echo "NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=1024 State=UNKNOWN"
    names=$NODE
  else
    for ((i = 0; i < n; i++)); do
      echo "NodeName=$NODE_NS$i NodeAddr=$CTL_NET.$((i + 1)) NodeHostname=$NODE_NS$i CPUs=$CPUS RealMemory=1024 State=UNKNOWN"
      names="$names${names:+,}$NODE_NS$i"
    done
  fi
  echo "PartitionName=debug Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
}

write_conf() {
  local n=$1 ctld=$NODE
  [ "$n" = 0 ] || ctld="$NODE($ROOT_CTL)"
  mkdir -p $CONF_DIR $STATE $SPOOL $LOGS
  if [ -e $CONF ] && ! grep -qF "$MARK" $CONF; then
    die "$CONF exists and was not written by this script; move it away or start your own cluster"
  fi
  cat >$CONF <<CONF
$MARK
ClusterName=accelpact
SlurmctldHost=$ctld
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
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
$(node_lines "$n")
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

netns_down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^($BR_NS|$NODE_NS[0-9]+)$"); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del $ROOT_IF 2>/dev/null || true
  sed -i "/$HOSTS_MARK/d" /etc/hosts 2>/dev/null || true
}

netns_present() {  # are the bridge and $1 node namespaces there?
  local i
  ip netns list 2>/dev/null | grep -q "^$BR_NS\b" || return 1
  for ((i = 0; i < $1; i++)); do ip netns list 2>/dev/null | grep -q "^$NODE_NS$i\b" || return 1; done
}

netns_up() {  # build $1 namespace nodes (see the header); returns non-zero if this host cannot
  local n=$1 i
  command -v ip >/dev/null || { echo "no \`ip\` command"; return 1; }
  netns_down
  {
    ip netns add $BR_NS &&
    ip -n $BR_NS link set lo up &&
    ip -n $BR_NS link add dbr0 type bridge && ip -n $BR_NS link set dbr0 up &&
    ip -n $BR_NS link add cbr0 type bridge && ip -n $BR_NS link set cbr0 up &&
    ip link add $ROOT_IF type veth peer name rootc netns $BR_NS &&
    ip -n $BR_NS link set rootc master cbr0 && ip -n $BR_NS link set rootc up &&
    ip addr add $ROOT_CTL/24 dev $ROOT_IF && ip link set $ROOT_IF up
  } || { netns_down; return 1; }
  for ((i = 0; i < n; i++)); do
    local ns=$NODE_NS$i
    {
      ip netns add $ns && ip -n $ns link set lo up &&
      ip -n $BR_NS link add d$i type veth peer name eth0 netns $ns &&
      ip -n $BR_NS link set d$i master dbr0 && ip -n $BR_NS link set d$i up &&
      ip -n $BR_NS link add c$i type veth peer name ctl0 netns $ns &&
      ip -n $BR_NS link set c$i master cbr0 && ip -n $BR_NS link set c$i up &&
      ip -n $ns addr add $DATA_NET.$((i + 1))/24 dev eth0 && ip -n $ns link set eth0 up &&
      ip -n $ns addr add $CTL_NET.$((i + 1))/24 dev ctl0 && ip -n $ns link set ctl0 up
    } || { netns_down; return 1; }
    echo "$CTL_NET.$((i + 1)) $ns $HOSTS_MARK" >>/etc/hosts
  done
  # No ping check: ICMP is missing in some sandboxes (gVisor); the nodes' registration with slurmctld, over
  # this network, is the check (up() waits for every node to be idle).
}

up() {
  need_root
  local t0=$SECONDS
  install
  local n=$NODES why
  if [ "$n" -gt 1 ] 2>/dev/null && [ "$(cat $NODES_FILE 2>/dev/null)" = "$n" ] && netns_present "$n"; then
    :  # already built by an earlier `up` (rebuilding would kill the running slurmd and their jobs)
  elif [ "$n" -gt 1 ] 2>/dev/null; then
    if ! why=$(netns_up "$n" 2>&1); then
      echo "slurm.sh: cannot build $n network-namespace nodes here (${why:-ip netns failed}); falling back to ONE node ($NODE): multi-node tests will skip" >&2
      n=0
    fi
  else
    n=0
  fi
  write_conf "$n"
  echo "$n" >$NODES_FILE
  start_munge
  alive /run/slurmctld.pid || slurmctld
  local names=() i
  if [ "$n" = 0 ]; then
    mkdir -p $SPOOL/$NODE
    alive /run/slurmd-$NODE.pid || slurmd -N "$NODE"
    names=("$NODE")
  else
    for ((i = 0; i < n; i++)); do
      mkdir -p $SPOOL/$NODE_NS$i
      alive /run/slurmd-$NODE_NS$i.pid || nsenter --net=/run/netns/$NODE_NS$i slurmd -N $NODE_NS$i
      names+=("$NODE_NS$i")
    done
  fi
  local want=${#names[@]}
  for _ in $(seq 60); do
    if [ "$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -cE ' (idle|mixed|allocated)')" -ge "$want" ]; then
      for i in "${names[@]}"; do scontrol update NodeName="$i" State=RESUME >/dev/null 2>&1 || true; done
      echo "slurm.sh: up in $((SECONDS - t0)) s: $(sinfo -h -o '%P %D node(s) %N %c CPUs %T')"
      return 0
    fi
    sleep 1
  done
  tail -n 20 $LOGS/slurmctld.log $LOGS/slurmd-*.log >&2 || true
  die "slurmctld/slurmd did not report $want idle node(s) within 60 s (logs above)"
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
  local f
  for f in /run/slurmd-*.pid /run/slurmd.pid; do [ -e "$f" ] && stop_pidfile "$f"; done
  stop_pidfile /run/slurmctld.pid
  stop_pidfile /run/munge/munged.pid
  netns_down
  rm -f $NODES_FILE
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
