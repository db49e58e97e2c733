import { spawn, type ChildProcess } from "node:child_process";
import { afterAll, describe, expect, it } from "vitest";
import { TestCluster } from "../cluster.ts";
import { waitFor } from "../helpers.ts";
import { clearSecrets, loadConfig, redact } from "../../common/index.ts";
import { main } from "../../ops/cli.ts";

/**
 * Every secret carries the marker "XSECRETX": a passing test means no output of the CLI or
 * of a node (stdout, stderr, logs at debug, HTTP answers) contained any of them.
 */
const MARK = /XSECRETX/;
const S = { nats: "nats-XSECRETX-pw", pg: "pg-XSECRETX-pw", redis: "redis-XSECRETX-pw", token: "tok-XSECRETX-1", seed: "SUXSECRETXNOTAREALSEEDXSECRETXAAAAAAAAAAAAAAAAAAAAAAAAAAA" };

function withSecrets(): Record<string, string> {
  return {
    AX_NATS_URL: `nats://ax:${S.nats}@127.0.0.1:4222`,
    AX_PG_URL: `postgres://postgres:${S.pg}@127.0.0.1:5432/ax`,
    AX_REDIS_URL: `redis://default:${S.redis}@127.0.0.1:6379`,
  };
}

/** The CLI's main() in this process (a spawn costs seconds on a loaded machine), with `env` as the whole AX_ environment. */
async function inProcess(args: string[], env: Record<string, string>): Promise<{ code: number; out: string }> {
  const saved = { ...process.env };
  for (const k of Object.keys(process.env)) if (k.startsWith("AX_")) delete process.env[k];
  Object.assign(process.env, env);
  let out = "";
  const w1 = process.stdout.write.bind(process.stdout); const w2 = process.stderr.write.bind(process.stderr);
  process.stdout.write = ((c: string) => { out += c; return true; }) as typeof process.stdout.write;
  process.stderr.write = ((c: string) => { out += c; return true; }) as typeof process.stderr.write;
  try {
    const code = await main(args);
    return { code, out };
  } finally {
    process.stdout.write = w1; process.stderr.write = w2;
    for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
    Object.assign(process.env, saved);
  }
}

/** Stops a child and waits for it (at once if it already ended). */
async function stop(p: ChildProcess): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  const exited = new Promise((r) => p.once("exit", r));
  p.kill("SIGTERM");
  await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
  if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
}

function run(args: string[], env: Record<string, string>, opts: { timeoutMs?: number; until?: RegExp } = {}): Promise<{ code: number | null; out: string }> {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("AX_")));
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, ["bin/ax.mjs", ...args], { env: { ...base, ...env }, cwd: process.cwd() });
    let out = "";
    const onData = (d: Buffer) => { out += d; if (opts.until?.test(out)) p.kill("SIGTERM"); };
    p.stdout.on("data", onData); p.stderr.on("data", onData);
    const t = setTimeout(() => { p.kill("SIGKILL"); reject(new Error(`ax ${args.join(" ")} hung: ${out}`)); }, opts.timeoutMs ?? 60_000);
    p.on("exit", (code) => { clearTimeout(t); resolve({ code, out }); });
  });
}

const tc = new TestCluster("secrets");
afterAll(() => tc.teardown());

describe("no secret in any output", () => {
  it.each([
    ["AX_LEASE_TTL", { AX_LEASE_TTL: "6x" }], ["AX_NATS_URL", { AX_NATS_URL: `nats://ax:${S.nats}@127.0.0.1:notaport` }], ["AX_PG_URL", { AX_PG_URL: `mysql://root:${S.pg}@db/ax` }],
    ["AX_REDIS_URL", { AX_REDIS_URL: `http://:${S.redis}@127.0.0.1:6379` }], ["AX_NATS_TOKEN", { AX_NATS_TOKEN: S.token }], ["AX_NATS_NKEY", { AX_NATS_NKEY: S.seed }],
    ["AX_NATS_NKEY (file)", { AX_NATS_NKEY: "not-a-seed-XSECRETX" }],
    ["AX_NATS_PASSWORD without a user", { AX_NATS_URL: "nats://127.0.0.1:4222", AX_NATS_PASSWORD: S.nats }],
  ] as Array<[string, Record<string, string>]>)("configuration error on %s with secrets everywhere names the variable, prints no secret, exits 2", async (_k, patch) => {
    const r = await inProcess(["status"], { ...withSecrets(), AX_NAMESPACE: tc.ns, ...patch });
    expect(r.out).toMatch(/^ax: AX_/m);
    expect(r.out).not.toMatch(MARK);
    expect(r.code).toBe(2);
  });

  it("'cannot reach' NATS, PostgreSQL and Redis print no secret", async () => {
    const nats = await run(["status"], { ...withSecrets(), AX_NAMESPACE: tc.ns, AX_NATS_URL: `nats://ax:${S.nats}@127.0.0.1:1` });
    expect(nats.out).toMatch(/cannot reach NATS at nats:\/\/127\.0\.0\.1:1/);
    expect(nats.out).not.toMatch(MARK);
    const token = await run(["status"], { AX_NAMESPACE: tc.ns, AX_NATS_URL: `nats://${S.token}@127.0.0.1:1` });
    expect(token.out).toMatch(/cannot reach NATS/);
    expect(token.out).not.toMatch(MARK);
    const pg = await run(["node"], { ...withSecrets(), AX_NAMESPACE: tc.ns, AX_PG_URL: `postgres://postgres:${S.pg}@127.0.0.1:1/ax`, AX_LOG_LEVEL: "debug" });
    expect(pg.code).not.toBe(0);
    expect(pg.out).not.toMatch(MARK);
    expect(pg.out.length).toBeGreaterThan(0);
  }, 120_000);

  it("a node (AX_LOG_LEVEL=debug), an executor, their HTTP answers and the CLI print no secret while working", async () => {
    const env = { ...withSecrets(), AX_NAMESPACE: tc.ns, AX_SHARDS: "4", AX_LOG_LEVEL: "debug", AX_HEARTBEAT: "200ms", AX_LEASE_TTL: "2s" };
    let nodeOut = "";
    const node = spawn(process.execPath, ["bin/ax.mjs", "node", "--http", "0", "--id", "sec1"], { env: { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("AX_"))), ...env }, cwd: process.cwd() });
    node.stdout.on("data", (d) => (nodeOut += d)); node.stderr.on("data", (d) => (nodeOut += d));
    try {
      const http = await waitFor(() => /dashboard (http:\/\/127\.0\.0\.1:\d+)/.exec(nodeOut)?.[1], 30_000, "the node's dashboard address");
      const exec = spawn(process.execPath, ["bin/ax.mjs", "executor", "demo", "--name", "secx", "--sleep", "1"], { env: { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("AX_"))), ...env }, cwd: process.cwd() });
      let execOut = "";
      exec.stdout.on("data", (d) => (execOut += d)); exec.stderr.on("data", (d) => (execOut += d));
      try {
        const cliOut: string[] = [];
        const cli = async (args: string[]) => { const r = await inProcess(args, env); cliOut.push(r.out); return r; };
        await waitFor(async () => (await cli(["task", "create", "s1", "--executor", "secx", "--every", "1s"])).code === 0, 90_000, "task created", 500);
        await waitFor(async () => (await cli(["runs", "s1", "--json"])).out.includes("\"success\""), 60_000, "a run of s1", 500);
        for (const args of [["status"], ["status", "--json"], ["task", "show", "s1"], ["shards", "ls"], ["task", "show", "nope"], ["why", "nope"]]) await cli(args);
        cliOut.push((await run(["status"], env)).out); // and one real process
        const outputs = [nodeOut, execOut, ...cliOut];
        for (const path of ["/healthz", "/metrics", "/api/status", "/api/task/ls", "/api/shards/ls"]) outputs.push(await (await fetch(http + path)).text());
        for (const o of outputs) expect(o).not.toMatch(MARK);
        expect(nodeOut).toMatch(/node started/); // the log was written and scanned
      } finally { await stop(exec); }
      expect(execOut).not.toMatch(MARK);
    } finally { await stop(node); }
    expect(nodeOut).not.toMatch(MARK);
  }, 300_000);

  it("redact() masks URL passwords, NATS tokens in URLs and every configured secret value", () => {
    loadConfig({ AX_NATS_TOKEN: "tok-XSECRETX-9", AX_PG_URL: "postgres://u:p%2FXSECRETX@h/db" });
    expect(redact("x nats://tok@h:1 postgres://u:pw@h/db redis://:pw@h tok-XSECRETX-9 p/XSECRETX p%2FXSECRETX")).not.toMatch(MARK);
    expect(redact("postgres://u:pw@h/db")).toBe("postgres://u:***@h/db");
    expect(redact("postgres://postgres@h/db")).toBe("postgres://postgres@h/db");
    clearSecrets();
  });
});
