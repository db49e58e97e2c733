/**
 * The peer: the same one-shot delayed workload on BullMQ delayed jobs, tuned as a user who
 * cares about latency would run it:
 * - its own redis-server (redis-server.ts), started for each peer row on a free loopback port
 *   with `--hz 100 --save "" --appendonly no` and stopped after it (`--peer-hz 10` adds a row at
 *   Redis's default hz, labelled);
 * - one Worker (concurrency 100) in a child process, whose CPU and RSS are the row's "node"
 *   figures; the servers' CPU is that redis-server's alone;
 * - warmed like ax: the measured jobs are preceded by unmeasured ones (20k by default) due just
 *   before them at the same rate.
 * The producer (this process) adds jobs with `addBulk` (1000 per call, `timestamp` and `delay`
 * set so a job is due exactly when the ax task would be; the due time the bench assigned travels
 * in the job's data). The worker records `Date.now()` at handler start − that due time, on the
 * same recorder as ax.
 *
 * Note the durability difference: ax writes every transition to PostgreSQL (fsync on); the
 * BullMQ side keeps its state in Redis, which runs here without AOF or snapshots.
 */
import { fork, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { Queue, Worker, type Job } from "bullmq";
import { Recorder, cpuWindow, type RecorderSummary } from "./recorder.ts";
import type { ServersCpu } from "./proc.ts";
import type { NodeUsage } from "./harness.ts";
import { RateSearch, sweepWarmUp } from "./sweep.ts";
import { startRedis, type OwnRedis } from "./redis-server.ts";

/** The warm-up steps' id (measured steps are 0, 1, …). */
const WARM_UP_STEP = 1000;
export const PEER_CONCURRENCY = 100;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface PeerResult {
  s: RecorderSummary; u0: NodeUsage; u1: NodeUsage; sv: ServersCpu; createMs: number; tasks: number; rate: number | null; dueMs: number;
  /** How long after T0 the last job was added (0: in time). */ createdLateMs: number;
  /** The runs the CPU window holds: the measured ones and the warm-up's (as for ax, run.ts axStep). */ cpuRuns: number;
}
export interface PeerOptions { hz: number; concurrency?: number; /** least lead time, as for ax (run.ts --lead) */ minLeadMs?: number }

function redisConn(url: string) {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port || 6379), maxRetriesPerRequest: null };
}

type ChildMsg =
  | { t: "record"; id: number; step: number; expected: number; origin: number }
  | { t: "wait"; id: number; n: number; timeoutMs: number }
  | { t: "usage"; id: number }
  | { t: "stop"; id: number };

/** The parent side: its own redis-server, a worker process and a producer queue. */
class BullBench {
  readonly queueName = "delayed";
  queue!: Queue;
  redis!: OwnRedis;
  child!: ChildProcess;
  private seq = 0;
  private replies = new Map<number, (v: unknown) => void>();
  constructor(readonly o: PeerOptions) {}
  async start(): Promise<void> {
    this.redis = await startRedis(this.o.hz);
    this.queue = new Queue(this.queueName, { connection: redisConn(this.redis.url), prefix: "axbench" });
    this.child = fork(fileURLToPath(import.meta.url), ["worker"], {
      execArgv: ["--import", "tsx"], stdio: ["ignore", 2, 2, "ipc"],
      env: { ...process.env, BULL_PREFIX: "axbench", BULL_QUEUE: this.queueName, BULL_REDIS: this.redis.url, BULL_CONCURRENCY: String(this.o.concurrency ?? PEER_CONCURRENCY) },
    });
    this.child.on("message", (m: { t: string; id?: number; value?: unknown }) => {
      if (m.t === "reply" && m.id !== undefined) { this.replies.get(m.id)?.(m.value); this.replies.delete(m.id); }
    });
    await new Promise<void>((resolve, reject) => {
      this.child.on("message", (m: { t: string }) => { if (m.t === "ready") resolve(); });
      this.child.once("exit", (c) => reject(new Error(`bullmq worker exited with ${c}`)));
    });
  }
  ask<T>(m: Record<string, unknown> & { t: string }, timeoutMs = 300_000): Promise<T> {
    const id = ++this.seq;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`worker did not answer ${m.t}`)), timeoutMs);
      this.replies.set(id, (v) => { clearTimeout(timer); resolve(v as T); });
      this.child.send({ ...m, id });
    });
  }
  async add(step: number, count: number, dueOf: (i: number) => number): Promise<number> {
    const t0 = performance.now();
    let next = 0;
    const worker = async () => {
      for (;;) {
        const from = next; next += 1000;
        if (from >= count) return;
        const now = Date.now();
        const jobs = [];
        for (let i = from; i < Math.min(count, from + 1000); i++) {
          const due = dueOf(i);
          jobs.push({ name: "j", data: { s: step, i, due }, opts: { timestamp: now, delay: Math.max(0, due - now), removeOnComplete: true, removeOnFail: true } });
        }
        await this.queue.addBulk(jobs);
      }
    };
    await Promise.all(Array.from({ length: 4 }, worker));
    return performance.now() - t0;
  }
  /**
   * One measured step: `tasks` jobs due at `dueOf(i)` (from T0 on), after `warmup` unmeasured
   * jobs due just before T0 at `warmRate`/s; waits until every measured job ran.
   */
  async step(step: number, tasks: number, warmup: number, warmRate: number, dueOf: (T0: number, i: number) => number, rate: number | null): Promise<PeerResult> {
    const warmSpanMs = warmup > 0 ? Math.ceil((warmup * 1000) / warmRate) : 0;
    const leadMs = Math.max(this.o.minLeadMs ?? 5000, Math.ceil((tasks + warmup) / 12) + 4000) + warmSpanMs;
    const T0 = Date.now() + leadMs;
    const due = (i: number) => dueOf(T0, i);
    await this.ask({ t: "record", step, expected: tasks, origin: T0 });
    const warmDue = (i: number) => T0 - warmSpanMs + Math.floor((i * 1000) / warmRate);
    if (warmup > 0) await this.add(WARM_UP_STEP, warmup, warmDue);
    const createMs = await this.add(step, tasks, due);
    const createdLateMs = Math.max(0, Date.now() - T0);
    // As for ax (run.ts axStep): CPU from CPU_AHEAD_MS before T0, the warm-up's jobs due in it included.
    const cw = cpuWindow(Date.now(), T0, warmup, warmDue);
    await sleep(Math.max(0, cw.fromMs - Date.now()));
    const u0 = await this.ask<NodeUsage>({ t: "usage" }); const r0 = this.redis.cpuS();
    await sleep(Math.max(0, T0 - 300 - Date.now()));
    const s = await this.ask<RecorderSummary & { done: boolean }>({ t: "wait", n: tasks, timeoutMs: due(tasks - 1) - Date.now() + (rate === null ? 120_000 : 30_000) });
    const u1 = await this.ask<NodeUsage>({ t: "usage" });
    const redis = Math.round((this.redis.cpuS() - r0) * 100) / 100;
    return { s, u0, u1, sv: { postgres: 0, redis, nats: 0, total: redis }, createMs, tasks, rate, dueMs: T0, createdLateMs, cpuRuns: s.runs + cw.warmRuns };
  }
  async stop(): Promise<void> {
    if (this.child && this.child.exitCode === null) {
      await this.ask({ t: "stop" }, 30_000).catch(() => undefined);
      await sleep(100);
      if (this.child.exitCode === null) this.child.kill("SIGKILL");
    }
    await this.queue?.close().catch(() => undefined);
    await this.redis?.stop();
  }
}

async function withPeer<T>(o: PeerOptions, fn: (b: BullBench) => Promise<T>): Promise<T> {
  const b = new BullBench(o);
  try { await b.start(); return await fn(b); } finally { await b.stop(); }
}

/** `tasks` jobs due from T0 on at `rate`/s, after `warmup` unmeasured ones at the same rate. */
export function runBullSeed(o: PeerOptions & { tasks: number; rate: number; warmup: number }): Promise<PeerResult> {
  return withPeer(o, (b) => b.step(0, o.tasks, o.warmup, o.rate, (T0, i) => T0 + Math.floor((i * 1000) / o.rate), o.rate));
}

/** `tasks` jobs due at one instant, after `warmup` unmeasured ones at `warmRate`/s ending 2 s before it. */
export function runBullBurst(o: PeerOptions & { tasks: number; warmup: number; warmRate: number }): Promise<PeerResult> {
  return withPeer(o, (b) => b.step(0, o.tasks, o.warmup, o.warmRate, (T0) => T0, null));
}

export interface SweepStep { rate: number; p99: number; lost: number; dup: number; early?: number; achieved: number | null; pass: boolean; crossCheck?: boolean }

/** The same bounded sweep as ax's max-rate: ×1.5 while passing, then bisect to within 10%. */
export async function runBullSweep(o: PeerOptions & { start: number; windowS: number; budgetS: number; p99Limit: number; log: (...a: unknown[]) => void }):
  Promise<{ best: PeerResult | null; steps: SweepStep[] }> {
  const steps: SweepStep[] = [];
  let best: PeerResult | null = null;
  await withPeer(o, async (b) => {
    const warm = sweepWarmUp(o.start, o.windowS);
    o.log(`bullmq max-rate warm-up: ${warm.tasks} jobs at ${warm.rate}/s (not measured)`);
    await b.step(WARM_UP_STEP + 1, warm.tasks, 0, warm.rate, (T0, i) => T0 + Math.floor((i * 1000) / warm.rate), warm.rate);
    await sleep(1000);
    const t0 = Date.now();
    const search = new RateSearch(o.start); let step = 0;
    while ((Date.now() - t0) / 1000 < o.budgetS && step < 16) {
      const rate = search.rate;
      const tasks = Math.round(rate * o.windowS);
      const r = await b.step(step, tasks, 0, rate, (T0, i) => T0 + Math.floor((i * 1000) / rate), rate);
      const s = r.s;
      const pass = s.lost === 0 && s.duplicated === 0 && s.early === 0 && r.createdLateMs === 0 && s.latencyMs.p99 <= o.p99Limit;
      const achieved = s.runs > 1 && s.lastStartMs !== null && s.firstStartMs !== null && s.lastStartMs > s.firstStartMs ? Math.round((s.runs - 1) / ((s.lastStartMs - s.firstStartMs) / 1000)) : null;
      steps.push({ rate, p99: s.latencyMs.p99, lost: s.lost, dup: s.duplicated, early: s.early, achieved, pass });
      o.log(`bullmq max-rate step ${step}: ${rate}/s → p99 ${s.latencyMs.p99}ms lost ${s.lost} dup ${s.duplicated} early ${s.early} ${pass ? "pass" : "FAIL"}`);
      step++;
      if (pass && (!best || rate > (best.rate ?? 0))) best = r;
      const next = search.next(pass, s.lost === 0 && s.duplicated === 0 && s.early === 0 && r.createdLateMs === 0);
      if (next === null) break;
      if (next === "again") o.log(`bullmq max-rate: ${rate}/s once more (failed on lateness alone)`);
      await sleep(1000);
    }
  });
  return { best, steps };
}

// ---- the worker process -------------------------------------------------------------------------

async function workerMain(): Promise<void> {
  const send = (m: unknown) => process.send?.(m);
  let rec: Recorder | null = null;
  let step = -1;
  const worker = new Worker(process.env.BULL_QUEUE!, async (job: Job<{ s: number; i: number; due: number }>) => {
    // The handler's start on the same clock as ax's executor; the due time is the bench's own.
    const start = Date.now();
    if (rec && job.data.s === step) rec.record(job.data.i, job.data.due, start);
  }, { connection: redisConn(process.env.BULL_REDIS!), prefix: process.env.BULL_PREFIX!, concurrency: Number(process.env.BULL_CONCURRENCY ?? PEER_CONCURRENCY),
    removeOnComplete: { count: 0 }, removeOnFail: { count: 0 } });
  await worker.waitUntilReady();
  const usage = (): NodeUsage => {
    const c = process.cpuUsage(); const m = process.memoryUsage();
    return { cpuS: (c.user + c.system) / 1e6, rssMb: m.rss / 1048576, heapUsedMb: m.heapUsed / 1048576, maxRssMb: process.resourceUsage().maxRSS / 1024 };
  };
  process.on("message", (m: ChildMsg) => {
    void (async () => {
      switch (m.t) {
        case "record": rec = new Recorder(m.expected, m.origin); step = m.step; send({ t: "reply", id: m.id, value: true }); break;
        case "wait": {
          const done = await rec!.waitFor(m.n, m.timeoutMs);
          await sleep(1000);
          rec!.freeze();
          send({ t: "reply", id: m.id, value: { ...rec!.summary(), done } });
          break;
        }
        case "usage": send({ t: "reply", id: m.id, value: usage() }); break;
        case "stop": await worker.close().catch(() => undefined); send({ t: "reply", id: m.id, value: usage() }); setTimeout(() => process.exit(0), 20); break;
      }
    })();
  });
  process.on("disconnect", () => process.exit(0));
  send({ t: "ready" });
}

if (process.argv[2] === "worker") await workerMain();
