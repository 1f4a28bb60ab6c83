#!/usr/bin/env bash
# `make test`: install what is missing, start private PostgreSQL and Redis (and the Docker engine), lint,
# then run the whole suite on PostgreSQL and the log's tests again on SQLite. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh --with-browser
scripts/egress-venv.sh

tmp=$(mktemp -d /tmp/workbench-test.XXXXXX)
chmod 755 "$tmp"
eval "$(scripts/test-services.sh "$tmp/services")"
cleanup() { stop-test-services; rm -rf "$tmp"; }
trap cleanup EXIT

if [ -x scripts/start-dockerd.sh ]; then scripts/start-dockerd.sh; fi
if [ -x scripts/build-image.sh ]; then scripts/build-image.sh; fi

echo "== lint: ruff, the format, the layers (import-linter), types (mypy)"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
.venv/bin/mypy kernel sessions sandboxes harness vault workbench offline_model

export CONN_MAX_AGE=0
status=0
echo "== the whole suite on PostgreSQL ($DATABASE_URL)"
.venv/bin/pytest "$@" || status=$?

echo "== the session log's tests on SQLite"
DATABASE_URL="sqlite:///$tmp/workbench.sqlite3" .venv/bin/pytest tests/sessions tests/api \
  tests/harness/test_unstorable_text.py -m "not postgres" "$@" \
  || status=$?

exit $status
