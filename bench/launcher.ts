import { readFileSync } from "node:fs";

/**
 * The node flags `ax` runs with: those of bin/ax.mjs's launcher line (`#!/usr/bin/env -S node
 * FLAGS`). The benchmark's node takes them from there, so it runs as `ax node` does.
 */
export function launcherFlags(path = new URL("../bin/ax.mjs", import.meta.url)): string[] {
  const first = readFileSync(path, "utf8").split("\n", 1)[0]!;
  const m = /^#!\/usr\/bin\/env(?: -S)? node(.*)$/.exec(first);
  if (!m) throw new Error(`bin/ax.mjs: the launcher line is not "#!/usr/bin/env -S node [flags]": ${first}`);
  return m[1]!.split(" ").filter(Boolean);
}
