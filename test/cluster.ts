import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, mkdirSync } from "node:fs";
import { join } from "node:path";
import { jetstreamManager } from "@nats-io/jetstream";
import { connectNats, names, silentLogger, createLogger, type AxConfig, type Clock } from "../common/index.ts";
import { AxNode } from "../ops/node.ts";
import { AxClient } from "../ops/client.ts";
import { dropStreams, Executor, type RunHandler } from "../protocol/index.ts";
import { Store, DueIndex } from "../actors/index.ts";
import { testConfig, testNamespace, waitFor } from "./helpers.ts";

/** Fast cluster timings for tests: heartbeats every 200 ms, leases of 2 s, 10 ms ticks. */
export const FAST = { AX_HEARTBEAT: "200ms", AX_LEASE_TTL: "2s", AX_TICK: "10ms", AX_SHARDS: "8", AX_LOG_LEVEL: process.env.AX_TEST_LOG ?? "silent" };

/**
 * One namespace with everything a test starts in it, and a teardown that stops it all and
 * removes the namespace from PostgreSQL, Redis and JetStream (so test files run in parallel
 * and leave nothing behind).
 */
export class TestCluster {
  readonly ns: string;
  readonly config: AxConfig;
  readonly env: Record<string, string>;
  private nodes: AxNode[] = [];
  private executors: Executor[] = [];
  private children: ChildProcess[] = [];
  private clients: AxClient[] = [];

  constructor(prefix: string, overrides: Record<string, string> = {}) {
    this.ns = overrides.AX_NAMESPACE ?? testNamespace(prefix);
    this.env = { ...FAST, ...overrides, AX_NAMESPACE: this.ns };
    this.config = testConfig(this.ns, this.env);
  }

  async startNode(id = `n${this.nodes.length + 1}`, opts: { httpPort?: number | null; clock?: Clock } = {}): Promise<AxNode> {
    const level = this.config.logLevel;
    const node = new AxNode({ config: this.config, nodeId: id, httpPort: opts.httpPort ?? null, logger: level === "silent" ? silentLogger : createLogger({ level }),
      ...(opts.clock ? { clock: opts.clock } : {}) });
    await node.start();
    this.nodes.push(node);
    return node;
  }

  async waitForShards(nodes: AxNode[] = this.nodes, count = this.config.shardCount, timeoutMs = 15_000): Promise<void> {
    await waitFor(() => nodes.reduce((n, x) => n + x.ownedShards().length, 0) === count, timeoutMs, `all ${count} shards owned`);
  }

  async startExecutor(name: string, handler: RunHandler, opts: { concurrency?: number; ackWaitMs?: number; holdAhead?: boolean; maxInFlight?: number } = {}): Promise<Executor> {
    const ex = new Executor({ name, handler, namespace: this.ns, nats: this.config.nats, concurrency: opts.concurrency ?? 64, eventFlushMs: 2, ...(opts.ackWaitMs ? { ackWaitMs: opts.ackWaitMs } : {}),
      ...(opts.holdAhead !== undefined ? { holdAhead: opts.holdAhead } : {}), ...(opts.maxInFlight !== undefined ? { maxInFlight: opts.maxInFlight } : {}) });
    await ex.start();
    this.executors.push(ex);
    return ex;
  }

  /**
   * A trigger in this namespace's schema that refuses (SQLSTATE P0001, a data refusal) every run
   * row whose error contains `marker`: the write of a failure event that can never be recorded.
   */
  async refuseRunsWithError(marker: string): Promise<void> {
    const store = new Store({ pgUrl: this.config.pgUrl, schema: this.ns, poolSize: 1 });
    const like = `%${marker}%`.replace(/'/g, "''");
    try {
      await store.pool.query(`create function "${this.ns}".poison() returns trigger language plpgsql as $$ begin if new.error like '${like}' then raise exception 'poisoned row'; end if; return new; end $$`);
      await store.pool.query(`create trigger poison before insert or update on "${this.ns}".runs for each row execute function "${this.ns}".poison()`);
    } finally { await store.close(); }
  }

  async client(): Promise<AxClient> {
    const c = await AxClient.connect(this.config.nats, this.ns);
    this.clients.push(c);
    return c;
  }

  /** Runs the real CLI (`bin/ax.mjs`) in this namespace; resolves with its exit code and output. */
  cli(args: string[], timeoutMs = 30_000): Promise<{ code: number; stdout: string; stderr: string }> {
    return new Promise((resolve, reject) => {
      const p = spawn(process.execPath, ["bin/ax.mjs", ...args], { env: { ...process.env, ...this.env }, cwd: process.cwd() });
      let stdout = ""; let stderr = "";
      p.stdout.on("data", (d) => (stdout += d)); p.stderr.on("data", (d) => (stderr += d));
      const t = setTimeout(() => { p.kill("SIGKILL"); reject(new Error(`ax ${args.join(" ")} timed out; stderr: ${stderr}`)); }, timeoutMs);
      p.on("exit", (code) => { clearTimeout(t); resolve({ code: code ?? -1, stdout, stderr }); });
    });
  }

  /** Starts `ax …` as a separate process (a real node or executor that tests can kill -9). */
  spawn(args: string[], extraEnv: Record<string, string> = {}): ChildProcess {
    const p = spawn(process.execPath, ["bin/ax.mjs", ...args], { env: { ...process.env, ...this.env, ...extraEnv }, cwd: process.cwd(), stdio: ["ignore", "ignore", "pipe"] });
    // AX_TEST_CHILD_LOGS=DIR (with AX_TEST_LOG=info) keeps each child's log in DIR for debugging.
    const dir = process.env.AX_TEST_CHILD_LOGS;
    if (dir) {
      mkdirSync(dir, { recursive: true });
      const out = createWriteStream(join(dir, `${this.ns}-${args.join("_").replace(/[^A-Za-z0-9_.-]/g, "")}-${this.children.length}.log`));
      p.stderr?.pipe(out);
    } else p.stderr?.on("data", () => undefined);
    this.children.push(p);
    return p;
  }

  async stopNode(node: AxNode): Promise<void> {
    await node.stop();
    this.nodes = this.nodes.filter((n) => n !== node);
  }

  async teardown(): Promise<void> {
    for (const c of this.children) if (c.exitCode === null && c.signalCode === null) { c.kill("SIGCONT"); c.kill("SIGKILL"); }
    await Promise.allSettled(this.executors.map((e) => e.stop()));
    await Promise.allSettled(this.nodes.map((n) => n.stop()));
    await Promise.allSettled(this.clients.map((c) => c.close()));
    const store = new Store({ pgUrl: this.config.pgUrl, schema: this.ns, poolSize: 2 });
    await store.dropNamespace().finally(() => store.close());
    const due = new DueIndex(this.config.redis, this.ns);
    await due.dropNamespace().finally(() => due.close());
    const nc = await connectNats(this.config.nats);
    try { await dropStreams(await jetstreamManager(nc), names(this.ns)); } finally { await nc.close(); }
  }
}
