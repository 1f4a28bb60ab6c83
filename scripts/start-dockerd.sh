#!/usr/bin/env bash
# Make sure a Docker engine answers, starting one when none does.
#
# Idempotent: when `docker info` already works this does nothing. Otherwise (as root, on a fresh
# Debian 12 machine or CI runner with no service manager) it installs what the sandbox layer needs
# when missing (docker.io for the engine, bubblewrap for the local provider), starts `dockerd` in
# the background and waits until it answers.
#
# Usage: scripts/start-dockerd.sh [LOG_DIR]      (default: $DOCKERD_LOG_DIR or /tmp)
# Env:   DOCKERD_START_TIMEOUT (seconds, default 60), DOCKERD_FLAGS (extra flags for dockerd)
set -euo pipefail

log_dir=${1:-${DOCKERD_LOG_DIR:-/tmp}}
timeout=${DOCKERD_START_TIMEOUT:-60}
log_file="$log_dir/dockerd.log"

say() { echo "start-dockerd: $*" >&2; }

if docker info >/dev/null 2>&1; then
    say "the Docker engine already answers"
    exit 0
fi

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
if ((${#missing[@]})); then
    if [[ $(id -u) != 0 ]]; then
        say "missing ${missing[*]} and not root: install them (apt-get install -y ${missing[*]})"
        exit 1
    fi
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ $(id -u) != 0 ]]; then
    say "no Docker engine answers and starting one needs root (or add yourself to the docker group)"
    exit 1
fi

# A dockerd that died uncleanly leaves a pid file that stops the next one from starting.
if [[ -f /var/run/docker.pid ]] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    rm -f /var/run/docker.pid
fi

mkdir -p "$log_dir"

# Start dockerd detached from this shell; return its pid.
launch() {
    # shellcheck disable=SC2086  # flags are words on purpose
    setsid dockerd ${DOCKERD_FLAGS:-} "$@" >>"$log_file" 2>&1 </dev/null &
    echo $!
}

# Wait until `docker info` answers (0), dockerd died (1) or the time is up (2).
wait_ready() {
    local pid=$1 deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        docker info >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.2
    done
    return 2
}

say "starting dockerd (log: $log_file)"
pid=$(launch)
status=0
wait_ready "$pid" || status=$?

# Kernels or VMs without working iptables/nat make the default bridge fail at start. Sandboxes run
# without network by default, so an engine without iptables management is an acceptable fallback.
if ((status == 1)) && grep -qiE 'iptables|bridge|nat' "$log_file"; then
    say "dockerd exited (iptables/bridge trouble, see log); retrying with --iptables=false --ip6tables=false"
    rm -f /var/run/docker.pid
    pid=$(launch --iptables=false --ip6tables=false)
    status=0
    wait_ready "$pid" || status=$?
fi

case $status in
0) say "the Docker engine answers (dockerd pid $pid)" ;;
1)
    say "dockerd exited before answering; last lines of $log_file:"
    tail -n 30 "$log_file" >&2
    exit 1
    ;;
*)
    say "dockerd did not answer within ${timeout}s; last lines of $log_file:"
    tail -n 30 "$log_file" >&2
    exit 1
    ;;
esac
