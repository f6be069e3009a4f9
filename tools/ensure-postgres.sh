#!/usr/bin/env bash
# The scheduler tests also run Airflow on PostgreSQL: Debian's server binaries (initdb,
# postgres, pg_isready). Install the postgresql package through apt when they are missing and
# we are root; otherwise say exactly what to install and stop. No server is started here: the
# tests start a throwaway one on loopback and stop it.
set -euo pipefail
if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "PostgreSQL's server binaries not found: installing postgresql with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && exit 0
fi
echo "the scheduler tests need PostgreSQL's server (sudo apt-get install postgresql)." >&2
exit 1
