#!/usr/bin/env bash
# Installs what Workbench needs on a Debian 12 machine, skipping what is already there:
# Debian packages (when root) and the virtualenv in .venv with the project and its dev tools.
# Usage: scripts/bootstrap.sh [--with-browser]
set -euo pipefail
cd "$(dirname "$0")/.."

want=(postgresql redis-server docker.io mmdebstrap bubblewrap git)
for arg in "$@"; do
  case "$arg" in
    --with-browser) want+=(chromium fonts-dejavu-core) ;;
  esac
done

missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: please install these Debian packages (as root): ${missing[*]}" >&2
    exit 1
  fi
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

stamp=.venv/.installed
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating the virtualenv in .venv"
  python3 -m venv .venv
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing Python packages into .venv"
  .venv/bin/pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
  touch "$stamp"
fi
