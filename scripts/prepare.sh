#!/usr/bin/env bash
# Everything a fresh clone needs before running: dependencies, then the three servers.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x node_modules/.bin/vitest ] || [ ! -x node_modules/.bin/tsx ]; then
  echo "[prepare] installing npm dependencies"
  if [ -f package-lock.json ]; then npm ci --no-audit --no-fund; else npm install --no-audit --no-fund; fi
fi
bash scripts/services.sh
