import { execFile, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { waitFor } from "./helpers.ts";

const run = promisify(execFile);

/** A loopback port nobody listens on now; with `bus`, port + 10000 is free too (a cluster node's bus). */
export async function freePort(bus = false): Promise<number> {
  const probe = (port: number) => new Promise<number | null>((resolve) => {
    const s = createServer();
    s.once("error", () => resolve(null));
    s.listen(port, "127.0.0.1", () => { const p = (s.address() as AddressInfo).port; s.close(() => resolve(p)); });
  });
  for (let i = 0; i < 200; i++) {
    const p = bus ? await probe(20_000 + Math.floor(Math.random() * 30_000)) : await probe(0);
    if (p === null) continue;
    if (!bus || (await probe(p + 10_000)) !== null) return p;
  }
  throw new Error("no free loopback port");
}

/** `redis-cli -p PORT args…` → its output (throws on a non-zero exit). */
export async function cli(port: number, ...args: string[]): Promise<string> {
  const { stdout } = await run("redis-cli", ["-h", "127.0.0.1", "-p", String(port), ...args], { timeout: 10_000 });
  return stdout;
}

export function infoField(info: string, field: string): string | undefined {
  return new RegExp(`^${field}:(.*)$`, "m").exec(info)?.[1]?.trim();
}

/**
 * Redis servers of a test's own, on free loopback ports, with their files in a temp dir; nothing
 * persisted. `teardown` kills every one (SIGKILL) and removes the dir.
 */
export class RedisProcs {
  readonly dir = mkdtempSync(join(tmpdir(), "ax-redis-"));
  private readonly procs = new Map<number, ChildProcess>();

  async start(port: number, args: string[] = [], conf?: string): Promise<void> {
    const argv: string[] = [];
    if (conf !== undefined) { const f = join(this.dir, `${port}.conf`); writeFileSync(f, conf); argv.push(f); }
    argv.push("--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", this.dir,
      "--logfile", join(this.dir, `${port}.log`), ...args);
    const p = spawn("redis-server", argv, { stdio: "ignore" });
    this.procs.set(port, p);
    await waitFor(async () => (await cli(port, "ping")).trim() === "PONG", 10_000, `redis on ${port}`, 50);
  }

  /** kill -9 (a lost machine) or SIGSTOP / SIGCONT (a frozen one). */
  signal(port: number, sig: NodeJS.Signals): void { this.procs.get(port)?.kill(sig); }

  async teardown(): Promise<void> {
    await Promise.all([...this.procs.values()].map((p) => new Promise<void>((resolve) => {
      if (p.exitCode !== null || p.signalCode !== null) return resolve();
      p.once("exit", () => resolve());
      p.kill("SIGCONT"); p.kill("SIGKILL");
    })));
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * A 3-master Redis Cluster, each master with one replica, created by `redis-cli --cluster create`.
 * Node timeout 1 s, so a killed master's replica takes over within a few seconds.
 */
export async function startRedisCluster(procs: RedisProcs): Promise<{ ports: number[] }> {
  const ports: number[] = [];
  for (let i = 0; i < 6; i++) {
    const p = await freePort(true);
    await procs.start(p, ["--cluster-enabled", "yes", "--cluster-config-file", join(procs.dir, `nodes-${p}.conf`), "--cluster-node-timeout", "1000"]);
    ports.push(p);
  }
  await run("redis-cli", ["--cluster", "create", ...ports.map((p) => `127.0.0.1:${p}`), "--cluster-replicas", "1", "--cluster-yes"], { timeout: 30_000 });
  // Every node agrees the cluster is up, and every replica has finished its first sync.
  await waitFor(async () => {
    for (const p of ports) {
      if (infoField(await cli(p, "cluster", "info"), "cluster_state") !== "ok") return false;
      const repl = await cli(p, "info", "replication");
      if (infoField(repl, "role") === "slave" && infoField(repl, "master_link_status") !== "up") return false;
    }
    return true;
  }, 20_000, "cluster state ok on every node", 100);
  return { ports };
}

/** `CLUSTER NODES` of a live node → which port is master of which slots, and replicas' masters. */
export async function clusterNodes(port: number): Promise<Array<{ id: string; port: number; master: boolean; failed: boolean; masterId: string | null; slots: Array<[number, number]> }>> {
  const out = await cli(port, "cluster", "nodes");
  return out.trim().split("\n").map((line) => {
    const f = line.split(" ");
    const ranges: Array<[number, number]> = f.slice(8).filter((x) => /^\d/.test(x)).map((x) => {
      const [a, b] = x.split("-"); return [Number(a), Number(b ?? a)];
    });
    return { id: f[0]!, port: Number(f[1]!.split(":")[1]!.split("@")[0]), master: f[2]!.includes("master"), failed: /fail/.test(f[2]!), masterId: f[3] === "-" ? null : f[3]!, slots: ranges };
  });
}

/**
 * A master, one replica and three sentinels (quorum 2, down after 1 s) watching it as `name`.
 */
export async function startSentinels(procs: RedisProcs, name: string): Promise<{ master: number; replica: number; sentinels: number[] }> {
  const master = await freePort();
  await procs.start(master);
  const replica = await freePort();
  await procs.start(replica, ["--replicaof", "127.0.0.1", String(master)]);
  await waitFor(async () => infoField(await cli(replica, "info", "replication"), "master_link_status") === "up", 10_000, "replica in sync");
  const sentinels: number[] = [];
  for (let i = 0; i < 3; i++) {
    const p = await freePort();
    await procs.start(p, ["--sentinel"], [
      `sentinel monitor ${name} 127.0.0.1 ${master} 2`,
      `sentinel down-after-milliseconds ${name} 1000`,
      `sentinel failover-timeout ${name} 10000`,
      `sentinel parallel-syncs ${name} 1`,
    ].join("\n") + "\n");
    sentinels.push(p);
  }
  // Each sentinel knows the replica and the two other sentinels before the test relies on them.
  await waitFor(async () => {
    for (const s of sentinels) {
      const m = await cli(s, "sentinel", "master", name);
      const lines = m.trim().split("\n");
      const get = (k: string) => lines[lines.indexOf(k) + 1];
      if (Number(get("num-slaves")) < 1 || Number(get("num-other-sentinels")) < 2) return false;
    }
    return true;
  }, 20_000, "sentinels to discover the replica and each other", 200);
  return { master, replica, sentinels };
}

/** The master's port as the sentinels report it now. */
export async function sentinelMaster(sentinel: number, name: string): Promise<number> {
  const out = (await cli(sentinel, "sentinel", "get-master-addr-by-name", name)).trim().split("\n");
  return Number(out[1]);
}
