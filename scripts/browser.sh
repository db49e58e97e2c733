#!/usr/bin/env bash
# Makes sure a headless Chromium is at /usr/bin/chromium for the dashboard's browser tests
# (test/browser/, driven by playwright-core). Idempotent; installs Debian's `chromium` with
# apt-get the same way scripts/services.sh installs the servers (root on Debian only).
# AX_SKIP_BROWSER=1 skips it (the browser tests then fail, saying Chromium is missing).
set -euo pipefail
log() { echo "[browser] $*"; }
BIN=${AX_CHROMIUM:-/usr/bin/chromium}
if [ "${AX_SKIP_BROWSER:-0}" = 1 ]; then log "skipped (AX_SKIP_BROWSER=1)"; exit 0; fi
if [ -x "$BIN" ]; then log "chromium: already installed ($("$BIN" --version 2>/dev/null || echo "$BIN"))"; exit 0; fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null; then
  log "ERROR: $BIN missing and I cannot install it (need root on Debian): apt-get install -y chromium"; exit 1
fi
log "apt-get update"; DEBIAN_FRONTEND=noninteractive apt-get update -qq
log "installing chromium"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
log "chromium: $("$BIN" --version 2>/dev/null || echo installed)"
