#!/usr/bin/env bash
# `make run`: the whole system on this machine — Redis, the offline model (unless ANTHROPIC_API_KEY is
# set), Daphne (web, /v1, WebSockets), a Celery worker and beat — at http://127.0.0.1:$PORT.
# Installs what is missing first. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
mkdir -p .cache

# The sandbox image, and the root file system the local (bubblewrap) provider binds (made without Docker too).
if [ "$(id -u)" -eq 0 ] && [ -x scripts/build-image.sh ]; then
  scripts/build-image.sh || echo "run: the sandbox image or the local provider's root file system is missing" >&2
fi

export WORKBENCH_PORT=${PORT:-8000}
export WORKBENCH_HOST=${HOST:-127.0.0.1}
export REDIS_PORT=${REDIS_PORT:-6379}
export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:$REDIS_PORT/0}
export OFFLINE_MODEL_PORT=${OFFLINE_MODEL_PORT:-8765}
export WORKER_CONCURRENCY=${WORKER_CONCURRENCY:-4}

processes=(web worker beat)
if ! redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1; then
  processes=(redis "${processes[@]}")
fi
if [ -z "${ANTHROPIC_API_KEY:-}" ]; then
  export ANTHROPIC_BASE_URL=http://127.0.0.1:$OFFLINE_MODEL_PORT
  processes=(model "${processes[@]}")
  model_note="the offline model at $ANTHROPIC_BASE_URL (set ANTHROPIC_API_KEY to use Claude)"
else
  model_note="Claude (ANTHROPIC_API_KEY is set)"
fi

.venv/bin/python manage.py migrate --no-input -v 0
url="http://127.0.0.1:$WORKBENCH_PORT/"
login=$(.venv/bin/python manage.py ensureoperator --url "$url")
cat <<MSG

  Workbench is starting at $url
  $login
  Model: $model_note
  API keys: .venv/bin/python manage.py createapikey --name NAME
  Stop with Ctrl-C.

MSG
exec .venv/bin/honcho start "${processes[@]}"
