#!/usr/bin/env bash
# Spark needs Java 17. Install it through apt when it is missing and we are root;
# otherwise say exactly what to install and stop.
set -euo pipefail
if java -version 2>&1 | grep -qE 'version "17\.'; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "Java 17 not found: installing openjdk-17-jre-headless with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq openjdk-17-jre-headless >/dev/null
    java -version 2>&1 | grep -qE 'version "17\.' && exit 0
fi
echo "modeswitch needs Java 17 for Spark: install openjdk-17-jre-headless" \
     "(Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless) and put its java first on PATH." >&2
exit 1
