#!/usr/bin/env bash
# Quick start: installs and builds what is missing, then runs a local cluster node, a demo executor and
# example tasks in the foreground (Ctrl-C stops everything).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prepare.sh
# The V8 flag of bin/ax.mjs's launcher line (the node's young generation, see there).
exec node --max-semi-space-size=64 dist/ops/demo.js "$@"
