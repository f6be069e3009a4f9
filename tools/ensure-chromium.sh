#!/usr/bin/env bash
# The browser tier drives Debian's chromium (headless) through its chromedriver. Install both
# through apt when missing and we are root; otherwise say exactly what to install and stop.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "chromium or chromedriver not found: installing chromium chromium-driver with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium chromium-driver >/dev/null
    command -v chromium >/dev/null && command -v chromedriver >/dev/null && exit 0
fi
echo "the browser tests need Debian's chromium and chromium-driver" \
     "(sudo apt-get install chromium chromium-driver)." >&2
exit 1
