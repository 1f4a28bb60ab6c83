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
# Usage: scripts/start-dockerd.sh [LOG_DIR]      (default: $DOCKERD_LOG_DIR or /tmp)
# Env:   DOCKERD_START_TIMEOUT (seconds, default 60), DOCKERD_FLAGS (extra flags for dockerd),
#        DOCKERD_DATA_ROOT (default /var/lib/workbench/docker), DOCKERD_FS_IMAGE (default
#        /var/lib/workbench/docker.img), DOCKERD_FS_SIZE (when the image is made; default 80% of the
#        free space beside it, which a sparse file takes only as it fills), DOCKERD_QUOTA_FS=0 (keep
#        dockerd's own data-root), DOCKERD_PIDFILE (default /var/run/docker.pid)
set -euo pipefail

log_dir=${1:-${DOCKERD_LOG_DIR:-/tmp}}
timeout=${DOCKERD_START_TIMEOUT:-60}
log_file="$log_dir/dockerd.log"
data_root=${DOCKERD_DATA_ROOT:-/var/lib/workbench/docker}
fs_image=${DOCKERD_FS_IMAGE:-/var/lib/workbench/docker.img}
pid_file=${DOCKERD_PIDFILE:-/var/run/docker.pid}
quota_fs=${DOCKERD_QUOTA_FS:-1}

say() { echo "start-dockerd: $*" >&2; }

install() {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if docker info >/dev/null 2>&1; then
    say "the Docker engine already answers"
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

# Start dockerd detached from this shell; return its pid.
launch() {
    # shellcheck disable=SC2086  # flags are words on purpose
    setsid dockerd --pidfile "$pid_file" "${storage[@]}" ${DOCKERD_FLAGS:-} "$@" >>"$log_file" 2>&1 </dev/null &
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
