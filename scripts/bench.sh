#!/usr/bin/env bash
# `make bench`: every benchmark in bench/ in one go, then bench/README.md from their saved results.
#
# Usage: scripts/bench.sh [--quick]        (or `make bench QUICK=1`: a smoke run of each, minutes not an hour)
#
# Runs each bench/<name>.py that has a main (the known ones first, in this order: log, harness, sandboxes,
# work queue, ui, ttft, api; then any other) as `.venv/bin/python -m bench.<name>`, passing --quick through. A
# benchmark that fails does not stop the others; the script then exits non-zero at the end. Each benchmark
# starts and removes its own PostgreSQL, Redis, workers and offline model; Docker must answer (started here
# when we are root).
set -uo pipefail
cd "$(dirname "$0")/.."

args=("$@")
if [ -n "${QUICK:-}" ] && [[ " ${args[*]} " != *" --quick "* ]]; then
  args+=(--quick)
fi

scripts/bootstrap.sh --with-postgres || exit 1
# The servers a benchmark starts refuse the public development key outside the test suite: one for this run.
export SECRET_KEY="${SECRET_KEY:-$(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')}"
if [ "$(id -u)" -eq 0 ]; then
  scripts/start-dockerd.sh && scripts/build-image.sh || echo "bench: no Docker engine or sandbox image" >&2
fi

known=(log harness chaos sandboxes workqueue work_queue ui ttft api egress)
benches=()
for name in "${known[@]}"; do
  [ -f "bench/$name.py" ] && benches+=("$name")
done
for file in bench/*.py; do
  name=$(basename "$file" .py)
  case " report __init__ ${benches[*]} " in *" $name "*) continue ;; esac
  grep -q '__name__ == "__main__"' "$file" && benches+=("$name")
done

failed=()
started=$SECONDS
for name in "${benches[@]}"; do
  echo "== bench/$name.py ${args[*]}"
  began=$SECONDS
  .venv/bin/python -m "bench.$name" "${args[@]}"
  status=$?
  if [ "$status" -eq 0 ]; then
    echo "== bench/$name.py done in $((SECONDS - began)) s"
  else
    echo "== bench/$name.py FAILED (exit $status) after $((SECONDS - began)) s; going on with the others" >&2
    failed+=("$name")
  fi
done

echo "== bench/report.py"
.venv/bin/python bench/report.py "${args[@]}" || failed+=(report)
echo "== ${#benches[@]} benchmarks in $((SECONDS - started)) s: bench/README.md"
if ((${#failed[@]})); then
  echo "bench: failed: ${failed[*]}" >&2
  exit 1
fi
