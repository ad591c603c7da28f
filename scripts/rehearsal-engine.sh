#!/usr/bin/env bash
# The container rehearsal's own Docker engine (tests/deploy/test_rehearsal.py, tests/support/ecs_local.py).
#
#   bash scripts/rehearsal-engine.sh install   apt-get install docker.io mmdebstrap when missing
#   bash scripts/rehearsal-engine.sh start     install, then start our dockerd (idempotent) and its task network
#   bash scripts/rehearsal-engine.sh stop      remove every container, stop dockerd by its pidfile (idempotent;
#                                              not while a test session holds the engine's lock)
#   bash scripts/rehearsal-engine.sh env       print DOCKER_HOST=... for a shell: eval "$(... env)"
#
# Why our own daemon: nothing starts one on these machines, and a daemon we start we can also
# stop by its pidfile whatever happens (the pytest fixture calls `stop` in its finalizer and at
# exit). Everything lives under REHEARSAL_ROOT (default /var/tmp/triton-rehearsal): engine data
# (images, the build cache: reused by the next run on this machine), socket, pidfile, log.
# A clean machine works from nothing; delete the folder (after `stop`) to start over.
#
# Network settings (docs/rehearsal.md, 'The engine'): no iptables, no forwarding, no
# masquerading, and link-local addresses only (private ranges are flagged on these machines):
# the default bridge on REHEARSAL_BIP, task addresses on REHEARSAL_TASK_SUBNET.
set -euo pipefail

ROOT=${REHEARSAL_ROOT:-/var/tmp/triton-rehearsal}
DATA_ROOT=${REHEARSAL_DATA_ROOT:-$ROOT/docker}
RUN=$ROOT/run
SOCK=$RUN/docker.sock
PIDFILE=$RUN/dockerd.pid
EXEC_ROOT=$RUN/exec
LOG=$RUN/dockerd.log
BIP=${REHEARSAL_BIP:-169.254.123.1/24}
TASK_NETWORK=${REHEARSAL_TASK_NETWORK:-rehearsal-tasks}
TASK_SUBNET=${REHEARSAL_TASK_SUBNET:-169.254.124.0/24}
TASK_GATEWAY=${REHEARSAL_TASK_GATEWAY:-169.254.124.1}
TASK_BRIDGE=${REHEARSAL_TASK_BRIDGE:-rh-tasks0}  # a fixed name: removed at stop, never left to clash with a new one
DOCKERD=${REHEARSAL_DOCKERD:-/usr/sbin/dockerd}
DOCKER=${REHEARSAL_DOCKER:-/usr/bin/docker}  # docker.io's client, the daemon's version (not another on PATH)

docker_() { DOCKER_HOST="unix://$SOCK" "$DOCKER" "$@"; }

running_pid() {
  local pid
  [ -s "$PIDFILE" ] || return 1
  pid=$(cat "$PIDFILE")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

install() {
  if [ -x "$DOCKERD" ] && [ -x "$DOCKER" ] && command -v mmdebstrap >/dev/null; then
    return 0
  fi
  command -v apt-get >/dev/null || { echo "rehearsal-engine: no apt-get to install docker.io" >&2; return 3; }
  local pkgs=(docker.io mmdebstrap)
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${pkgs[@]}" \
    || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${pkgs[@]}"; }
}

write_config() {
  # Addresses, not names, and no private range anywhere (see the header).
  cat >"$RUN/daemon.json" <<EOF
{
  "iptables": false,
  "ip-forward": false,
  "ip-masq": false,
  "bip": "$BIP",
  "default-address-pools": [{"base": "169.254.128.0/17", "size": 24}],
  "storage-driver": "overlay2",
  "log-driver": "json-file",
  "log-opts": {"max-size": "10m", "max-file": "2"}
}
EOF
}

start() {
  install
  mkdir -p "$RUN" "$DATA_ROOT"
  if ! running_pid >/dev/null; then
    write_config
    rm -f "$SOCK"
    # setsid: the daemon outlives this shell but not `stop`; its own pidfile, socket, roots.
    setsid "$DOCKERD" --config-file "$RUN/daemon.json" --data-root "$DATA_ROOT" --exec-root "$EXEC_ROOT" \
      --pidfile "$PIDFILE" --host "unix://$SOCK" >>"$LOG" 2>&1 </dev/null &
    local i
    for i in $(seq 1 300); do
      docker_ version >/dev/null 2>&1 && break
      if [ "$i" = 300 ]; then
        echo "rehearsal-engine: dockerd did not answer on $SOCK within 30 s; its log:" >&2
        tail -n 30 "$LOG" >&2
        return 1
      fi
      sleep 0.1
    done
  fi
  local bridge
  if bridge=$(docker_ network inspect -f '{{index .Options "com.docker.network.bridge.name"}}' "$TASK_NETWORK" 2>/dev/null) \
    && [ "$bridge" != "$TASK_BRIDGE" ]; then
    docker_ network rm "$TASK_NETWORK" >/dev/null  # made with other settings (an older version of this script)
  fi
  if ! docker_ network inspect "$TASK_NETWORK" >/dev/null 2>&1; then
    docker_ network create --driver bridge --subnet "$TASK_SUBNET" --gateway "$TASK_GATEWAY" \
      --opt com.docker.network.bridge.name="$TASK_BRIDGE" --label rehearsal=1 "$TASK_NETWORK" >/dev/null
  fi
}

stop() {
  [ -d "$ROOT" ] || return 0  # never started on this machine
  # A test session holds $ROOT/lock while it uses the engine (tests/support/rehearsal.py): never stop it under one.
  exec 9>>"$ROOT/lock"
  if ! flock -n 9; then
    echo "rehearsal-engine: in use by another session (it holds $ROOT/lock); not stopped" >&2
    return 0
  fi
  local pid
  if pid=$(running_pid); then
    # Containers first (with a short grace), so nothing is left behind if dockerd must be killed.
    local ids
    ids=$(docker_ ps -aq 2>/dev/null || true)
    if [ -n "$ids" ]; then
      # shellcheck disable=SC2086
      docker_ rm -f $ids >/dev/null 2>&1 || true
    fi
    docker_ volume prune -f >/dev/null 2>&1 || true
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 200); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  # dockerd stops the containerd it started; one left by a killed dockerd goes by its own pidfile.
  local cpid
  if [ -s "$EXEC_ROOT/containerd/containerd.pid" ]; then
    cpid=$(cat "$EXEC_ROOT/containerd/containerd.pid")
    if kill -0 "$cpid" 2>/dev/null; then
      kill -TERM "$cpid" 2>/dev/null || true
    fi
  fi
  # Docker leaves its bridges up after it exits: the task network's would keep its address and route, and a
  # daemon with a fresh data root would add a second bridge on the same subnet, unreachable from the host.
  if ip link show "$TASK_BRIDGE" >/dev/null 2>&1 && ! running_pid >/dev/null; then
    ip link delete "$TASK_BRIDGE" 2>/dev/null || true
  fi
  # What the daemon leaves mounted under its exec root (the default network namespace's nsfs).
  local mnt
  awk -v root="$EXEC_ROOT/" 'index($2, root) == 1 {print $2}' /proc/mounts | sort -r | while read -r mnt; do
    umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  done
  rm -f "$PIDFILE"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  env) echo "DOCKER_HOST=unix://$SOCK" ;;
  *)
    echo "usage: $0 install|start|stop|env" >&2
    exit 2
    ;;
esac
