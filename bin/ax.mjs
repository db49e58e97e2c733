#!/usr/bin/env node
// Runs the compiled CLI (dist/, made by `npm run build`). In a source checkout whose dist/ is
// missing or older than its TypeScript sources, runs the sources through tsx (a dev
// dependency) instead: a fresh clone works before its first build and never runs stale code.
// An installed package has no sources next to it, so it always runs dist/.
import { staleReason } from "./dist-fresh.mjs";

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
