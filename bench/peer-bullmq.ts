/**
 * The peer: the same one-shot delayed workload on BullMQ delayed jobs. The producer (this
 * process) adds jobs with `addBulk` (1000 per call, `timestamp` and `delay` set so a job is
 * due exactly when the ax task would be); one Worker in a child process (its CPU and RSS are
 * reported as the "node" figures) records handler start − due time exactly as the ax executor
 * does. Queue names carry a unique prefix; everything is obliterated and the keys deleted after.
 *
 * Note the durability difference: ax writes every transition to PostgreSQL (fsync on); the
 * BullMQ side keeps its state in Redis, which runs here without AOF or snapshots.
 */
import { fork, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import { Queue, Worker, type Job } from "bullmq";
import { Redis } from "ioredis";
import { Recorder, wallNow, type RecorderSummary } from "./recorder.ts";
import { diffServers, serversCpu, type ServersCpu } from "./proc.ts";
import type { NodeUsage } from "./harness.ts";
import { nextSweepRate, sweepWarmUp } from "./sweep.ts";

/** The warm-up step's id (measured steps are 0, 1, …). */
const WARM_UP_STEP = 1000;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface PeerResult { s: RecorderSummary; u0: NodeUsage; u1: NodeUsage; sv: ServersCpu; createMs: number; tasks: number; rate: number }

function redisConn(url: string) {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port || 6379), maxRetriesPerRequest: null };
}

type ChildMsg =
  | { t: "record"; id: number; step: number; expected: number; origin: number }
  | { t: "wait"; id: number; n: number; timeoutMs: number }
  | { t: "usage"; id: number }
  | { t: "stop"; id: number };

/** The parent side: a worker process plus a producer queue under one unique prefix. */
class BullBench {
  readonly prefix = `axbench_${randomBytes(4).toString("hex")}`;
  readonly queueName = "delayed";
  queue: Queue;
  child!: ChildProcess;
  private seq = 0;
  private replies = new Map<number, (v: unknown) => void>();
  constructor(readonly redisUrl: string, readonly concurrency: number) {
    this.queue = new Queue(this.queueName, { connection: redisConn(redisUrl), prefix: this.prefix });
  }
  async start(): Promise<void> {
    this.child = fork(fileURLToPath(import.meta.url), ["worker"], {
      execArgv: ["--import", "tsx", "--max-old-space-size=6144"], stdio: ["ignore", 2, 2, "ipc"],
      env: { ...process.env, BULL_PREFIX: this.prefix, BULL_QUEUE: this.queueName, BULL_REDIS: this.redisUrl, BULL_CONCURRENCY: String(this.concurrency) },
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
  /** One step: `tasks` jobs due from a lead time on at `rate`/s; waits until all ran. */
  async seed(step: number, tasks: number, rate: number): Promise<PeerResult> {
    const leadMs = Math.max(5000, Math.ceil(tasks / 12) + 4000);
    const T0 = Date.now() + leadMs;
    const dueOf = (i: number) => T0 + Math.floor((i * 1000) / rate);
    await this.ask({ t: "record", step, expected: tasks, origin: T0 });
    const createMs = await this.add(step, tasks, dueOf);
    await sleep(Math.max(0, T0 - 300 - Date.now()));
    const u0 = await this.ask<NodeUsage>({ t: "usage" }); const s0 = serversCpu();
    const s = await this.ask<RecorderSummary & { done: boolean }>({ t: "wait", n: tasks, timeoutMs: dueOf(tasks - 1) - Date.now() + 30_000 });
    const u1 = await this.ask<NodeUsage>({ t: "usage" }); const sv = diffServers(s0, serversCpu());
    return { s, u0, u1, sv, createMs, tasks, rate };
  }
  async stop(): Promise<void> {
    if (this.child.exitCode === null) {
      await this.ask({ t: "stop" }, 30_000).catch(() => undefined);
      await sleep(100);
      if (this.child.exitCode === null) this.child.kill("SIGKILL");
    }
    await this.queue.obliterate({ force: true }).catch(() => undefined);
    await this.queue.close();
    // Whatever obliterate leaves (meta, markers): delete every key under the prefix.
    const r = new Redis(this.redisUrl);
    let cursor = "0";
    do {
      const [next, keys] = await r.scan(cursor, "MATCH", `${this.prefix}:*`, "COUNT", 1000);
      cursor = next;
      if (keys.length) await r.del(...keys);
    } while (cursor !== "0");
    r.disconnect();
  }
}

export async function runBullSeed(o: { tasks: number; rate: number; redisUrl: string; concurrency?: number }): Promise<PeerResult> {
  const b = new BullBench(o.redisUrl, o.concurrency ?? 1000);
  await b.start();
  try { return await b.seed(0, o.tasks, o.rate); } finally { await b.stop(); }
}

export interface SweepStep { rate: number; p99: number; lost: number; dup: number; achieved: number | null; pass: boolean }

/** The same bounded sweep as ax's max-rate: ×1.5 while passing, then bisect to within 10%. */
export async function runBullSweep(o: { start: number; windowS: number; budgetS: number; p99Limit: number; redisUrl: string; log: (...a: unknown[]) => void; concurrency?: number }):
  Promise<{ best: PeerResult | null; steps: SweepStep[] }> {
  const b = new BullBench(o.redisUrl, o.concurrency ?? 1000);
  await b.start();
  const steps: SweepStep[] = [];
  let best: PeerResult | null = null;
  try {
    const warm = sweepWarmUp(o.start, o.windowS);
    o.log(`bullmq max-rate warm-up: ${warm.tasks} jobs at ${warm.rate}/s (not measured)`);
    await b.seed(WARM_UP_STEP, warm.tasks, warm.rate);
    await sleep(1000);
    const t0 = Date.now();
    let lo = 0; let hi = Infinity; let rate = o.start; let step = 0;
    while ((Date.now() - t0) / 1000 < o.budgetS && step < 12) {
      const tasks = Math.round(rate * o.windowS);
      const r = await b.seed(step, tasks, rate);
      const pass = r.s.lost === 0 && r.s.duplicated === 0 && r.s.latencyMs.p99 <= o.p99Limit;
      const s = r.s;
      const achieved = s.runs > 1 && s.lastStartMs !== null && s.firstStartMs !== null && s.lastStartMs > s.firstStartMs ? Math.round((s.runs - 1) / ((s.lastStartMs - s.firstStartMs) / 1000)) : null;
      steps.push({ rate, p99: s.latencyMs.p99, lost: s.lost, dup: s.duplicated, achieved, pass });
      o.log(`bullmq max-rate step ${step}: ${rate}/s → p99 ${s.latencyMs.p99}ms lost ${s.lost} dup ${s.duplicated} ${pass ? "pass" : "FAIL"}`);
      if (pass) { lo = rate; if (!best || rate > best.rate) best = r; } else hi = rate;
      step++;
      const next = nextSweepRate(rate, lo, hi);
      if (next === null) break;
      rate = next;
      await sleep(1000);
    }
  } finally { await b.stop(); }
  return { best, steps };
}

// ---- the worker process -------------------------------------------------------------------------

async function workerMain(): Promise<void> {
  const send = (m: unknown) => process.send?.(m);
  let rec: Recorder | null = null;
  let step = -1;
  const worker = new Worker(process.env.BULL_QUEUE!, async (job: Job<{ s: number; i: number; due: number }>) => {
    const start = wallNow();
    if (rec && job.data.s === step) rec.record(job.data.i, job.data.due, start);
  }, { connection: redisConn(process.env.BULL_REDIS!), prefix: process.env.BULL_PREFIX!, concurrency: Number(process.env.BULL_CONCURRENCY ?? 1000),
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
