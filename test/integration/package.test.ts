import { execFile, spawn, type ChildProcess } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TestCluster } from "../cluster.ts";
import { waitFor } from "../helpers.ts";

/**
 * The package as another project gets it: `npm pack` output installed into a copy of
 * examples/executor (production dependencies only: no tsx, no TypeScript sources), the example
 * type-checked and compiled against the tarball's declarations, then a node started from the
 * tarball's `ax` and a task run through the example's executor.
 */
const ROOT = process.cwd();
const TSC = join(ROOT, "node_modules/typescript/bin/tsc");
const SOURCE_DIRS = ["common", "cluster", "actors", "protocol", "ops"];
const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { name: string; version: string };

function run(cmd: string, args: string[], cwd: string): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { cwd, env: { ...process.env, npm_config_update_notifier: "false" }, maxBuffer: 16 << 20, timeout: 150_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${cmd} ${args.join(" ")} failed in ${cwd}: ${err.message}\n${stdout}\n${stderr}`));
      else resolve(stdout);
    });
  });
}

/** dist/ as `npm run build` left it, if no source is newer (the same rule as bin/ax.mjs). */
function freshDist(): boolean {
  if (!existsSync(join(ROOT, "dist/.built"))) return false;
  const built = statSync(join(ROOT, "dist/.built")).mtimeMs;
  return !SOURCE_DIRS.some((d) => newerThan(join(ROOT, d), built));
}
function newerThan(dir: string, ms: number): boolean {
  return readdirSync(dir, { recursive: true }).some((f) => String(f).endsWith(".ts") && statSync(join(dir, String(f))).mtimeMs > ms);
}
const tmp = mkdtempSync(join(tmpdir(), "ax-pkg-"));
const app = join(tmp, "app");
let packedFiles: string[] = [];
const children: ChildProcess[] = [];
const tc = new TestCluster("pkg");

beforeAll(async () => {
  // Stage the package: never rebuild the shared dist/ (other test files may be running it).
  const stage = join(tmp, "stage");
  mkdirSync(stage);
  cpSync(join(ROOT, "package.json"), join(stage, "package.json"));
  cpSync(join(ROOT, "bin"), join(stage, "bin"), { recursive: true });
  if (freshDist()) cpSync(join(ROOT, "dist"), join(stage, "dist"), { recursive: true });
  else await run(process.execPath, [TSC, "-p", join(ROOT, "tsconfig.build.json"), "--outDir", join(stage, "dist")], ROOT);
  const packed = JSON.parse(await run("npm", ["pack", "--ignore-scripts", "--json", "--pack-destination", tmp], stage)) as Array<{ filename: string; files: Array<{ path: string }> }>;
  packedFiles = packed[0]!.files.map((f) => f.path);
  const tarball = join(tmp, packed[0]!.filename);

  // The example project, depending on the tarball; its dev tools come from this repository.
  cpSync(join(ROOT, "examples/executor"), app, { recursive: true });
  const appPkg = JSON.parse(readFileSync(join(app, "package.json"), "utf8")) as Record<string, unknown>;
  appPkg.dependencies = { [pkg.name]: `file:${tarball}` };
  delete appPkg.devDependencies;
  writeFileSync(join(app, "package.json"), JSON.stringify(appPkg, null, 2));
  await run("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", "--ignore-scripts"], app);
  await run(process.execPath, [TSC, "-p", ".", "--typeRoots", join(ROOT, "node_modules/@types")], app);
}, 240_000);

afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  await tc.teardown();
  rmSync(tmp, { recursive: true, force: true });
});

function start(args: string[], cwd: string): { proc: ChildProcess; out: () => string } {
  const proc = spawn(process.execPath, args, { cwd, env: { ...process.env, ...tc.env }, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  proc.stdout!.on("data", (d) => (out += d));
  proc.stderr!.on("data", (d) => (out += d));
  children.push(proc);
  return { proc, out: () => out };
}

describe(`${pkg.name} from npm pack`, () => {
  it("ships compiled JavaScript with declarations and no TypeScript sources", () => {
    expect(packedFiles).toContain("dist/ops/cli.js");
    expect(packedFiles).toContain("dist/protocol/executor.d.ts");
    expect(packedFiles.filter((f) => f.endsWith(".ts") && !f.endsWith(".d.ts"))).toEqual([]);
    expect(packedFiles.every((f) => /^(bin|dist)\/|^package\.json$|^README\.md$/.test(f))).toBe(true);
  });

  it("installs without dev dependencies and its ax prints the package version", async () => {
    expect(existsSync(join(app, "node_modules/tsx"))).toBe(false);
    expect(existsSync(join(app, "node_modules/typescript"))).toBe(false);
    expect(existsSync(join(app, "build/worker.js"))).toBe(true);
    expect((await run(process.execPath, ["node_modules/.bin/ax", "--version"], app)).trim()).toBe(pkg.version);
  });

  it("runs a task through the example's executor against a node started from the tarball", async () => {
    const node = start(["node_modules/.bin/ax", "node", "--id", "pkg1"], app);
    await waitFor(() => /ax node pkg1 running/.test(node.out()), 30_000, `the node to start; output: ${node.out()}`);
    const worker = start(["build/worker.js"], app);
    const ran = await waitFor(() => /ran greet (\S+) attempt 1: hello from the tarball/.exec(worker.out()), 30_000, "the example's run");
    // The create's reply and the run race (the run is due 200 ms after the create): wait for both lines.
    await waitFor(() => /created task greet \(id \d+\)/.test(worker.out()), 15_000, `the create's reply; output: ${worker.out()}`);
    const client = await tc.client();
    const runs = await waitFor(async () => {
      const r = await client.call<Array<{ id: string; state: string; executor: string }>>("runs", { task: "greet" });
      return r.some((x) => x.state === "success") ? r : null;
    }, 15_000, "the run recorded as a success");
    expect(runs.find((x) => x.id === ran[1])).toMatchObject({ state: "success", executor: "greeter" });
  });
});
