/**
 * ax benchmarks. `npm run bench -- <scenario|all> [options]`; prints ONE JSON line per scenario
 * (and one per peer row) on stdout, progress on stderr, and rewrites docs/BENCHMARKS.md and
 * docs/bench-lateness.svg from bench/results.json (the latest row of every scenario).
 *
 * Scenarios: seed-50k, seed-500k, max-rate, burst, idle-1m, create (see SCENARIOS below).
 * Options:
 *   --quick            scaled-down sizes (each scenario well under a minute)
 *   --tasks N          override the task count        --rate R   override the rate (seed-*)
 *   --no-peer          skip the BullMQ rows           --prof DIR write a CPU profile of the node
 *   --shards N (4)    --tick MS (20)                 --window S max-rate step length (10, quick 3)
 *   --budget S         max-rate sweep time bound (360, quick 60)
 *   --no-docs          do not touch docs/ or bench/results.json
 *   --docs-only        only rewrite docs/ from bench/results.json (and bench/analysis.md)
 *   --verbose          PostgreSQL counters and persister stats per step (stderr)
 *   --node-flags "..." extra Node/V8 flags for the node process; --event-flush MS executor event flush
 *   --series FILE      also write each row's per-second lateness series to FILE (JSON lines)
 *   --warmup N         seed-*: N more tasks due just before the measured ones, at the same rate,
 *                      not recorded (shows how much of the whole-run p99 is a cold node's first second)
 */
import { execSync } from "node:child_process";
import { appendFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { AxBench, WARMUP_PREFIX, pgTaskBytes, sleep, type AxBenchOptions, type NodeUsage } from "./harness.ts";
import { diffServers, serversCpu, type ServersCpu } from "./proc.ts";
import type { RecorderSummary, SeriesPoint } from "./recorder.ts";
import { runBullSeed, runBullSweep, type PeerResult } from "./peer-bullmq.ts";
import { writeReports, type ResultRow } from "./report.ts";
import { DueIndex } from "../actors/index.ts";
import { nextSweepRate, sweepWarmUp } from "./sweep.ts";

const argv = process.argv.slice(2);
const flag = (name: string) => argv.includes(`--${name}`);
const opt = (name: string): string | undefined => { const i = argv.indexOf(`--${name}`); return i >= 0 ? argv[i + 1] : undefined; };
const num = (name: string): number | undefined => { const v = opt(name); return v === undefined ? undefined : Number(v); };
const quick = flag("quick");
const warmup = num("warmup") ?? 0;
const verbose = flag("verbose");
const peer = !flag("no-peer");
const seriesFile = opt("series");
const log = (...a: unknown[]) => process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${a.map((x) => (typeof x === "string" ? x : JSON.stringify(x))).join(" ")}\n`);

const benchOpts: AxBenchOptions = {
  shards: num("shards") ?? 4,
  tickMs: num("tick") ?? 20,
  maxInFlight: num("max-in-flight") ?? 200_000,
  executorConcurrency: num("concurrency") ?? 4096,
  ...(num("event-flush") !== undefined ? { eventFlushMs: num("event-flush")! } : {}),
  cpuProfDir: opt("prof") ?? null,
  logLevel: opt("log") ?? "warn",
  nodeFlags: (opt("node-flags") ?? "").split(" ").filter(Boolean),
};

const r1 = (v: number) => Math.round(v * 10) / 10;
const r2 = (v: number) => Math.round(v * 100) / 100;

function row(scenario: string, tasks: number, rate: number | null, s: RecorderSummary | null, u0: NodeUsage, u1: NodeUsage, sv: ServersCpu, extra: Record<string, unknown> = {}): ResultRow {
  const achieved = s && s.runs > 1 && s.lastStartMs !== null && s.firstStartMs !== null && s.lastStartMs > s.firstStartMs
    ? Math.round((s.runs - 1) / ((s.lastStartMs - s.firstStartMs) / 1000)) : null;
  return {
    scenario, tasks, rate, achievedRate: achieved,
    latencyMs: s ? s.latencyMs : null, steadyLatencyMs: s ? s.steadyLatencyMs : null, lost: s ? s.lost : 0, duplicated: s ? s.duplicated : 0,
    nodeCpuS: r2(u1.cpuS - u0.cpuS), ...(u1.sysS !== undefined && u0.sysS !== undefined ? { nodeSysS: r2(u1.sysS - u0.sysS) } : {}),
    nodeRssMb: r1(Math.max(u1.rssMb, u0.rssMb)), serversCpuS: sv.total, serversCpu: sv,
    ...(s?.breakdownMs ? { breakdownMs: s.breakdownMs } : {}), ...extra,
  };
}

/** One seed run on a started bench: `tasks` one-shot tasks due from T0 on, `rate` per second. */
async function axSeed(b: AxBench, prefix: string, tasks: number, rate: number): Promise<{ s: RecorderSummary; u0: NodeUsage; u1: NodeUsage; sv: ServersCpu; createMs: number }> {
  const warmSpanMs = Math.ceil((warmup * 1000) / rate);
  const leadMs = Math.max(5000, Math.ceil((tasks + warmup) / 12) + 4000) + warmSpanMs;
  const T0 = Date.now() + leadMs;
  const dueOf = (i: number) => T0 + Math.floor((i * 1000) / rate);
  const rec = b.record(prefix, tasks, T0);
  // Warm-up runs: due just before T0 at the same rate, so the measured runs meet a node (and
  // servers) already running at that rate; not counted.
  if (warmup > 0) await b.bulkCreate(WARMUP_PREFIX, warmup, (i) => T0 - warmSpanMs + Math.floor((i * 1000) / rate));
  const cr = await b.bulkCreate(prefix, tasks, dueOf);
  if (Date.now() > T0 - 1000) log(`warning: creating ${tasks} tasks took ${Math.round(cr.ms)}ms, close to the lead of ${leadMs}ms`);
  await sleep(Math.max(0, T0 - 300 - Date.now()));
  log(`created ${tasks} tasks in ${Math.round(cr.ms)}ms; the first is due at ${new Date(T0).toISOString().slice(11, 23)}`);
  await b.profStart();
  const own0 = await b.pgOwnCpuS(); const me0 = process.cpuUsage();
  const u0 = await b.usage(); const s0 = serversCpu(); const pg0 = verbose ? await b.pgStats() : null;
  const lastDue = dueOf(tasks - 1);
  const done = await rec.waitFor(tasks, lastDue - Date.now() + 30_000);
  if (!done) log(`warning: only ${rec.distinct}/${tasks} ran within 30s after the last due time`);
  await sleep(1000); // a duplicate would show up now
  const u1 = await b.usage(); const sv = diffServers(s0, serversCpu());
  sv.pgOwn = Math.round((await b.pgOwnCpuS() - own0) * 100) / 100;
  const me = process.cpuUsage(me0); sv.executor = Math.round((me.user + me.system) / 1e4) / 100;
  const prof = await b.profStop(`${prefix.replace(/[^a-z0-9]/gi, "")}-${rate}`);
  if (prof) log(`profile: ${prof}`);
  if (pg0) {
    const pg1 = await b.pgStats();
    log("pg", Object.fromEntries(Object.entries(pg1).map(([k, v]) => [k, v - (pg0[k] ?? 0)])), "node", await b.nodeStatus().then((x) => (x as { persister?: unknown }).persister));
  }
  return { s: rec.summary(), u0, u1, sv, createMs: cr.ms };
}

async function withBench<T>(fn: (b: AxBench) => Promise<T>): Promise<T> {
  const b = await AxBench.start(benchOpts);
  try { return await fn(b); } finally { await b.stop(); }
}

type Emit = (r: ResultRow, series?: { ax?: SeriesPoint[]; peer?: SeriesPoint[] }) => void;

async function seedScenario(name: string, defTasks: number, defRate: number, emit: Emit): Promise<void> {
  const tasks = num("tasks") ?? (quick ? Math.round(defTasks / 10) : defTasks);
  const rate = num("rate") ?? defRate;
  log(`${name}: ${tasks} tasks at ${rate}/s`);
  const ax = await withBench(async (b) => axSeed(b, "t", tasks, rate));
  const axRow = row(name, tasks, rate, ax.s, ax.u0, ax.u1, ax.sv, { createPerSec: Math.round(tasks / (ax.createMs / 1000)) });
  let peerRow: ResultRow | null = null; let peerRes: PeerResult | null = null;
  if (peer) {
    log(`${name}: the same on BullMQ`);
    peerRes = await runBullSeed({ tasks, rate, redisUrl: process.env.AX_REDIS_URL ?? "redis://127.0.0.1:6379" });
    peerRow = row(name, tasks, rate, peerRes.s, peerRes.u0, peerRes.u1, peerRes.sv, { peer: "bullmq" });
    const p99 = axRow.latencyMs && peerRow.latencyMs ? r2(axRow.latencyMs.p99 / peerRow.latencyMs.p99) : null;
    peerRow.ratio = p99;
    const ax5 = axRow.steadyLatencyMs; const peer5 = peerRow.steadyLatencyMs;
    peerRow.ratios = { p99, steadyP99: ax5 && peer5 ? r2(ax5.p99 / peer5.p99) : null, p50: axRow.latencyMs && peerRow.latencyMs ? r2(axRow.latencyMs.p50 / peerRow.latencyMs.p50) : null,
      nodeCpuS: peerRow.nodeCpuS ? r2(axRow.nodeCpuS / peerRow.nodeCpuS) : null, serversCpuS: peerRow.serversCpuS ? r2(axRow.serversCpuS / peerRow.serversCpuS) : null };
  }
  emit(axRow, { ax: ax.s.series, ...(peerRes ? { peer: peerRes.s.series } : {}) });
  if (peerRow) emit(peerRow);
}

async function maxRateScenario(emit: Emit): Promise<void> {
  const windowS = num("window") ?? (quick ? 3 : 10);
  const budgetS = num("budget") ?? (quick ? 60 : 360);
  const p99Limit = 100;
  const start = num("rate") ?? (quick ? 4000 : 6000);
  log(`max-rate: sweep from ${start}/s, ${windowS}s per step, p99 <= ${p99Limit}ms, budget ${budgetS}s`);
  const steps: Array<{ rate: number; p99: number; lost: number; dup: number; achieved: number | null; pass: boolean }> = [];
  const bestBox: { v: { rowArgs: Parameters<typeof row>; s: RecorderSummary } | null } = { v: null };
  await withBench(async (b) => {
    // A fresh node is cold (JIT, first plans): a first step at full rate failed on that alone and
    // then capped the bisection. One unmeasured step at half the start rate first, as for BullMQ.
    const warm = sweepWarmUp(start, windowS);
    log(`max-rate warm-up: ${warm.tasks} tasks at ${warm.rate}/s (not measured)`);
    await axSeed(b, "w-", warm.tasks, warm.rate);
    await sleep(1000);
    const t0 = Date.now();
    let lo = 0; let hi = Infinity; let rate = start; let step = 0;
    while ((Date.now() - t0) / 1000 < budgetS && step < 12) {
      const tasks = Math.round(rate * windowS);
      const r = await axSeed(b, `s${step}-`, tasks, rate);
      const pass = r.s.lost === 0 && r.s.duplicated === 0 && r.s.latencyMs.p99 <= p99Limit;
      const rr = row("max-rate", tasks, rate, r.s, r.u0, r.u1, r.sv);
      steps.push({ rate, p99: r.s.latencyMs.p99, lost: r.s.lost, dup: r.s.duplicated, achieved: rr.achievedRate, pass });
      log(`max-rate step ${step}: ${rate}/s → p99 ${r.s.latencyMs.p99}ms lost ${r.s.lost} dup ${r.s.duplicated} ${pass ? "pass" : "FAIL"}`);
      if (pass) { lo = rate; if (!bestBox.v || rate > (bestBox.v.rowArgs[2] ?? 0)) bestBox.v = { rowArgs: ["max-rate", tasks, rate, r.s, r.u0, r.u1, r.sv], s: r.s }; }
      else hi = rate;
      step++;
      const next = nextSweepRate(rate, lo, hi);
      if (next === null) break;
      rate = next;
      await sleep(1000);
    }
  });
  const best = bestBox.v;
  const axRow = best ? row(...best.rowArgs) : row("max-rate", 0, 0, null, { cpuS: 0, rssMb: 0, heapUsedMb: 0, maxRssMb: 0 }, { cpuS: 0, rssMb: 0, heapUsedMb: 0, maxRssMb: 0 }, { postgres: 0, redis: 0, nats: 0, total: 0 });
  axRow.sweep = steps;
  axRow.p99LimitMs = p99Limit;
  emit(axRow, best ? { ax: best.s.series } : undefined);
  if (peer) {
    log("max-rate: the same sweep on BullMQ");
    const pr = await runBullSweep({ start, windowS, budgetS, p99Limit, redisUrl: process.env.AX_REDIS_URL ?? "redis://127.0.0.1:6379", log });
    const peerRow = pr.best ? row("max-rate", pr.best.tasks, pr.best.rate, pr.best.s, pr.best.u0, pr.best.u1, pr.best.sv, { peer: "bullmq" })
      : row("max-rate", 0, 0, null, { cpuS: 0, rssMb: 0, heapUsedMb: 0, maxRssMb: 0 }, { cpuS: 0, rssMb: 0, heapUsedMb: 0, maxRssMb: 0 }, { postgres: 0, redis: 0, nats: 0, total: 0 }, { peer: "bullmq" });
    peerRow.sweep = pr.steps;
    peerRow.ratio = axRow.rate && peerRow.rate ? r2(axRow.rate / peerRow.rate) : null;
    peerRow.ratios = { rate: peerRow.ratio, achievedRate: axRow.achievedRate && peerRow.achievedRate ? r2(axRow.achievedRate / peerRow.achievedRate) : null };
    emit(peerRow);
  }
}

async function burstScenario(emit: Emit): Promise<void> {
  const tasks = num("tasks") ?? (quick ? 10_000 : 100_000);
  log(`burst: ${tasks} tasks due at one instant`);
  await withBench(async (b) => {
    const leadMs = Math.max(5000, Math.ceil(tasks / 12) + 4000);
    const T0 = Date.now() + leadMs;
    const rec = b.record("t", tasks, T0);
    await b.bulkCreate("t", tasks, () => T0);
    await sleep(Math.max(0, T0 - 300 - Date.now()));
    const u0 = await b.usage(); const s0 = serversCpu();
    const done = await rec.waitFor(tasks, 120_000);
    if (!done) log(`warning: only ${rec.distinct}/${tasks} ran within 120s`);
    await sleep(1000);
    const u1 = await b.usage(); const sv = diffServers(s0, serversCpu());
    const s = rec.summary();
    emit(row("burst", tasks, null, s, u0, u1, sv, { lastStartMs: s.lastStartMs !== null ? Math.round(s.lastStartMs - T0) : null,
      achievedRate: s.lastStartMs !== null ? Math.round(s.runs / ((s.lastStartMs - T0) / 1000)) : null }), { ax: s.series });
  });
}

async function idleScenario(emit: Emit): Promise<void> {
  const tasks = num("tasks") ?? (quick ? 50_000 : 1_000_000);
  log(`idle-1m: ${tasks} tasks due next week`);
  await withBench(async (b) => {
    const base = await b.gcUsage();
    const due = new DueIndex(b.config.redis, b.ns);
    const redisMem = async () => Number(/used_memory:(\d+)/.exec(await due.redis.info("memory"))?.[1] ?? 0);
    const redis0 = await redisMem();
    const week = Date.now() + 7 * 86_400_000;
    const s0 = serversCpu();
    const cr = await b.bulkCreate("t", tasks, (i) => week + (i % 86_400) * 1000);
    await sleep(quick ? 4000 : 8000); // a few refill rounds
    const after = await b.gcUsage();
    const sv = diffServers(s0, serversCpu());
    const redis1 = await redisMem();
    await due.close();
    const pgBytes = await pgTaskBytes(b.config);
    const bytes = (after.rssMb - base.rssMb) * 1048576 / tasks;
    emit({
      scenario: "idle-1m", tasks, rate: null, achievedRate: Math.round(tasks / (cr.ms / 1000)), latencyMs: null, lost: 0, duplicated: 0,
      nodeCpuS: r2(after.cpuS - base.cpuS), nodeRssMb: r1(after.rssMb), serversCpuS: sv.total, serversCpu: sv,
      nodeRssBaseMb: r1(base.rssMb), nodeHeapUsedMb: r1(after.heapUsedMb), nodeMaxRssMb: r1(after.maxRssMb),
      bytesPerTask: { node: Math.round(bytes), redis: Math.round((redis1 - redis0) / tasks), postgres: Math.round(pgBytes / tasks) },
    });
  });
}

async function createScenario(emit: Emit): Promise<void> {
  const tasks = num("tasks") ?? (quick ? 30_000 : 300_000);
  log(`create: ${tasks} tasks through task.bulkCreate`);
  await withBench(async (b) => {
    const week = Date.now() + 7 * 86_400_000;
    await b.profStart();
    const u0 = await b.usage(); const s0 = serversCpu();
    const cr = await b.bulkCreate("t", tasks, (i) => week + i);
    const u1 = await b.usage(); const sv = diffServers(s0, serversCpu());
    const prof = await b.profStop(`create-${tasks}`);
    if (prof) log(`node CPU profile: ${prof}`);
    const sorted = [...cr.callMs].sort((a, c) => a - c);
    const at = (q: number) => r1(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!);
    const rate = Math.round(tasks / (cr.ms / 1000));
    emit({
      scenario: "create", tasks, rate, achievedRate: rate, latencyMs: { p50: at(0.5), p90: at(0.9), p99: at(0.99), max: r1(sorted[sorted.length - 1]!) },
      lost: 0, duplicated: 0, nodeCpuS: r2(u1.cpuS - u0.cpuS), nodeRssMb: r1(Math.max(u0.rssMb, u1.rssMb)), serversCpuS: sv.total, serversCpu: sv,
      perCall: 5000, note: "latencyMs = round trip of one task.bulkCreate call of 5000 specs",
    });
  });
}

const SCENARIOS: Record<string, (emit: Emit) => Promise<void>> = {
  "seed-50k": (e) => seedScenario("seed-50k", 50_000, 835, e),
  "seed-500k": (e) => seedScenario("seed-500k", 500_000, 8200, e),
  "max-rate": maxRateScenario,
  burst: burstScenario,
  "idle-1m": idleScenario,
  create: createScenario,
};

async function main(): Promise<void> {
  if (flag("docs-only")) { // regenerate docs/ from bench/results.json
    writeReports([], { date: new Date().toISOString(), commit: "", machine: { nproc: cpus().length, memoryGb: Math.round(totalmem() / 1024 ** 3 * 10) / 10, cpu: cpus()[0]?.model ?? "?" } });
    process.exit();
  }
  const BOOLEAN = new Set(["--quick", "--no-peer", "--no-docs", "--docs-only", "--verbose"]);
  const which = argv.find((a, i) => !a.startsWith("--") && (i === 0 || !argv[i - 1]!.startsWith("--") || BOOLEAN.has(argv[i - 1]!))) ?? "all";
  const names = which === "all" ? Object.keys(SCENARIOS) : which.split(",");
  for (const n of names) if (!SCENARIOS[n]) { process.stderr.write(`unknown scenario ${n}; one of ${Object.keys(SCENARIOS).join(", ")}, all\n`); process.exit(2); }
  const commit = (() => { try { return execSync("git rev-parse --short HEAD", { encoding: "utf8" }).trim(); } catch { return "unknown"; } })();
  const machine = { nproc: cpus().length, memoryGb: Math.round(totalmem() / 1024 ** 3 * 10) / 10, cpu: cpus()[0]?.model ?? "?" };
  const date = new Date().toISOString();
  const rows: Array<{ row: ResultRow; series?: { ax?: SeriesPoint[]; peer?: SeriesPoint[] } }> = [];
  const emit: Emit = (r, series) => {
    const out = { ...r, quick, shards: benchOpts.shards, tickMs: benchOpts.tickMs };
    process.stdout.write(JSON.stringify(out) + "\n");
    rows.push({ row: out, ...(series ? { series } : {}) });
    if (seriesFile && series) appendFileSync(seriesFile, JSON.stringify({ scenario: out.scenario, ...series }) + "\n");
  };
  for (const n of names) {
    try { await SCENARIOS[n]!(emit); } catch (e) { log(`${n} failed: ${(e as Error).stack ?? e}`); process.exitCode = 1; }
  }
  if (!flag("no-docs") && rows.length) writeReports(rows, { date, commit, machine });
  process.exit();
}

await main();
