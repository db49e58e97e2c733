#!/usr/bin/env bash
# Quick start: installs and builds what is missing, then runs a local cluster node, a demo executor and
# example tasks in the foreground (Ctrl-C stops everything).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prepare.sh
exec node dist/ops/demo.js "$@"
