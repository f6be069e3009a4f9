#!/usr/bin/env bash
# modeswitch-postgres's entrypoint: make the cluster in $PGDATA on the first start, then run
# the server in the foreground (as PID 1: the postmaster reaps its own children).
#
# First start (no $PGDATA/PG_VERSION): initdb with $POSTGRES_USER as the superuser and
# $POSTGRES_PASSWORD as its password (scram-sha-256), then $POSTGRES_DB owned by it, on a
# server that listens on no TCP port while it is made. Authentication afterwards:
#   local (the socket, from inside the container): peer, the OS user postgres as $POSTGRES_USER
#   host  (TCP, from $POSTGRES_HOST_AUTH_ADDRESS, samenet by default): scram-sha-256
# listen_addresses = '*'. The password is required at every start; on an existing cluster it is
# not applied again (ALTER ROLE changes it).
set -Eeuo pipefail

say() { echo "postgres-entrypoint: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" != 0 ] || die "refusing to run as root: run as the image's user postgres (uid 999)"

# Any other command (a shell, psql, pg_isready) runs as it is.
if [ "${1:-postgres}" != postgres ]; then
    exec "$@"
fi
[ $# -gt 0 ] && shift

if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    [ -z "${POSTGRES_PASSWORD:-}" ] || die "set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE, not both"
    [ -r "$POSTGRES_PASSWORD_FILE" ] || die "POSTGRES_PASSWORD_FILE=$POSTGRES_PASSWORD_FILE cannot be read"
    POSTGRES_PASSWORD="$(<"$POSTGRES_PASSWORD_FILE")"
fi
[ -n "${POSTGRES_PASSWORD:-}" ] || die "POSTGRES_PASSWORD is not set: refusing to start (there is no default; set it, e.g. in .env, or POSTGRES_PASSWORD_FILE)"

PGDATA="${PGDATA:-/var/lib/postgresql/data}"
USER_NAME="${POSTGRES_USER:-postgres}"
DB_NAME="${POSTGRES_DB:-$USER_NAME}"
HBA_ADDRESS="${POSTGRES_HOST_AUTH_ADDRESS:-samenet}"
export PGDATA

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    [ -w "$PGDATA" ] || die "$PGDATA is not writable by uid $(id -u) (a bound folder must belong to uid 999)"
    if [ -n "$(ls -A "$PGDATA" 2>/dev/null)" ]; then
        die "$PGDATA holds files but no cluster (no PG_VERSION): refusing to initdb over them"
    fi
    chmod 700 "$PGDATA" 2>/dev/null || true
    say "first start: initdb in $PGDATA (superuser $USER_NAME, database $DB_NAME)"
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    umask 077
    printf '%s\n' "$POSTGRES_PASSWORD" >"$scratch/pw"
    # The socket trusted only while the cluster is made (no TCP listener then); the final
    # pg_hba.conf below replaces it.
    initdb --pgdata="$PGDATA" --username="$USER_NAME" --pwfile="$scratch/pw" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >&2
    rm -f "$scratch/pw"
    umask 022
    {
        echo "listen_addresses = '*'"
        echo "password_encryption = 'scram-sha-256'"
    } >>"$PGDATA/postgresql.conf"

    pg_ctl --pgdata="$PGDATA" --wait --silent \
        -o "-c listen_addresses='' -c unix_socket_directories='$scratch'" start
    if [ "$DB_NAME" != postgres ]; then
        psql --no-psqlrc --quiet --set ON_ERROR_STOP=1 --host="$scratch" --username="$USER_NAME" \
            --dbname=postgres --set db="$DB_NAME" --set owner="$USER_NAME" <<'SQL'
CREATE DATABASE :"db" OWNER :"owner";
SQL
    fi
    pg_ctl --pgdata="$PGDATA" --wait --silent --mode=fast stop

    cat >"$PGDATA/pg_hba.conf" <<EOF
# Written by postgres-entrypoint on the first start.
# TYPE  DATABASE  USER  ADDRESS          METHOD
local   all       all                    peer map=container
host    all       all   $HBA_ADDRESS     scram-sha-256
EOF
    cat >"$PGDATA/pg_ident.conf" <<EOF
# The container's OS user postgres is the superuser on the socket (docker exec ... psql).
# MAPNAME   SYSTEM-USERNAME  PG-USERNAME
container   postgres         "$USER_NAME"
EOF
    rm -rf "$scratch"
    trap - EXIT
    say "initdb done"
fi

exec postgres -D "$PGDATA" "$@"
