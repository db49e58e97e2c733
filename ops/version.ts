import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * The package's version from its package.json. The file sits one folder up from the sources
 * (ops/) and two from the build (dist/ops/), so look upwards for the package that ships the
 * `ax` command rather than hard-coding either depth.
 */
export function packageVersion(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 4; i++) {
    dir = dirname(dir);
    try {
      const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as { version?: string; bin?: Record<string, string> };
      if (pkg.bin?.ax && pkg.version) return pkg.version;
    } catch { /* not here: keep looking */ }
  }
  return "unknown";
}
