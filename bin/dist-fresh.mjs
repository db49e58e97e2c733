// Whether dist/ (npm run build) can run instead of the TypeScript sources: used by bin/ax.mjs
// and by the benchmarks, which measure the compiled node as users run it.
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

/**
 * Why dist/ cannot be used in this checkout, or null when it can (~1 ms of stat calls). An
 * installed package has no sources next to it, so it always runs dist/.
 */
export function staleReason() {
  if (!existsSync(new URL("ops/cli.ts", root))) return null;
  let built;
  try { built = statSync(new URL("dist/.built", root)).mtimeMs; } catch { return "dist/ is not built"; }
  return newestSourceMs() > built ? "dist/ is older than the sources" : null;
}
