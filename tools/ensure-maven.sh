#!/usr/bin/env bash
# `make install` fetches jvm/pom.xml's jars with Maven (mvn, through the machine's own Maven
# settings). Install Debian's maven through apt when missing and we are root; otherwise say
# exactly what to install and stop.
set -euo pipefail
if command -v mvn >/dev/null; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "mvn not found: installing maven with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq maven >/dev/null
    command -v mvn >/dev/null && exit 0
fi
echo "modeswitch needs Maven (mvn) to fetch jvm/pom.xml's jars (sudo apt-get install maven)." >&2
exit 1
