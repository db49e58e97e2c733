import { fork, type ChildProcess } from "node:child_process";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { jetstreamManager } from "@nats-io/jetstream";
import { connectNats, loadConfig, names, type AxConfig } from "../common/index.ts";
import { AxClient } from "../ops/client.ts";
import { Executor, dropStreams, type RunContext } from "../protocol/index.ts";
import { Store, DueIndex } from "../actors/index.ts";
import { Recorder, wallNow } from "./recorder.ts";
import { procCpuS, procRssMb } from "./proc.ts";

export interface AxBenchOptions {
  shards: number;
  tickMs: number;
  /** In-flight bound per executor (node-wide and registered for the bench executor). */
  maxInFlight: number;
  executorConcurrency: number;
  /** The executor SDK's event flush period (ms). */
  eventFlushMs?: number;
  /** Write V8 CPU profiles of the node process over each measured window into this directory. */
  cpuProfDir: string | null;
  logLevel: string;
  extraEnv?: Record<string, string>;
  /** Extra V8/Node flags for the node process (e.g. --max-semi-space-size=32). */
  nodeFlags?: string[];
}

export interface NodeUsage { cpuS: number; sysS?: number; rssMb: number; heapUsedMb: number; maxRssMb: number }

export const EXECUTOR = "bench";

/**
 * One benchmark cluster: a fresh namespace, one ax node in a child process (so its CPU and
 * RSS are its own), one executor instance in this process whose handler records lateness,
 * and a teardown that removes the namespace from PostgreSQL, Redis and JetStream.
 */
/** Names of warm-up tasks (`--warmup N`), whose runs are not recorded. */
export const WARMUP_PREFIX = "warmup-";

export class AxBench {
  readonly ns: string;
  readonly config: AxConfig;
  readonly env: Record<string, string>;
  child!: ChildProcess;
  client!: AxClient;
  executor!: Executor;
  recorder: Recorder | null = null;
  private prefix = "";
  private seq = 0;
  private replies = new Map<number, (v: unknown) => void>();

  private constructor(readonly opts: AxBenchOptions) {
    this.ns = `bench_${randomBytes(4).toString("hex")}`;
    this.env = {
      AX_NAMESPACE: this.ns, AX_SHARDS: String(opts.shards), AX_TICK: `${opts.tickMs}ms`, AX_MAX_IN_FLIGHT: String(opts.maxInFlight),
      AX_LOG_LEVEL: opts.logLevel, AX_HEARTBEAT: "1s", AX_LEASE_TTL: "10s", ...opts.extraEnv,
    };
    this.config = loadConfig(process.env, this.env);
  }

  static async start(opts: AxBenchOptions): Promise<AxBench> {
    const b = new AxBench(opts);
    await b.startNode();
    b.client = await AxClient.connect(b.config.nats, b.ns);
    await b.client.call("executor.register", { name: EXECUTOR, maxInFlight: opts.maxInFlight });
    b.executor = new Executor({
      name: EXECUTOR, namespace: b.ns, nats: b.config.nats, concurrency: opts.executorConcurrency, register: false,
      ...(opts.eventFlushMs !== undefined ? { eventFlushMs: opts.eventFlushMs } : {}),
      handler: (ctx) => b.onRun(ctx),
    });
    await b.executor.start();
    return b;
  }

  get nodePid(): number { return this.child.pid!; }

  private startNode(): Promise<void> {
    const execArgv = ["--import", "tsx", "--expose-gc", "--max-old-space-size=6144"];
    execArgv.push(...(this.opts.nodeFlags ?? []));
    this.child = fork(new URL("./node-child.ts", import.meta.url).pathname, [], {
      execArgv, env: { ...process.env, ...this.env }, stdio: ["ignore", 2, 2, "ipc"],
    });
    this.child.on("message", (m: { t: string; id?: number; value?: unknown; error?: string }) => {
      if (m.t === "reply" && m.id !== undefined) { this.replies.get(m.id)?.(m.value); this.replies.delete(m.id); }
    });
    return new Promise((resolve, reject) => {
      const onMsg = (m: { t: string; error?: string }) => {
        if (m.t === "ready") { this.child.off("message", onMsg); resolve(); }
        if (m.t === "error") reject(new Error(m.error));
      };
      this.child.on("message", onMsg);
      this.child.once("exit", (code) => reject(new Error(`node process exited with ${code} before it was ready`)));
    });
  }

  private ask<T>(t: string, timeoutMs = 60_000): Promise<T> {
    const id = ++this.seq;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => { this.replies.delete(id); reject(new Error(`node did not answer ${t}`)); }, timeoutMs);
      this.replies.set(id, (v) => { clearTimeout(timer); resolve(v as T); });
      this.child.send({ t, id });
    });
  }
  usage(): Promise<NodeUsage> { return this.ask<NodeUsage>("usage"); }
  private profSeq = 0;
  /** Starts a CPU profile of the node (when --prof DIR was given). */
  async profStart(): Promise<void> { if (this.opts.cpuProfDir) await this.ask("profStart"); }
  /** Stops it and writes DIR/<label>-<n>.cpuprofile. */
  async profStop(label: string): Promise<string | null> {
    if (!this.opts.cpuProfDir) return null;
    mkdirSync(this.opts.cpuProfDir, { recursive: true });
    const path = join(this.opts.cpuProfDir, `${label}-${++this.profSeq}.cpuprofile`);
    const id = ++this.seq;
    await new Promise<void>((resolve) => { this.replies.set(id, () => resolve()); this.child.send({ t: "profStop", id, path }); });
    return path;
  }
  gcUsage(): Promise<NodeUsage> { return this.ask<NodeUsage>("gc"); }
  nodeStatus(): Promise<unknown> { return this.ask("stats"); }
  /** PostgreSQL counters of the namespace (transactions are database-wide). */
  async pgStats(): Promise<Record<string, number>> {
    const store = this.statsStore ??= new Store({ pgUrl: this.config.pgUrl, schema: this.ns, poolSize: 1 });
    const db = (await store.pool.query("select xact_commit, blks_hit, tup_fetched, tup_returned from pg_stat_database where datname = current_database()")).rows[0];
    const t = (await store.pool.query("select relname, seq_scan, idx_scan, n_tup_ins, n_tup_upd, n_tup_hot_upd from pg_stat_user_tables where schemaname = $1", [this.ns])).rows;
    const wal = (await store.pool.query("select wal_records, wal_fpi, wal_bytes from pg_stat_wal")).rows[0];
    const ck = (await store.pool.query("select checkpoints_timed + checkpoints_req as ck from pg_stat_bgwriter")).rows[0];
    const out: Record<string, number> = { xact: Number(db.xact_commit), tupFetched: Number(db.tup_fetched), tupReturned: Number(db.tup_returned),
      walRecords: Number(wal.wal_records), walFpi: Number(wal.wal_fpi), walMB: Number(wal.wal_bytes) / 1048576, checkpoints: Number(ck.ck) };
    for (const r of t) for (const k of ["seq_scan", "idx_scan", "n_tup_ins", "n_tup_upd", "n_tup_hot_upd"]) out[`${r.relname}.${k}`] = Number(r[k] ?? 0);
    return out;
  }
  private statsStore: Store | null = null;
  /** CPU seconds of this namespace's own PostgreSQL backends (pg_stat_activity by application_name), for runs on a shared server. */
  async pgOwnCpuS(): Promise<number> {
    const store = this.statsStore ??= new Store({ pgUrl: this.config.pgUrl, schema: this.ns, poolSize: 1 });
    const r = await store.pool.query("select pid from pg_stat_activity where application_name = $1", [`ax:${this.ns}`]);
    let t = 0;
    for (const x of r.rows) { const c = procCpuS(Number(x.pid)); if (c !== null) { this.pgSeen.set(Number(x.pid), c); } }
    for (const c of this.pgSeen.values()) t += c;
    return t;
  }
  private pgSeen = new Map<number, number>();
  rssMb(): number { return procRssMb(this.nodePid) ?? 0; }

  /** Starts recording runs of tasks named `<prefix><i>`, i in [0, expected); warm-up tasks are not recorded. */
  record(prefix: string, expected: number, originMs: number): Recorder {
    this.prefix = prefix;
    this.recorder = new Recorder(expected, originMs);
    return this.recorder;
  }

  private onRun(ctx: RunContext): void {
    const start = wallNow();
    const r = this.recorder;
    if (!r) return;
    const n = ctx.taskName;
    if (n.startsWith(WARMUP_PREFIX)) return;
    const idx = n.startsWith(this.prefix) ? Number(n.slice(this.prefix.length)) : -1;
    r.record(Number.isInteger(idx) ? idx : -1, ctx.scheduledAt, start, ctx.firedAt);
  }

  /**
   * Registers `count` one-shot tasks `<prefix><i>` due at `dueOf(i)` through `task.bulkCreate`,
   * `chunk` specs per call, `parallel` calls in flight. Returns wall time and per-call latencies.
   */
  async bulkCreate(prefix: string, count: number, dueOf: (i: number) => number, opts: { chunk?: number; parallel?: number } = {}): Promise<{ ms: number; callMs: number[] }> {
    const chunk = opts.chunk ?? 5000;
    const parallel = opts.parallel ?? 3;
    const callMs: number[] = [];
    const t0 = performance.now();
    let next = 0;
    const worker = async () => {
      for (;;) {
        const from = next; next += chunk;
        if (from >= count) return;
        const tasks: Array<{ name: string; at: string }> = [];
        for (let i = from; i < Math.min(count, from + chunk); i++) tasks.push({ name: `${prefix}${i}`, at: new Date(dueOf(i)).toISOString() });
        const c0 = performance.now();
        await this.client.call("task.bulkCreate", { defaults: { executor: EXECUTOR, timeout: "30s" }, tasks }, 120_000);
        callMs.push(performance.now() - c0);
      }
    };
    await Promise.all(Array.from({ length: parallel }, worker));
    return { ms: performance.now() - t0, callMs };
  }

  async stop(): Promise<NodeUsage | null> {
    await this.executor?.stop().catch(() => undefined);
    let last: NodeUsage | null = null;
    if (this.child.exitCode === null) {
      const exited = new Promise((r) => this.child.once("exit", r));
      last = await this.ask<NodeUsage>("stop", 60_000).catch(() => null);
      await Promise.race([exited, new Promise((r) => setTimeout(r, 15_000))]);
      if (this.child.exitCode === null) this.child.kill("SIGKILL");
    }
    await this.client?.close();
    await this.statsStore?.close();
    await teardownNamespace(this.config);
    return last;
  }
}

/** Removes a namespace from PostgreSQL, Redis and JetStream. */
export async function teardownNamespace(config: AxConfig): Promise<void> {
  const store = new Store({ pgUrl: config.pgUrl, schema: config.namespace, poolSize: 2 });
  await store.dropNamespace().catch(() => undefined).finally(() => store.close());
  const due = new DueIndex(config.redisUrl, config.namespace);
  await due.dropNamespace().catch(() => undefined).finally(() => due.close());
  const nc = await connectNats(config.nats);
  try { await dropStreams(await jetstreamManager(nc), names(config.namespace)); } finally { await nc.close(); }
}

/** Size of the namespace's task tables in PostgreSQL (bytes, with indexes and TOAST). */
export async function pgTaskBytes(config: AxConfig): Promise<number> {
  const store = new Store({ pgUrl: config.pgUrl, schema: config.namespace, poolSize: 1 });
  try {
    const r = await store.pool.query("select pg_total_relation_size('tasks') + pg_total_relation_size('triggers') + pg_total_relation_size('task_triggers') as b");
    return Number(r.rows[0].b);
  } finally { await store.close(); }
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
