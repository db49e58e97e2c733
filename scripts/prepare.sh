#!/usr/bin/env bash
# Everything a fresh clone needs before running: dependencies, the build (when dist/ is missing
# or older than the sources), then the three servers and the headless Chromium of the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x node_modules/.bin/vitest ] || [ ! -x node_modules/.bin/tsx ] || [ ! -x node_modules/.bin/tsc ]; then
  echo "[prepare] installing npm dependencies"
  if [ -f package-lock.json ]; then npm ci --no-audit --no-fund; else npm install --no-audit --no-fund; fi
fi
if [ ! -f dist/.built ] || [ -n "$(find common cluster actors protocol ops -name '*.ts' -newer dist/.built -print -quit)" ]; then
  echo "[prepare] building dist/ (npm run build)"
  npm run --silent build
fi
bash scripts/services.sh
bash scripts/browser.sh
