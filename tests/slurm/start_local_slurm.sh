#!/usr/bin/env bash
# Start a real one-node Slurm cluster on localhost (for tests and CI).
#
# Target: Debian 12 (bookworm), run as root, no systemd as PID 1 (containers):
# daemons are started directly, not through systemctl.  Idempotent: if the
# cluster already answers, it exits 0 right away.
#
# Knobs (environment):
#   SLURM_LOCAL_CPUS     CPUs declared for the node (default: max(nproc, 8)).
#                        More than the physical count is fine: slurmd runs with
#                        SlurmdParameters=config_overrides, so jobs asking for
#                        up to this many CPUs run (time-shared) on a small box.
#   SLURM_LOCAL_CLUSTER  ClusterName (default: localcluster).
#   SLURM_LOCAL_TIMEOUT  seconds to wait for the node to become idle (default 60).
#
# Check the cluster afterwards with:  sinfo; scontrol ping; squeue;
#   sbatch --wrap 'hostname'; scontrol show node
# Logs: /var/log/slurm/slurmctld.log, /var/log/slurm/slurmd.log,
#       /var/log/munge/munged.log
set -euo pipefail

CLUSTER_NAME="${SLURM_LOCAL_CLUSTER:-localcluster}"
WAIT_S="${SLURM_LOCAL_TIMEOUT:-60}"
SLURM_CONF_DIR=/etc/slurm
SLURM_CONF="$SLURM_CONF_DIR/slurm.conf"
LOG_DIR=/var/log/slurm
CTLD_SPOOL=/var/spool/slurmctld
SLURMD_SPOOL=/var/spool/slurmd
RUN_DIR=/run/slurm

log() { printf '[start_local_slurm] %s\n' "$*"; }

dump_logs() {
    local f
    for f in "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" /var/log/munge/munged.log; do
        if [[ -f "$f" ]]; then
            printf '==== tail -n 40 %s ====\n' "$f" >&2
            tail -n 40 "$f" >&2 || true
        fi
    done
}

die() {
    printf '[start_local_slurm] ERROR: %s\n' "$*" >&2
    dump_logs
    exit 1
}

on_err() {
    local rc=$? line=$1
    printf '[start_local_slurm] ERROR: command failed (rc=%s) at line %s\n' "$rc" "$line" >&2
    dump_logs
    exit "$rc"
}
trap 'on_err $LINENO' ERR

[[ $EUID -eq 0 ]] || die "must run as root"

NODE="$(hostname -s)"
[[ -n "$NODE" ]] || die "hostname -s is empty"

# States in which the node can take jobs (sinfo %T may append *,~,#,$,@,!,%).
node_state() { sinfo -h -n "$NODE" -o '%T' 2>/dev/null | head -n 1 | tr -d '*~#$@!%^-' || true; }
node_ready() {
    case "$(node_state)" in
        idle | mixed | allocated | completing) return 0 ;;
        *) return 1 ;;
    esac
}
summary() { sinfo -o '%P %a %l %D %T %c %m %N' 2>/dev/null | tail -n +1 || true; }

# ---------------------------------------------------------------- fast path
if command -v scontrol >/dev/null 2>&1 && [[ -f "$SLURM_CONF" ]] \
    && timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP' && node_ready; then
    log "cluster already running"
    summary
    exit 0
fi

# ---------------------------------------------------------------- 1. install
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
    || ! command -v munged >/dev/null 2>&1 || ! command -v sinfo >/dev/null 2>&1; then
    log "installing slurm-wlm and munge (apt)"
    # Keep package maintainer scripts from starting services (no init system
    # here); we start the daemons ourselves below.
    added_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        added_policy=1
    fi
    # apt/dpkg chatter (debconf, invoke-rc.d notes) goes to a log that is
    # only shown if the install fails.
    apt_log="$(mktemp /tmp/start_local_slurm.apt.XXXXXX)"
    apt_rc=0
    {
        apt-get update -qq \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                -o Dpkg::Use-Pty=0 --no-install-recommends \
                slurm-wlm munge
    } >"$apt_log" 2>&1 || apt_rc=$?
    if [[ $added_policy -eq 1 ]]; then rm -f /usr/sbin/policy-rc.d; fi
    if [[ $apt_rc -ne 0 ]]; then
        tail -n 40 "$apt_log" >&2
        die "apt-get install slurm-wlm munge failed (rc=$apt_rc, full log: $apt_log)"
    fi
    rm -f "$apt_log"
fi

# ---------------------------------------------------------------- 2. munge
getent passwd munge >/dev/null || die "user 'munge' missing (munge package broken?)"
install -d -o munge -g munge -m 0700 /etc/munge
install -d -o munge -g munge -m 0700 /var/lib/munge
install -d -o munge -g munge -m 0700 /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null 2>&1; then
        rm -f /etc/munge/munge.key
        mungekey --create --keyfile=/etc/munge/munge.key >/dev/null
    else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if ! munge_ok; then
    log "starting munged"
    # Remove a stale socket/pid left by a dead munged.
    if [[ -f /run/munge/munged.pid ]] && ! kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
        rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    fi
    runuser -u munge -- /usr/sbin/munged --force \
        || die "munged failed to start"
    for _ in $(seq 1 50); do munge_ok && break; sleep 0.2; done
fi
munge_ok || die "munge -n | unmunge does not work"

# ---------------------------------------------------------------- 3. config
PHYS_CPUS="$(nproc)"
CPUS="${SLURM_LOCAL_CPUS:-$((PHYS_CPUS > 8 ? PHYS_CPUS : 8))}"
MEM_TOTAL_MB=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024))
REAL_MEM_MB=$((MEM_TOTAL_MB - 2048))
((REAL_MEM_MB >= 512)) || REAL_MEM_MB=$((MEM_TOTAL_MB / 2))
DEF_MEM_PER_CPU=$((REAL_MEM_MB / CPUS))

install -d -m 0755 "$SLURM_CONF_DIR" "$LOG_DIR" "$RUN_DIR"
install -d -m 0755 "$CTLD_SPOOL" "$SLURMD_SPOOL"

tmp_conf="$(mktemp "$SLURM_CONF_DIR/.slurm.conf.XXXXXX")"
cat >"$tmp_conf" <<EOF
# Generated by tests/slurm/start_local_slurm.sh -- one-node test cluster.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$CTLD_SPOOL
SlurmdSpoolDir=$SLURMD_SPOOL
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups: plain process tracking, no task binding, no accounting.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true

SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=$DEF_MEM_PER_CPU
# The node may declare more CPUs than the machine has (see SLURM_LOCAL_CPUS).
SlurmdParameters=config_overrides

ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
Waittime=0

NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$REAL_MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
chmod 0644 "$tmp_conf"
mv -f "$tmp_conf" "$SLURM_CONF"
log "wrote $SLURM_CONF (node $NODE: CPUs=$CPUS on $PHYS_CPUS physical, RealMemory=${REAL_MEM_MB}M)"

# ---------------------------------------------------------------- 4. daemons
pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

if pid_alive "$RUN_DIR/slurmctld.pid"; then
    log "slurmctld running; reloading config"
    scontrol reconfigure >/dev/null 2>&1 || true
else
    log "starting slurmctld"
    slurmctld || die "slurmctld failed to start"
fi
if pid_alive "$RUN_DIR/slurmd.pid"; then
    log "slurmd already running"
else
    log "starting slurmd"
    slurmd || die "slurmd failed to start"
fi

log "waiting up to ${WAIT_S}s for node $NODE to become idle"
deadline=$((SECONDS + WAIT_S))
state=""
while ((SECONDS < deadline)); do
    if timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; then
        state="$(node_state)"
        case "$state" in
            idle | mixed | allocated | completing) break ;;
            down | drained | draining | drain | fail | failing | "down+"* | *drain*)
                scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
        esac
    fi
    pid_alive "$RUN_DIR/slurmctld.pid" || die "slurmctld died"
    pid_alive "$RUN_DIR/slurmd.pid" || die "slurmd died"
    sleep 1
done
node_ready || {
    scontrol show node "$NODE" >&2 2>/dev/null || true
    die "node $NODE not ready after ${WAIT_S}s (state: '${state:-?}')"
}

log "cluster ready"
summary
