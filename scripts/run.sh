#!/usr/bin/env bash
# `make run`: the whole system on this machine — Redis, the offline model (unless ANTHROPIC_API_KEY is
# set), Daphne (web, /v1, WebSockets), a Celery worker and beat — at http://127.0.0.1:$PORT.
# Installs what is missing first. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
scripts/egress-venv.sh
mkdir -p .cache

# The key that signs logins: the web server, workers and beat refuse the public default outside development
# (workbench/secret_key.py). Made once and kept in .cache/secret-key, so logins outlive a restart; a SECRET_KEY
# in the environment or in .env is used instead.
if [ -n "${SECRET_KEY:-}" ] || grep -Eqs '^[[:space:]]*(export[[:space:]]+)?SECRET_KEY[[:space:]]*=' .env; then
  key_note="SECRET_KEY from the environment or .env"
else
  if [ ! -s .cache/secret-key ]; then
    (umask 077 && python3 -c 'import secrets; print(secrets.token_urlsafe(50))' >.cache/secret-key)
  fi
  SECRET_KEY=$(cat .cache/secret-key)
  export SECRET_KEY
  key_note=".cache/secret-key (made once here; set SECRET_KEY to use your own)"
fi

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
# The egress proxy: the only process given the vault's private key (the Procfile passes it to it alone), and
# the docker sandboxes' only way out, on their network's bridge (made here first).
export VAULT_KEY_FILE_FOR_EGRESS=${VAULT_KEY_FILE_FOR_EGRESS:-.vault/keyring.json}
export EGRESS_CONTROL_URL=${EGRESS_CONTROL_URL:-http://127.0.0.1:${EGRESS_CONTROL_PORT:-8766}}
export EGRESS_CONTROL_TOKEN=${EGRESS_CONTROL_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')}
if .venv/bin/python -m vault.egress network; then
  export SANDBOX_EGRESS=${SANDBOX_EGRESS:-true}
  processes+=(egress)
  # The proxy's door for the workers (MCP calls, repository clones), on loopback: they speak for a session
  # with EGRESS_HARNESS_TOKEN, and the proxy adds the session's credentials.
  export EGRESS_HARNESS_LISTEN=${EGRESS_HARNESS_LISTEN:-127.0.0.1:${EGRESS_HARNESS_PORT:-3129}}
  export EGRESS_HARNESS_URL=${EGRESS_HARNESS_URL:-http://$EGRESS_HARNESS_LISTEN}
  export EGRESS_HARNESS_TOKEN=${EGRESS_HARNESS_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')}
  export EGRESS_CA_FILE=${EGRESS_CA_FILE:-${EGRESS_DATA_DIR:-.egress}/sandbox-ca-bundle.crt}
else
  echo "run: no sandbox network (no Docker engine, or no iptables): sandboxes run without network" >&2
  export SANDBOX_EGRESS=false
fi
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
.venv/bin/python manage.py vault_key init --key-file "$VAULT_KEY_FILE_FOR_EGRESS" >/dev/null
url="http://127.0.0.1:$WORKBENCH_PORT/"
login=$(.venv/bin/python manage.py ensureoperator --url "$url")
cat <<MSG

  Workbench is starting at $url
  $login
  Model: $model_note
  Secret key: $key_note
  API keys: .venv/bin/python manage.py createapikey --name NAME
  Stop with Ctrl-C.

MSG
exec .venv/bin/honcho start "${processes[@]}"
