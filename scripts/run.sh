#!/usr/bin/env bash
# `make run`: the whole system on this machine — PostgreSQL and Redis, the offline model (unless
# ANTHROPIC_API_KEY is set), Daphne (web, /v1, WebSockets), a Celery worker, beat and the egress proxy — at
# http://127.0.0.1:$PORT, run from the Procfile by workbench/supervise.py, which restarts a process that dies.
# Installs what is missing first. Ctrl-C stops every process; sandbox containers stay for their sessions, and
# the output names them.
#
# Data (the PostgreSQL cluster, the signing key, beat's schedule) lives in $WORKBENCH_DATA_DIR (default .cache).
# DATABASE_URL (SQLite too, for a quick look: without the log's append-only trigger) uses that database instead
# of the cluster; REDIS_URL, a Redis that answers there instead of starting one. Ports: PORT (8000), REDIS_PORT
# (6379), POSTGRES_PORT (54329), OFFLINE_MODEL_PORT (8765), EGRESS_CONTROL_PORT (8766), EGRESS_HARNESS_PORT
# (3129), and the sandboxes' EGRESS_PORT (3128, on their network's bridge).
set -euo pipefail
# Braces: bash reads the whole file before running any of it, so an edit while `make run` runs (a git pull)
# cannot change what it does when it stops.
{
cd "$(dirname "$0")/.."

scripts/bootstrap.sh
scripts/egress-venv.sh
export WORKBENCH_DATA_DIR=${WORKBENCH_DATA_DIR:-.cache}
mkdir -p "$WORKBENCH_DATA_DIR"
token() { python3 -c 'import secrets; print(secrets.token_urlsafe(24))'; }

# The key that signs logins: the web server, workers and beat refuse the public default outside development
# (workbench/secret_key.py). Made once and kept in the data folder, so logins outlive a restart; a SECRET_KEY
# in the environment or in .env is used instead.
if [ -n "${SECRET_KEY:-}" ] || grep -Eqs '^[[:space:]]*(export[[:space:]]+)?SECRET_KEY[[:space:]]*=' .env; then
  key_note="SECRET_KEY from the environment or .env"
else
  if [ ! -s "$WORKBENCH_DATA_DIR/secret-key" ]; then
    (umask 077 && python3 -c 'import secrets; print(secrets.token_urlsafe(50))' >"$WORKBENCH_DATA_DIR/secret-key")
  fi
  SECRET_KEY=$(cat "$WORKBENCH_DATA_DIR/secret-key")
  export SECRET_KEY
  key_note="$WORKBENCH_DATA_DIR/secret-key (made once here; set SECRET_KEY to use your own)"
fi

processes=(web worker beat)
first=()

# The database: a PostgreSQL cluster of this data folder's own (made once), on a loopback port with a password
# and on a socket in its folder, run by the supervisor like the rest (a killed server is restarted).
if [ -z "${DATABASE_URL:-}" ]; then
  export POSTGRES_PORT=${POSTGRES_PORT:-54329}
  POSTGRES_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -x "$POSTGRES_BIN/postgres" ] || {
    echo "run: PostgreSQL is not installed (apt-get install postgresql); or set DATABASE_URL" >&2
    exit 1
  }
  export POSTGRES_BIN
  POSTGRES_DIR=$(realpath "$WORKBENCH_DATA_DIR")/postgres
  POSTGRES_AS=
  if [ "$(id -u)" -eq 0 ]; then
    # The server refuses to run as root: it runs as the postgres user, who may not reach a folder under a
    # private one (a checkout in /root): its files go under /var/lib/workbench then.
    POSTGRES_AS="setpriv --reuid=postgres --regid=postgres --init-groups --"
    if ! $POSTGRES_AS test -x "$(dirname "$POSTGRES_DIR")"; then
      POSTGRES_DIR=/var/lib/workbench/postgres-$(realpath "$WORKBENCH_DATA_DIR" | sha1sum | cut -c1-12)
    fi
  fi
  export POSTGRES_DIR POSTGRES_AS
  password_file=$WORKBENCH_DATA_DIR/postgres-password
  make_cluster() { # as the server's user; the password goes in through the server's single-user mode
    $POSTGRES_AS "$POSTGRES_BIN/initdb" -D "$POSTGRES_DIR" -U postgres -E UTF8 --no-locale \
      --auth-local=trust --auth-host=scram-sha-256 &&
      printf "ALTER ROLE postgres PASSWORD '%s';\nCREATE DATABASE workbench;\n" "$1" |
      $POSTGRES_AS "$POSTGRES_BIN/postgres" --single -c exit_on_error=on -D "$POSTGRES_DIR" template1
  }
  if [ ! -s "$POSTGRES_DIR/PG_VERSION" ]; then
    if [ -n "$(ls -A "$POSTGRES_DIR" 2>/dev/null)" ]; then
      echo "run: $POSTGRES_DIR is not empty and holds no PostgreSQL cluster: move it away, or set DATABASE_URL" >&2
      exit 1
    fi
    echo "run: making the PostgreSQL cluster in $POSTGRES_DIR"
    mkdir -p "$POSTGRES_DIR"
    chmod 700 "$POSTGRES_DIR"
    [ -z "$POSTGRES_AS" ] || chown postgres: "$POSTGRES_DIR"
    password=$(token)
    if ! make_cluster "$password" >"$WORKBENCH_DATA_DIR/initdb.log" 2>&1; then
      cat "$WORKBENCH_DATA_DIR/initdb.log" >&2
      rm -rf "$POSTGRES_DIR"
      exit 1
    fi
    (umask 077 && echo "$password" >"$password_file")
  elif [ ! -s "$password_file" ]; then
    echo "run: $password_file, the password of the cluster in $POSTGRES_DIR, is missing:" \
      "remove that folder to make a new cluster (its data is lost), or set DATABASE_URL" >&2
    exit 1
  fi
  export DATABASE_URL=postgres://postgres:$(cat "$password_file")@127.0.0.1:$POSTGRES_PORT/workbench
  processes=(postgres "${processes[@]}")
  first+=(--first postgres)
  database_note="PostgreSQL at 127.0.0.1:$POSTGRES_PORT, its files in $POSTGRES_DIR (set DATABASE_URL to use another)"
elif [[ $DATABASE_URL == sqlite* ]]; then
  database_note="$DATABASE_URL (DATABASE_URL): for a quick look only, without the log's append-only trigger"
else
  database_note="$(sed -E 's#//[^/@]*@#//#' <<<"$DATABASE_URL") (DATABASE_URL)"
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

# The egress proxy: the only process given the vault's private key (the Procfile passes it to it alone), and
# the docker sandboxes' only way out, on their network's bridge (made here first).
export VAULT_KEY_FILE_FOR_EGRESS=${VAULT_KEY_FILE_FOR_EGRESS:-.vault/keyring.json}
export EGRESS_CONTROL_URL=${EGRESS_CONTROL_URL:-http://127.0.0.1:${EGRESS_CONTROL_PORT:-8766}}
export EGRESS_CONTROL_TOKEN=${EGRESS_CONTROL_TOKEN:-$(token)}
if .venv/bin/python -m vault.egress network; then
  export SANDBOX_EGRESS=${SANDBOX_EGRESS:-true}
  processes+=(egress)
  # The proxy's door for the workers (MCP calls, repository clones), on loopback: they speak for a session
  # with EGRESS_HARNESS_TOKEN, and the proxy adds the session's credentials.
  export EGRESS_HARNESS_LISTEN=${EGRESS_HARNESS_LISTEN:-127.0.0.1:${EGRESS_HARNESS_PORT:-3129}}
  export EGRESS_HARNESS_URL=${EGRESS_HARNESS_URL:-http://$EGRESS_HARNESS_LISTEN}
  export EGRESS_HARNESS_TOKEN=${EGRESS_HARNESS_TOKEN:-$(token)}
  export EGRESS_CA_FILE=${EGRESS_CA_FILE:-${EGRESS_DATA_DIR:-.egress}/sandbox-ca-bundle.crt}
else
  echo "run: no sandbox network (no Docker engine, or no iptables): sandboxes run without network" >&2
  export SANDBOX_EGRESS=false
fi
if ! redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1; then
  processes=(redis "${processes[@]}")
  first+=(--first redis)
fi
if [ -z "${ANTHROPIC_API_KEY:-}" ]; then
  export ANTHROPIC_BASE_URL=http://127.0.0.1:$OFFLINE_MODEL_PORT
  processes=(model "${processes[@]}")
  model_note="the offline model at $ANTHROPIC_BASE_URL (set ANTHROPIC_API_KEY to use Claude)"
else
  model_note="Claude (ANTHROPIC_API_KEY is set)"
fi

url="http://127.0.0.1:$WORKBENCH_PORT/"
cat <<MSG

  Workbench is starting at $url
  Model: $model_note
  Database: $database_note
  Secret key: $key_note
  API keys: .venv/bin/python manage.py createapikey --name NAME
  Stop with Ctrl-C (sandbox containers stay for their sessions; the output names them).

MSG

# The database and Redis first; then workbench/startup.py waits for the database, migrates it, says how to log in
# and reaps what an earlier run left; then the rest. After a stop, the sandboxes left are named.
startup=$(printf '%q ' .venv/bin/python -m workbench.startup --url "$url" --vault-key-file "$VAULT_KEY_FILE_FOR_EGRESS")
status=0
.venv/bin/python -m workbench.supervise "${first[@]}" --then "${startup% }" "${processes[@]}" || status=$?
.venv/bin/python -m sandboxes.leftovers || true
exit "$status"
}
