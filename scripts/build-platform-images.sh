#!/usr/bin/env bash
# Build the images of the compose stack (docker-compose.yml) without any container registry:
#
#   workbench-base      Debian bookworm, built by mmdebstrap from the mirror this machine's apt uses and
#                       `docker import`ed: Python, git, PostgreSQL 15 and Redis in one root file system, which
#                       the three images below share (stored once, built once)
#   workbench           the platform (Dockerfile): the app and its Python dependencies, as wheels that pip
#                       downloads from PyPI on this machine (its own index and certificates) into .cache
#   workbench-postgres  docker-images/postgres/Dockerfile: the base, PostgreSQL's user, volume and entry point
#   workbench-redis     docker-images/redis/Dockerfile
#   workbench-egress    (with --egress) docker-images/egress/Dockerfile: the platform and the egress proxy's venv
#
# Cached and idempotent: the root file system's tarball and the wheels are kept under .cache, named after
# what shapes them (the package list, the mirrors, pyproject.toml, the versions .venv runs), and Docker's
# layer cache skips the rest, so a run with nothing changed takes seconds. --force rebuilds everything.
# Also installs the compose tool when there is none (Debian's docker-compose).
#
# Usage: scripts/build-platform-images.sh [--force] [--egress]
# Env:   WORKBENCH_IMAGE_TAG (default latest), SANDBOX_DEBIAN_MIRROR (override the mirror),
#        SANDBOX_CACHE_DIR (where the root file system's tarball is kept; default <repo>/.cache)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
tag=${WORKBENCH_IMAGE_TAG:-latest}
cache_dir=${SANDBOX_CACHE_DIR:-$repo/.cache}
# The wheels are part of the platform's build context, so they live in the repository's .cache.
wheel_root=$repo/.cache
suite=bookworm
packages=python3,python3-venv,ca-certificates,git,netbase,postgresql-15,redis-server

force=0
egress=0
for arg in "$@"; do
    case $arg in
    --force) force=1 ;;
    --egress) egress=1 ;;
    -h | --help)
        sed -n '2,21p' "$0"
        exit 0
        ;;
    *)
        echo "build-platform-images: unknown argument $arg" >&2
        exit 2
        ;;
    esac
done

say() { echo "build-platform-images: $*" >&2; }
started=$SECONDS
elapsed() { echo "$((SECONDS - started)) s"; }

install_debian() {
    if [[ $(id -u) != 0 ]]; then
        say "missing $* and not root: install them (apt-get install -y $*)"
        exit 1
    fi
    say "installing $*"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

"$here/start-dockerd.sh"
command -v mmdebstrap >/dev/null 2>&1 || install_debian mmdebstrap
if ! docker compose version >/dev/null 2>&1 && ! docker-compose version >/dev/null 2>&1; then
    install_debian docker-compose
fi
# Docker's legacy builder, which needs no buildx plugin and pulls nothing for a FROM it already has.
export DOCKER_BUILDKIT=0

# --- the base: one root file system, imported ---------------------------------------------------------
# shellcheck source=../docker-images/debian-mirror.sh
. "$repo/docker-images/debian-mirror.sh"
# Shapes the root file system: the tarball and the image are named after it.
recipe=(
    --variant=minbase
    --format=tar
    --include="$packages"
    --aptopt='Acquire::Languages "none"'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/lintian/*'
    # PostgreSQL's JIT compiler (LLVM and z3: 130 MB) is loaded only for JIT, which the image turns off.
    --dpkgopt='path-exclude=/usr/lib/*/libLLVM-*'
    --dpkgopt='path-exclude=/usr/lib/*/libz3.so*'
    --dpkgopt='path-exclude=/usr/lib/postgresql/*/lib/llvmjit*'
    --dpkgopt='path-exclude=/usr/lib/postgresql/*/lib/bitcode/*'
    # The package makes a cluster; the image makes its own, in a volume, on first start.
    --customize-hook='rm -rf "$1"/var/lib/postgresql/*/main "$1"/etc/postgresql/*/main'
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log "$1"/var/log/apt/*'
)
base_key=$(printf '%s\n' "${recipe[@]}" "$mirror" "$updates" "$security" | sha256sum | cut -c1-12)
base_image=workbench-base:$base_key
tarball=$cache_dir/platform-rootfs-$suite-$base_key.tar
mkdir -p "$cache_dir"

if ((force)) || ! docker image inspect "$base_image" >/dev/null 2>&1; then
    if ((force)) || [[ ! -s $tarball ]]; then
        say "building the base root file system with mmdebstrap from $mirror (about a minute)"
        rm -f "$cache_dir"/platform-rootfs-*.tar
        mmdebstrap "${recipe[@]}" "$suite" "$tarball.partial" \
            "deb $mirror $suite main" \
            "deb $updates $suite-updates main" \
            "deb $security $suite-security main"
        mv "$tarball.partial" "$tarball"
    else
        say "reusing the cached root file system $tarball"
    fi
    say "importing $tarball as $base_image"
    docker import \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'LABEL workbench.image=base' \
        --change 'CMD ["/bin/bash"]' \
        "$tarball" "$base_image" >/dev/null
else
    say "$base_image already exists"
fi
docker tag "$base_image" "workbench-base:$tag"
say "base ready ($(elapsed))"

# --- the platform's Python dependencies: wheels pip downloads in the base, for the base's Python ---------
# pip runs in a container of the base (its Python decides the environment markers and the wheels' tags) on
# the host's network, with this machine's pip index and certificate bundle when it has its own.
pip_setting() {
    local from_env=$1 key=$2
    if [[ -n ${!from_env:-} ]]; then
        echo "${!from_env}"
    elif command -v python3 >/dev/null 2>&1; then
        python3 -m pip config get "$key" 2>/dev/null || true
    fi
}
pip_options=()
pip_mounts=()
index=$(pip_setting PIP_INDEX_URL global.index-url)
if [[ $index == http* ]]; then pip_options+=(--index-url "$index"); fi
cert=$(pip_setting PIP_CERT global.cert)
if [[ -f $cert ]]; then
    pip_mounts+=(--volume "$cert:/etc/workbench-pip-ca.pem:ro")
    pip_options+=(--cert /etc/workbench-pip-ca.pem)
fi

# wheels_for NAME REQUIREMENTS [VENV]: the wheels of REQUIREMENTS in .cache/NAME-wheels, at the versions
# VENV runs where it has them (for the platform .venv: what `make test` tests); pip resolves the rest.
wheels_for() {
    local name=$1 requirements=$2 venv=${3:-} folder key inputs
    inputs=$(mktemp -d)
    grep -v '^#' "$requirements" >"$inputs/requirements.txt"
    touch "$inputs/constraints.txt"
    if [[ -n $venv && -x $venv/bin/python ]]; then
        "$venv/bin/python" -m pip freeze --disable-pip-version-check --exclude-editable 2>/dev/null \
            | grep -v ' @ ' >"$inputs/constraints.txt" || true
    fi
    key=$(cat "$inputs/requirements.txt" "$inputs/constraints.txt" <(echo "$base_key") | sha256sum | cut -c1-12)
    folder=$wheel_root/$name-wheels
    if ((!force)) && [[ -f $folder/.key && $(cat "$folder/.key") == "$key" ]]; then
        say "reusing the wheels in $folder"
    else
        say "downloading the wheels of $requirements into $folder"
        rm -rf "$folder.partial"
        mkdir -p "$folder.partial"
        docker run --rm --network host --user "$(id -u):$(id -g)" --env HOME=/tmp \
            --volume "$inputs:/inputs:ro" --volume "$folder.partial:/wheels" "${pip_mounts[@]}" \
            "$base_image" sh -c 'python3 -m venv /tmp/pip && exec /tmp/pip/bin/pip download "$@"' pip \
            --quiet --disable-pip-version-check --no-cache-dir --only-binary=:all: --dest /wheels \
            --requirement /inputs/requirements.txt --constraint /inputs/constraints.txt "${pip_options[@]}"
        cp "$inputs/requirements.txt" "$folder.partial/requirements.txt"
        echo "$key" >"$folder.partial/.key"
        rm -rf "$folder"
        mv "$folder.partial" "$folder"
    fi
    rm -rf "$inputs"
    wheels_key[$name]=$key
}
declare -A wheels_key

requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
python3 -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
    "$repo/pyproject.toml" >"$requirements"
wheels_for platform "$requirements" "$repo/.venv"
if ((egress)); then wheels_for egress "$repo/docker-images/egress/requirements.txt" "$repo/.venv-egress"; fi
say "wheels ready ($(elapsed))"

# --- the images -----------------------------------------------------------------------------------------
no_cache=()
if ((force)); then no_cache=(--no-cache); fi
# build IMAGE ARGS...: docker build, then remove the image the tag named before when nothing else names or
# runs it (each change to the app would otherwise leave one behind).
build() {
    local image=$1 before after
    shift
    before=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    say "building $image"
    docker build --quiet --force-rm "${no_cache[@]}" --build-arg "BASE=$base_image" \
        --label "workbench.base=$base_key" --tag "$image" "$@" \
        2> >(grep -v -e 'legacy builder is deprecated' -e 'BuildKit is currently disabled' \
            -e 'environment-variable\.' -e '^$' >&2) >/dev/null
    after=$(docker image inspect --format '{{.Id}}' "$image")
    if [[ -n $before && $before != "$after" ]]; then docker rmi "$before" >/dev/null 2>&1 || true; fi
}
build "workbench-postgres:$tag" "$repo/docker-images/postgres"
build "workbench-redis:$tag" "$repo/docker-images/redis"
build "workbench:$tag" --build-arg "WHEELS=${wheels_key[platform]}" --file "$repo/Dockerfile" "$repo"
if ((egress)); then
    build "workbench-egress:$tag" --build-arg "PLATFORM=workbench:$tag" --build-arg "WHEELS=${wheels_key[egress]}" \
        --file "$repo/docker-images/egress/Dockerfile" "$repo"
fi
# The dependency stages (untagged; Docker's cache) of wheelhouses replaced since: about 250 MB each.
for name in "${!wheels_key[@]}"; do
    for stage in $(docker images --quiet --filter dangling=true --filter "label=workbench.stage=$name-dependencies"); do
        if [[ $(docker image inspect --format '{{index .Config.Labels "workbench.wheels"}}' "$stage") != "${wheels_key[$name]}" ]]; then
            docker rmi "$stage" >/dev/null 2>&1 || true
        fi
    done
done

size() { docker image inspect --format '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1 / 1e6}'; }
say "built workbench:$tag ($(size "workbench:$tag")), workbench-postgres:$tag ($(size "workbench-postgres:$tag")) and" \
    "workbench-redis:$tag ($(size "workbench-redis:$tag")), sharing workbench-base ($(size "$base_image")), in $(elapsed)"
