#!/usr/bin/env -S node --max-semi-space-size=64
// The launcher line's V8 flag is part of how ax runs (every other launcher repeats it: the
// Dockerfile, deploy/systemd, scripts/demo.sh, the benchmark's node; test/unit/deploy.test.ts, "launchers"
// keeps them equal). A node allocates ~20 KB a run, short-lived; in the default 16 MB semi-space
// the scavenges promote much of it and the old generation collects it again. 64 MB: the node's
// GC time −37 % and its CPU a run −8 % at 8,200 runs/s (bench/analysis.md, fourteenth round).
// It is a ceiling: V8 grows the young generation only while allocation keeps it full.
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
