#!/usr/bin/env bash
# Installs Debian's headless Chromium for the dashboard's browser tests, if it is missing.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  /usr/bin/chromium --version || true
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
/usr/bin/chromium --version
