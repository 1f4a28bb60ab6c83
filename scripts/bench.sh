#!/usr/bin/env bash
# `make bench`: every benchmark in one go, then bench/README.md from their saved results.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --with-postgres
[ "$(id -u)" -eq 0 ] && scripts/start-dockerd.sh && scripts/build-image.sh
status=0
for bench in log sandboxes harness; do
  if [ -f "bench/$bench.py" ]; then
    echo "== bench/$bench.py"
    .venv/bin/python -m "bench.$bench" "$@" || status=$?
  fi
done
.venv/bin/python bench/report.py
exit $status
