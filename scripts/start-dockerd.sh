#!/usr/bin/env bash
# Make sure a Docker engine answers, starting one when none does.
#
# Idempotent: when `docker info` already works this does nothing. Otherwise (as root, on a fresh
# Debian 12 machine or CI runner with no service manager) it installs what the sandbox layer needs
# when missing (docker.io for the engine, bubblewrap for the local provider, xfsprogs or btrfs-progs),
# starts `dockerd` in the background and waits until it answers.
#
# The engine stores containers where it can enforce a sandbox's disk quota (`--storage-opt size=`, from
# config.sandbox.disk_mb): overlay2 on XFS mounted with pquota, or, on kernels built without XFS quotas,
# btrfs with simple quotas (Linux 6.7+); either counts what a container writes, not its image. The file
# system lives in a sparse image file under /var/lib/workbench, made once and mounted again by every
# later run (after a reboot too). Where neither can be had (no loop devices, an older kernel), dockerd
# starts on its default data-root, and sandboxes provision only with SANDBOX_DISK_QUOTA=off.
#
# The engine (dockerd, containerd, and what they run to start and remove a container) gets the CPU in a
# cgroup of low weight, workbench-engine: it takes whatever CPU the platform leaves, but a user's request or
# a model's stream does not wait behind a sandbox being started. An engine already running in the root
# cgroup (as this script starts one) is moved there too; one a service manager placed is left where it is.
# The sandboxes' own processes stay in the groups Docker gives them.
#
# Usage: scripts/start-dockerd.sh [LOG_DIR]      (default: $DOCKERD_LOG_DIR or /tmp)
# Env:   DOCKERD_START_TIMEOUT (seconds, default 60), DOCKERD_FLAGS (extra flags for dockerd),
#        DOCKERD_DATA_ROOT (default /var/lib/workbench/docker), DOCKERD_FS_IMAGE (default
#        /var/lib/workbench/docker.img), DOCKERD_FS_SIZE (when the image is made; default 80% of the
#        free space beside it, which a sparse file takes only as it fills), DOCKERD_QUOTA_FS=0 (keep
#        dockerd's own data-root), DOCKERD_PIDFILE (default /var/run/docker.pid), DOCKERD_CPU_WEIGHT (the
#        engine's CPU weight, where a process's is 100: default 10; 0 leaves it where it starts)
set -euo pipefail

log_dir=${1:-${DOCKERD_LOG_DIR:-/tmp}}
timeout=${DOCKERD_START_TIMEOUT:-60}
log_file="$log_dir/dockerd.log"
data_root=${DOCKERD_DATA_ROOT:-/var/lib/workbench/docker}
fs_image=${DOCKERD_FS_IMAGE:-/var/lib/workbench/docker.img}
pid_file=${DOCKERD_PIDFILE:-/var/run/docker.pid}
quota_fs=${DOCKERD_QUOTA_FS:-1}
cpu_weight=${DOCKERD_CPU_WEIGHT:-10}

say() { echo "start-dockerd: $*" >&2; }

if ! [[ $cpu_weight =~ ^[0-9]+$ ]] || ((cpu_weight > 10000)); then
    say "DOCKERD_CPU_WEIGHT is a whole number from 1 to 10000 (a process's is 100), or 0 to leave the engine" \
        "where it starts; not '$cpu_weight'"
    exit 2
fi

install() {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# The engine's CPU cgroup, made with its weight (cgroup v2's cpu.weight, or v1's cpu.shares: 1024 a process);
# its directory, or nothing where there is none to make (not root, no cpu controller).
engine_group() {
    local group
    ((cpu_weight > 0)) && [[ $(id -u) == 0 ]] || return 0
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
        grep -qw cpu /sys/fs/cgroup/cgroup.controllers || return 0
        group=/sys/fs/cgroup/workbench-engine
        { grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control || echo +cpu >/sys/fs/cgroup/cgroup.subtree_control; } &&
            mkdir -p "$group" && echo "$cpu_weight" >"$group/cpu.weight" || return 0
    elif [[ -d /sys/fs/cgroup/cpu ]]; then
        group=/sys/fs/cgroup/cpu/workbench-engine
        mkdir -p "$group" && echo $((cpu_weight * 1024 / 100 > 2 ? cpu_weight * 1024 / 100 : 2)) >"$group/cpu.shares" ||
            return 0
    else
        return 0
    fi
    echo "$group"
}

# The cpu cgroup of process $1, as /proc/PID/cgroup names it ("/" for the root).
cpu_cgroup_of() {
    awk -F: '$2 ~ /(^|,)cpu(,|$)/ { v1 = $3 } $1 == "0" { v2 = $3 } END { print (v1 != "" ? v1 : v2) }' \
        "/proc/$1/cgroup" 2>/dev/null
}

# Move a running engine (dockerd from the pid file, its containerd, their containers' shims) into the group,
# if it is in the root cgroup: one a service manager placed is left where it is.
adopt_engine() {
    local group=$1 dockerd pid moved=0 stuck=()
    dockerd=$(cat "$pid_file" 2>/dev/null) && kill -0 "$dockerd" 2>/dev/null || return 0
    [[ $(cpu_cgroup_of "$dockerd") == / ]] || return 0
    for pid in "$dockerd" $(pgrep -P "$dockerd" -x containerd) $(pgrep -f 'containerd-shim.*-namespace moby'); do
        [[ $(cpu_cgroup_of "$pid") == / ]] || continue
        if echo "$pid" >"$group/cgroup.procs" 2>/dev/null; then
            moved=$((moved + 1))
        elif kill -0 "$pid" 2>/dev/null; then # one that ended meanwhile is no failure
            stuck+=("$pid")
        fi
    done
    say "moved the running engine ($moved processes) into the CPU cgroup $group (weight $cpu_weight)"
    ((${#stuck[@]} == 0)) || say "could not move process(es) ${stuck[*]} there: they keep the CPU weight of the root cgroup"
}

cpu_group=$(engine_group)

if docker info >/dev/null 2>&1; then
    say "the Docker engine already answers"
    [[ -z $cpu_group ]] || adopt_engine "$cpu_group"
    driver=$(docker info --format '{{.Driver}}' 2>/dev/null || true)
    backing=$(docker info --format \
        '{{range .DriverStatus}}{{if eq (index . 0) "Backing Filesystem"}}{{index . 1}}{{end}}{{end}}' \
        2>/dev/null || true)
    if [[ $driver != btrfs && $backing != xfs ]]; then
        say "note: its storage ($driver on ${backing:-an unknown file system}) cannot enforce sandbox disk" \
            "quotas: stop it and run this script as root to start it on a file system that can, or set" \
            "SANDBOX_DISK_QUOTA=off"
    fi
    exit 0
fi

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
[[ $quota_fs == 0 ]] || command -v mkfs.xfs >/dev/null 2>&1 || missing+=(xfsprogs)
if ((${#missing[@]})); then
    if [[ $(id -u) != 0 ]]; then
        say "missing ${missing[*]} and not root: install them (apt-get install -y ${missing[*]})"
        exit 1
    fi
    say "installing ${missing[*]}"
    install "${missing[@]}"
fi

if [[ $(id -u) != 0 ]]; then
    say "no Docker engine answers and starting one needs root (or add yourself to the docker group)"
    exit 1
fi

# A dockerd that died uncleanly leaves a pid file that stops the next one from starting.
if [[ -f $pid_file ]] && ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
    rm -f "$pid_file"
fi

mkdir -p "$log_dir"

# btrfs counts a quota in "simple" mode (Linux 6.7+) as overlay2 on XFS does: what the container writes,
# not the image it shares. The classic qgroups dockerd would turn on count the image too, and newer
# kernels stop enforcing them once a removed container's qgroup marks them inconsistent. dockerd turns
# quotas off when it stops, so each start turns them on again before dockerd would.
simple_quotas() {
    local mode
    mode=$(cat "/sys/fs/btrfs/$(findmnt -no UUID --target "$data_root")/qgroups/mode" 2>/dev/null || echo off)
    [[ $mode != squota ]] || return 0
    say "enabling btrfs simple quotas on $data_root"
    # BTRFS_IOC_QUOTA_CTL, _IOWR(0x94, 40, {u64 cmd, status}): cmd 2 disables quotas, 4 enables simple
    # ones (Debian 12's btrfs-progs has no `btrfs quota enable --simple`).
    python3 - "$data_root" "$mode" <<'PY' || {
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for cmd in ([2] if sys.argv[2] != "off" else []) + [4]:
    fcntl.ioctl(fd, 0xC0109428, bytearray(struct.pack("QQ", cmd, 0)))
PY
        say "this kernel has no btrfs simple quotas (they need Linux 6.7 or later)"
        return 1
    }
}

# The storage driver for what is mounted at $data_root, if it can enforce quotas.
quota_driver() {
    local found
    found=$(findmnt -no FSTYPE,OPTIONS --target "$data_root")
    if [[ $found == xfs* && $found == *prjquota* ]]; then
        echo overlay2
    elif [[ $found == btrfs* ]]; then
        simple_quotas && echo btrfs
    else
        say "$data_root is a mount point, but neither XFS with pquota nor btrfs ($found)"
        return 1
    fi
}

# Make the image as XFS; if this kernel cannot mount XFS with project quotas, as btrfs.
make_image() {
    local size=${DOCKERD_FS_SIZE:-}
    if [[ -z $size ]]; then
        size=$(($(df --output=avail -B1 "$(dirname "$fs_image")" | tail -n 1) * 8 / 10))
    fi
    say "making the engine's file system in $fs_image (sparse, $size bytes)"
    rm -f "$fs_image.partial"
    truncate -s "$size" "$fs_image.partial" || return 1
    mkfs.xfs -q "$fs_image.partial" || return 1
    if mount -o loop,pquota "$fs_image.partial" "$data_root" 2>/dev/null; then
        umount "$data_root"
    else
        say "this kernel cannot mount XFS with project quotas (CONFIG_XFS_QUOTA); using btrfs instead"
        command -v mkfs.btrfs >/dev/null 2>&1 || install btrfs-progs || return 1
        mkfs.btrfs -q -f "$fs_image.partial" >/dev/null || return 1
    fi
    mv "$fs_image.partial" "$fs_image"
}

# Mount the quota-capable file system at $data_root (making it the first time); print its driver.
# Called as a condition, where `set -e` does not hold: each step says when it fails.
mount_quota_fs() {
    mkdir -p "$data_root" "$(dirname "$fs_image")" || return 1
    if ! mountpoint -q "$data_root"; then
        [[ -s $fs_image ]] || make_image >&2 || return 1
        # discard: the space a sandbox frees goes back to the host's file system.
        case $(blkid -o value -s TYPE "$fs_image") in
        xfs) mount -o loop,pquota,discard "$fs_image" "$data_root" || return 1 ;;
        btrfs) mount -o loop,discard "$fs_image" "$data_root" || return 1 ;;
        *)
            say "$fs_image holds neither XFS nor btrfs: remove it to have it made again"
            return 1
            ;;
        esac
    fi
    quota_driver
}

storage=()
if [[ $quota_fs != 0 ]]; then
    if driver=$(mount_quota_fs); then
        storage=(--data-root "$data_root" --storage-driver "$driver")
        say "the engine stores containers in $data_root ($driver): sandbox disk quotas are enforced"
    else
        say "WARNING: no file system that enforces disk quotas (see above); dockerd starts on its default" \
            "data-root, and sandboxes provision only with SANDBOX_DISK_QUOTA=off"
    fi
fi

# Start dockerd detached from this shell, in the engine's CPU cgroup (containerd and what it starts follow);
# return its pid.
launch() {
    (
        [[ -z $cpu_group ]] || echo "$BASHPID" >"$cpu_group/cgroup.procs"
        # shellcheck disable=SC2086  # flags are words on purpose
        exec setsid dockerd --pidfile "$pid_file" "${storage[@]}" ${DOCKERD_FLAGS:-} "$@"
    ) >>"$log_file" 2>&1 </dev/null &
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
    rm -f "$pid_file"
    pid=$(launch --iptables=false --ip6tables=false)
    status=0
    wait_ready "$pid" || status=$?
fi

case $status in
0) say "the Docker engine answers (dockerd pid $pid${cpu_group:+, CPU cgroup $cpu_group weight $cpu_weight})" ;;
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
