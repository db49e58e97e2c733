import { execFileSync, fork, type ChildProcess } from "node:child_process";
import { closeSync, mkdirSync, openSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { jetstreamManager } from "@nats-io/jetstream";
import { connectNats, loadConfig, names, type AxConfig } from "../common/index.ts";
import { AxClient } from "../ops/client.ts";
import { dropStreams, type Executor, type RunContext } from "../protocol/index.ts";
import { Store, DueIndex } from "../actors/index.ts";
import { Recorder } from "./recorder.ts";
import { crossCheck, type CrossCheckResult, type RunRowTuple } from "./crosscheck.ts";
import { procCpuS, procRssMb } from "./proc.ts";
import { launcherFlags } from "./launcher.ts";

const ROOT = new URL("../", import.meta.url);

/**
 * The node and the executor SDK are measured compiled (dist/), as users run them; dist/ is
 * rebuilt first when it is missing or older than the sources (bin/ax.mjs's rule).
 */
async function ensureBuilt(): Promise<void> {
  const { staleReason } = (await import(new URL("bin/dist-fresh.mjs", ROOT).href)) as { staleReason: () => string | null };
  const reason = staleReason();
  if (reason === null) return;
  process.stderr.write(`[bench] ${reason}: building it (npm run build); the node and the SDK are measured compiled\n`);
  execFileSync("bash", [new URL("scripts/build.sh", ROOT).pathname], { stdio: ["ignore", "ignore", "inherit"] });
}

/**
 * How the node and the executor are started. Everything left undefined is the product default,
 * i.e. what `ax node` with no flags uses (AX_SHARDS 64, AX_TICK 20ms, AX_MAX_IN_FLIGHT 20000,
 * lease and heartbeat defaults, the V8 flags of bin/ax.mjs's launcher line). Setting shards, tickMs, maxInFlight, nodeFlags or
 * extraEnv makes the run an exploration (run.ts labels its rows and keeps them out of the table).
 */
export interface AxBenchOptions {
  /** Exploration: AX_SHARDS for the namespace (fixed when the cluster is created). */
  shards?: number;
  /** Exploration: AX_TICK in ms. */
  tickMs?: number;
  /** Exploration: AX_MAX_IN_FLIGHT (the node-wide in-flight bound per executor). */
  maxInFlight?: number;
  /** The executor instance's concurrency: the user's choice, like BullMQ's worker concurrency. */
  executorConcurrency: number;
  /** The executor SDK's event flush period (ms). */
  eventFlushMs?: number;
  /** Write V8 CPU profiles of the node process over each measured window into this directory. */
  cpuProfDir: string | null;
  /** Exploration: AX_* variables for the node. */
  extraEnv?: Record<string, string>;
  /** Exploration: extra V8/Node flags for the node process (e.g. --max-semi-space-size=32). */
  nodeFlags?: string[];
  /** Cross-check: how far the row's p50/p99 may be from the same figures by the runs table (ms). */
  crossCheckToleranceMs?: number;
}

/** True when the options differ from the product defaults in anything but the executor's concurrency. */
export function isExploration(o: AxBenchOptions): boolean {
  return o.shards !== undefined || o.tickMs !== undefined || o.maxInFlight !== undefined || (o.nodeFlags?.length ?? 0) > 0
    || Object.keys(o.extraEnv ?? {}).length > 0 || o.eventFlushMs !== undefined;
}

/** A measured row that must not be printed or recorded (the reason says why). */
export class RefusedRow extends Error {
  override name = "RefusedRow";
}

/** A measured row's figures disagree with the runs table. */
export class CrossCheckError extends RefusedRow {
  override name = "CrossCheckError";
  constructor(readonly label: string, readonly result: CrossCheckResult) {
    super(`cross-check failed for ${label}: ${result.problems.join("; ")}`);
  }
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
  private dueOf: (i: number) => number = () => NaN;
  /** The node's stdout/stderr (pino at the product's default level), removed after a clean stop. */
  readonly logPath: string;
  private seq = 0;
  private replies = new Map<number, (v: unknown) => void>();

  private constructor(readonly opts: AxBenchOptions) {
    this.ns = `bench_${randomBytes(4).toString("hex")}`;
    // Only the namespace and what an exploration asks for; AX_* settings of the caller's
    // environment other than the server URLs are dropped so that they cannot leak into a row.
    this.env = {
      AX_NAMESPACE: this.ns,
      ...(opts.shards !== undefined ? { AX_SHARDS: String(opts.shards) } : {}),
      ...(opts.tickMs !== undefined ? { AX_TICK: `${opts.tickMs}ms` } : {}),
      ...(opts.maxInFlight !== undefined ? { AX_MAX_IN_FLIGHT: String(opts.maxInFlight) } : {}),
      ...opts.extraEnv,
    };
    this.config = loadConfig(urlsOnly(process.env), this.env);
    this.logPath = join(tmpdir(), `ax-${this.ns}.log`);
  }

  static async start(opts: AxBenchOptions): Promise<AxBench> {
    const b = new AxBench(opts);
    await b.startNode();
    b.client = await AxClient.connect(b.config.nats, b.ns);
    // The executor registers itself as any SDK user's does (no in-flight bound of its own: the
    // node's default applies).
    // The executor SDK compiled too (dist/, built by startNode), as users' executors run it.
    const sdk = (await import(new URL("../dist/protocol/index.js", import.meta.url).href)) as typeof import("../protocol/index.ts");
    b.executor = new sdk.Executor({
      name: EXECUTOR, namespace: b.ns, nats: b.config.nats, concurrency: opts.executorConcurrency,
      ...(opts.eventFlushMs !== undefined ? { eventFlushMs: opts.eventFlushMs } : {}),
      handler: (ctx) => b.onRun(ctx),
    });
    await b.executor.start();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([b.executor.registered, new Promise((_, reject) => { timer = setTimeout(() => reject(new Error("the executor was not registered within 30 s")), 30_000); })])
      .finally(() => clearTimeout(timer));
    return b;
  }

  get nodePid(): number { return this.child.pid!; }

  private async startNode(): Promise<void> {
    // As `ax node` runs once built (bin/ax.mjs) or installed: the compiled dist/, with the V8
    // flags of ax's launcher line. --expose-gc only makes `gc()` callable (idle-1m settles the
    // heap before reading it); it does not change how V8 collects.
    await ensureBuilt();
    const execArgv = [...launcherFlags(), "--expose-gc"];
    execArgv.push(...(this.opts.nodeFlags ?? []));
    const fd = openSync(this.logPath, "w");
    this.child = fork(new URL("./node-child.mjs", import.meta.url).pathname, [], {
      execArgv, env: { ...urlsOnly(process.env), ...this.env }, stdio: ["ignore", fd, fd, "ipc"],
    });
    closeSync(fd);
    this.child.on("message", (m: { t: string; id?: number; value?: unknown; error?: string }) => {
      if (m.t === "reply" && m.id !== undefined) { this.replies.get(m.id)?.(m.value); this.replies.delete(m.id); }
    });
    return new Promise((resolve, reject) => {
      const onMsg = (m: { t: string; error?: string }) => {
        if (m.t === "ready") { this.child.off("message", onMsg); resolve(); }
        if (m.t === "error") reject(new Error(m.error));
      };
      this.child.on("message", onMsg);
      this.child.once("exit", (code) => reject(new Error(`node process exited with ${code} before it was ready; its log:\n${this.logTail()}`)));
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
  /** The last lines of the node's log (for an error message). */
  logTail(lines = 30): string {
    try { return readFileSync(this.logPath, "utf8").trimEnd().split("\n").slice(-lines).join("\n"); } catch { return "(no log)"; }
  }
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

  /**
   * Starts recording runs of tasks named `<prefix><i>`, i in [0, expected), whose due time is
   * `dueOf(i)`: the bench's own assignment, the one it passes to bulkCreate. Warm-up tasks and
   * tasks of other prefixes are not recorded.
   */
  record(prefix: string, expected: number, originMs: number, dueOf: (i: number) => number): Recorder {
    this.prefix = prefix;
    this.dueOf = dueOf;
    this.recorder = new Recorder(expected, originMs);
    return this.recorder;
  }

  private onRun(ctx: RunContext): void {
    // The handler's start on the scheduler's clock, first thing, before any bookkeeping.
    const start = Date.now();
    const r = this.recorder;
    if (!r) return;
    const n = ctx.taskName;
    if (n.startsWith(WARMUP_PREFIX) || !n.startsWith(this.prefix)) return;
    const rest = n.slice(this.prefix.length);
    const idx = /^\d+$/.test(rest) ? Number(rest) : -1;
    r.record(idx, idx >= 0 ? this.dueOf(idx) : NaN, start, ctx.firedAt);
  }

  /**
   * Compares the recorder with the namespace's runs table for tasks `<prefix><i>` (see
   * crosscheck.ts). The table is written behind the runs (the executor's started events are
   * batched, the node's writes too): it is read again for up to `settleMs` while it has fewer
   * started runs than the handler saw. Throws CrossCheckError when they disagree.
   */
  async crossCheck(label: string, settleMs = 15_000): Promise<CrossCheckResult> {
    const rec = this.recorder;
    if (!rec) throw new Error("crossCheck before record");
    const store = this.statsStore ??= new Store({ pgUrl: this.config.pgUrl, schema: this.ns, poolSize: 1 });
    const t0 = Date.now();
    for (;;) {
      const r = await store.pool.query<unknown[]>({
        text: `select substr(task_name, $2), due_ms, fired_ms, started_ms, state, source, slot_ms from "${this.ns}".runs where starts_with(task_name, $1)`,
        values: [this.prefix, this.prefix.length + 1], rowMode: "array",
      });
      const rows: RunRowTuple[] = [];
      for (const x of r.rows) {
        const rest = String(x[0]);
        if (!/^\d+$/.test(rest)) continue; // e.g. prefix "s1-" and a task "s1-x": not the bench's
        const n = (v: unknown) => (v === null ? null : Number(v));
        rows.push([Number(rest), Number(x[1]), n(x[2]), n(x[3]), String(x[4]), String(x[5]), n(x[6])]);
      }
      const res = crossCheck(rows, rec, this.dueOf, this.opts.crossCheckToleranceMs ?? 20);
      if (res.ok) return res;
      // The table is behind while it has fewer started runs (of the window) than the handler saw.
      if (res.started >= rec.runs || Date.now() - t0 > settleMs) throw new CrossCheckError(label, res);
      await sleep(1000);
    }
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
    rmSync(this.logPath, { force: true });
    return last;
  }
}

/** The caller's environment without AX_* settings other than where the servers are. */
function urlsOnly(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(env)) if (!k.startsWith("AX_") || ["AX_NATS_URL", "AX_REDIS_URL", "AX_PG_URL"].includes(k)) out[k] = v;
  return out;
}

/** Removes a namespace from PostgreSQL, Redis and JetStream. */
export async function teardownNamespace(config: AxConfig): Promise<void> {
  const store = new Store({ pgUrl: config.pgUrl, schema: config.namespace, poolSize: 2 });
  await store.dropNamespace().catch(() => undefined).finally(() => store.close());
  const due = new DueIndex(config.redis, config.namespace);
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
