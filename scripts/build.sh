#!/usr/bin/env bash
# npm run build: compiles the sources to dist/ with tsc (tsconfig.build.json). dist/ is
# emptied first so a deleted source leaves no module behind. dist/.built carries the time the
# build STARTED: bin/ax.mjs runs dist/ only while no source is newer than that, so an edit made
# during the build still counts as unbuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf dist
mkdir -p dist
touch dist/.built.start
npx tsc -p tsconfig.build.json
mv dist/.built.start dist/.built
