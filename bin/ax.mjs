#!/usr/bin/env node
// Runs the compiled CLI (dist/, made by `npm run build`). In a source checkout whose dist/ is
// missing or older than its TypeScript sources, runs the sources through tsx (a dev
// dependency) instead: a fresh clone works before its first build and never runs stale code.
// An installed package has no sources next to it, so it always runs dist/.
import { existsSync, readdirSync, statSync } from "node:fs";

const root = new URL("../", import.meta.url);
const SOURCE_DIRS = ["common", "cluster", "actors", "protocol", "ops"];

function newestSourceMs() {
  let newest = 0;
  for (const dir of SOURCE_DIRS) {
    for (const f of readdirSync(new URL(dir, root), { recursive: true })) {
      if (f.endsWith(".ts")) newest = Math.max(newest, statSync(new URL(`${dir}/${f}`, root)).mtimeMs);
    }
  }
  return newest;
}

/** Why dist/ cannot be used in this checkout, or null when it can (~1 ms of stat calls). */
function staleReason() {
  if (!existsSync(new URL("ops/cli.ts", root))) return null;
  let built;
  try { built = statSync(new URL("dist/.built", root)).mtimeMs; } catch { return "dist/ is not built"; }
  return newestSourceMs() > built ? "dist/ is older than the sources" : null;
}

const reason = staleReason();
if (reason === null) {
  await import("../dist/ops/cli.js");
} else {
  let tsx;
  try { tsx = await import("tsx/esm/api"); } catch {
    process.stderr.write(`ax: ${reason} and tsx is not installed; run: npm run build\n`);
    process.exit(1);
  }
  // Only a person at a terminal needs the hint; scripts and tests read stderr for errors.
  if (process.stderr.isTTY) process.stderr.write(`ax: ${reason}; running the TypeScript sources through tsx (npm run build for the compiled CLI)\n`);
  tsx.register();
  await import("../ops/cli.ts");
}
