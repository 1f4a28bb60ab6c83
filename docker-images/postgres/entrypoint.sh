#!/bin/sh
# PostgreSQL for the compose stack: on first start (an empty data folder) make the cluster, with
# POSTGRES_USER as its superuser (password POSTGRES_PASSWORD, scram-sha-256 from any address of the
# compose network) and the database POSTGRES_DB; then run the server in the foreground.
set -eu

data=${PGDATA:-/var/lib/postgresql/data}
user=${POSTGRES_USER:-workbench}
database=${POSTGRES_DB:-workbench}
if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "workbench-postgres: set POSTGRES_PASSWORD (the password of $user)" >&2
    exit 1
fi

if [ ! -s "$data/PG_VERSION" ]; then
    echo "workbench-postgres: making the cluster in $data (user $user, database $database)"
    password_file=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$password_file"
    initdb --pgdata="$data" --username="$user" --pwfile="$password_file" --auth=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$password_file"
    echo "host all all all scram-sha-256" >>"$data/pg_hba.conf"
    if [ "$database" != postgres ]; then
        echo "CREATE DATABASE \"$database\" OWNER \"$user\"" | postgres --single -D "$data" -j postgres >/dev/null
    fi
fi

# jit off: the image leaves out LLVM (a tenth of its size), which only JIT compilation would load.
exec postgres -D "$data" -c listen_addresses='*' -c jit=off "$@"
