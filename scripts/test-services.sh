#!/usr/bin/env bash
# Starts a private PostgreSQL cluster and Redis on free loopback ports under $1 (a temporary folder),
# and prints the environment to use them (DATABASE_URL, REDIS_URL). Stop them with `stop-test-services`.
# Usage: eval "$(scripts/test-services.sh DIR)"
set -euo pipefail
dir=$1
mkdir -p "$dir"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -x "$pgbin/initdb" ] || { echo "test-services: PostgreSQL server binaries not found (apt-get install postgresql)" >&2; exit 1; }
runas=()
if [ "$(id -u)" -eq 0 ]; then
  chown postgres "$dir" 2>/dev/null || true
  runas=(runuser -u postgres --)
fi
pg_port=$(free_port)
"${runas[@]}" "$pgbin/initdb" -D "$dir/pg" -U postgres -A trust --no-sync >"$dir/initdb.log" 2>&1 \
  || { cat "$dir/initdb.log" >&2; exit 1; }
"${runas[@]}" "$pgbin/pg_ctl" -D "$dir/pg" -l "$dir/pg.log" -w -t 60 start \
  -o "-p $pg_port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
  >/dev/null || { cat "$dir/pg.log" >&2; exit 1; }

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --dir "$dir"
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done

cat <<ENV
export DATABASE_URL=postgres://postgres@127.0.0.1:$pg_port/workbench
export REDIS_URL=redis://127.0.0.1:$redis_port/0
export WORKBENCH_TEST_SERVICES_DIR=$dir
stop-test-services() {
  ${runas[*]} $pgbin/pg_ctl -D $dir/pg -m immediate stop >/dev/null 2>&1 || true
  kill \$(cat $dir/redis.pid 2>/dev/null) 2>/dev/null || true
}
ENV
