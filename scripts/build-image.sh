#!/usr/bin/env bash
# Build the default sandbox image without any container registry.
#
# mmdebstrap builds a Debian bookworm root file system from the Debian mirror this machine already
# uses (read from /etc/apt/sources.list*), as a tarball cached under .cache/; `docker import` turns it
# into the image. It holds what the in-sandbox toolbox needs (bash, coreutils, python3, ripgrep, procps,
# findutils, grep, sed) plus git and ca-certificates, a user `sandbox` (uid 1000) and /workspace.
# The same file system is unpacked for the local (bubblewrap) provider, which binds it read-only as a
# sandbox's /: into $WORKBENCH_LOCAL_ROOTFS/<the image's name, with _ for / and :>, owned by the caller.
# Without a Docker engine only that folder is made.
#
# Usage: scripts/build-image.sh [--force]
# Env:   SANDBOX_IMAGE (default workbench-sandbox:latest), SANDBOX_DEBIAN_MIRROR (override the mirror),
#        SANDBOX_CACHE_DIR (default <repo>/.cache), WORKBENCH_LOCAL_ROOTFS (default <cache dir>/rootfs)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
image=${SANDBOX_IMAGE:-workbench-sandbox:latest}
cache_dir=${SANDBOX_CACHE_DIR:-$repo/.cache}
suite=bookworm
packages=bash,coreutils,python3,git,ripgrep,ca-certificates,procps,findutils,grep,sed,diffutils,patch,less

force=0
for arg in "$@"; do
    case $arg in
    --force) force=1 ;;
    -h | --help)
        sed -n '2,15p' "$0"
        exit 0
        ;;
    *)
        echo "build-image: unknown argument $arg" >&2
        exit 2
        ;;
    esac
done

say() { echo "build-image: $*" >&2; }

rootfs_root=${WORKBENCH_LOCAL_ROOTFS:-$cache_dir/rootfs}
rootfs=$rootfs_root/${image//[^A-Za-z0-9._-]/_}

docker=0
if "$here/start-dockerd.sh"; then
    docker=1
else
    say "no Docker engine: only the local provider's root file system is made"
fi
need_image=0
if ((docker)) && { ((force)) || ! docker image inspect "$image" >/dev/null 2>&1; }; then need_image=1; fi
need_rootfs=0
if ((force)) || [[ ! -d $rootfs ]]; then need_rootfs=1; fi

if ((!need_image && !need_rootfs)); then
    say "$image and its root file system $rootfs already exist (use --force to rebuild)"
    exit 0
fi

# Unpack the tar on stdin as the local provider's root: a folder only its owner may change, with the
# mount points of the provider's binds made beforehand (bwrap cannot create them on a read-only root).
unpack_rootfs() {
    local partial="$rootfs.partial" old="$rootfs.old"
    rm -rf "$partial" "$old"
    mkdir -p "$partial"
    tar -x -C "$partial" --numeric-owner --exclude='./dev/*' --exclude='dev/*'
    mkdir -p "$partial"/{workspace,tmp,proc,dev,home/sandbox,opt/workbench/toolbox}
    # The image's own (no secret in them), but a sandbox has no use for them.
    rm -rf "$partial"/root "$partial"/etc/{shadow,gshadow,shadow-,gshadow-}
    touch "$partial"/etc/{passwd,group,hosts,resolv.conf}
    chmod 0755 "$partial"
    chmod go-w "$rootfs_root"
    if [[ -d $rootfs ]]; then mv "$rootfs" "$old"; fi
    mv "$partial" "$rootfs"
    rm -rf "$old"
    say "unpacked the local provider's root file system at $rootfs"
}
mkdir -p "$rootfs_root"

if ((!need_image && docker)); then
    say "unpacking the local provider's root file system from $image"
    container=$(docker create "$image" true)
    docker export "$container" | unpack_rootfs
    docker rm "$container" >/dev/null
    exit 0
fi

# The mirrors this machine's apt uses for $suite: $mirror, $updates, $security (shared with the platform images).
# shellcheck source=../docker-images/debian-mirror.sh
. "$(dirname "$0")/../docker-images/debian-mirror.sh"

if ! command -v mmdebstrap >/dev/null 2>&1; then
    say "installing mmdebstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
fi

# The tarball is named after everything that shapes it, so editing this script rebuilds it.
key=$(printf '%s\n' "$(cat "$0")" "$mirror" "$updates" "$security" | sha256sum | cut -c1-12)
tarball="$cache_dir/sandbox-rootfs-$suite-$key.tar"
mkdir -p "$cache_dir"

if ((force)) || [[ ! -s $tarball ]]; then
    say "building the root file system with mmdebstrap from $mirror (a few minutes the first time)"
    rm -f "$cache_dir"/sandbox-rootfs-*.tar
    mmdebstrap \
        --variant=minbase \
        --format=tar \
        --include="$packages" \
        --aptopt='Acquire::Languages "none"' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/lintian/*' \
        --customize-hook='chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash sandbox' \
        --customize-hook='mkdir -p "$1/workspace" && chown 1000:1000 "$1/workspace"' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log "$1"/var/log/apt/*' \
        "$suite" "$tarball.partial" \
        "deb $mirror $suite main" \
        "deb $updates $suite-updates main" \
        "deb $security $suite-security main"
    mv "$tarball.partial" "$tarball"
else
    say "reusing the cached root file system $tarball"
fi

if ((need_rootfs)); then unpack_rootfs <"$tarball"; fi
if ((!need_image)); then exit 0; fi

say "importing $tarball as $image"
docker import \
    --change 'USER sandbox' \
    --change 'WORKDIR /workspace' \
    --change 'ENV HOME=/home/sandbox' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'LABEL workbench.image=sandbox' \
    --change 'CMD ["sleep", "infinity"]' \
    "$tarball" "$image" >/dev/null
say "built $image ($(docker image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}'))"
