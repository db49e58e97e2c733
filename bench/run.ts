/**
 * ax benchmarks. `npm run bench -- <scenario|all> [options]`; prints ONE JSON line per scenario
 * (and one per peer row) on stdout, progress on stderr, and rewrites docs/BENCHMARKS.md and
 * docs/bench-lateness.svg from bench/results.json (the latest row of every scenario).
 *
 * Scenarios: seed-50k, seed-500k, max-rate, burst, idle-1m, create, shards (see SCENARIOS below).
 * ax runs at the product defaults (what `ax node` uses with no flags: 64 shards, 20 ms tick,
 * in-flight bound 20000; one node, one executor instance of concurrency 100); BullMQ on its own
 * redis-server with hz 100, one worker of concurrency 100. See docs/BENCHMARKS.md, "Method".
 * Options:
 *   --quick            scaled-down sizes (each scenario well under a minute)
 *   --no-peer          skip the BullMQ rows           --prof DIR write a CPU profile of the node
 *   --peer-hz 10       also a BullMQ row on a redis-server at that hz (labelled; 100 is the main peer)
 *   --warmup N         unmeasured runs before the measured ones, ax and BullMQ alike (20000, quick 2000)
 *   --no-docs          do not touch docs/ or bench/results.json
 *   --docs-only        only rewrite docs/ from bench/results.json (and bench/analysis.md)
 *   --verbose          PostgreSQL counters and persister stats per step (stderr)
 *   --series FILE      also write each row's per-second lateness series to FILE (JSON lines)
 *   --lead MS          least time from the start of creation to the first due time (5000; raise it on a busy box)
 *   --xcheck-tolerance MS  how far p50/p99 may be from the runs table's own figures (20)
 * Exploration (rows are labelled with what differs and never feed the table or the targets):
 *   --shards N  --tick MS  --max-in-flight N  --concurrency N (executor)  --event-flush MS
 *   --node-flags "..."  --env AX_NAME=value (a node setting; repeatable)  --tasks N  --rate R  --warmup N (other than the default)
 *   --window S (max-rate step length; 10, quick 3)  --budget S (max-rate time bound; 360, quick 60)
 */
import { execSync } from "node:child_process";
import { appendFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { AxBench, CrossCheckError, RefusedRow, WARMUP_PREFIX, isExploration, pgTaskBytes, sleep, type AxBenchOptions, type NodeUsage } from "./harness.ts";
import { diffServers, serversCpu, type ServersCpu } from "./proc.ts";
import { cpuWindow, type RecorderSummary, type SeriesPoint } from "./recorder.ts";
import type { CrossCheckResult } from "./crosscheck.ts";
import { PEER_CONCURRENCY, runBullBurst, runBullSeed, runBullSweep } from "./peer-bullmq.ts";
import { METHOD, writeReports, type ResultRow } from "./report.ts";
import { DueIndex } from "../actors/index.ts";
import { ENV_DEFAULTS, parseDuration } from "../common/index.ts";
import { RateSearch, sweepWarmUp } from "./sweep.ts";

const argv = process.argv.slice(2);
if (argv.includes("--help") || argv.includes("-h")) {
  // The usage is this file's header: `npm run bench -- --help` once ran every scenario (37 minutes).
  const { readFileSync } = await import("node:fs");
  const header = readFileSync(new URL(import.meta.url), "utf8").split("*/")[0]!.replace(/^\/\*\*\n/, "").replace(/^ \* ?/gm, "");
  process.stdout.write(header);
  process.exit(0);
}
const flag = (name: string) => argv.includes(`--${name}`);
const opt = (name: string): string | undefined => { const i = argv.indexOf(`--${name}`); return i >= 0 ? argv[i + 1] : undefined; };
const num = (name: string): number | undefined => { const v = opt(name); return v === undefined ? undefined : Number(v); };
const quick = flag("quick");
const DEFAULT_WARMUP = quick ? 2000 : 20_000;
const warmup = num("warmup") ?? DEFAULT_WARMUP;
/**
 * The least time between the start of creation and the first due time (ms). Creation must end
 * before it or the row is refused; a busy machine needs more. It changes nothing measured (a
 * task due beyond the wheel's horizon waits in Redis either way).
 */
const minLeadMs = num("lead") ?? 5000;
const verbose = flag("verbose");
const peer = !flag("no-peer");
/** BullMQ rows: the tuned peer (hz 100) and, with --peer-hz H, one more on a Redis at that hz. */
const peerVariants: Array<{ hz: number; label: string }> = [{ hz: 100, label: "bullmq" }, ...(num("peer-hz") !== undefined && num("peer-hz") !== 100 ? [{ hz: num("peer-hz")!, label: `bullmq-hz${num("peer-hz")}` }] : [])];
const seriesFile = opt("series");
const log = (...a: unknown[]) => process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${a.map((x) => (typeof x === "string" ? x : JSON.stringify(x))).join(" ")}\n`);

/**
 * The executor instance's concurrency is the user's choice, as BullMQ's worker concurrency is;
 * both sides use 100 (the SDK's own default is 64).
 */
const EXECUTOR_CONCURRENCY = PEER_CONCURRENCY;
const nodeFlags = (opt("node-flags") ?? "").split(" ").filter(Boolean);
/** `--env K=V` (repeatable): a node setting for an exploration (AX_TASK_WRITE_DEFER=0s, say), labelled. */
const nodeEnv: Record<string, string> = {};
argv.forEach((a, i) => {
  if (a !== "--env") return;
  const m = /^(AX_[A-Z0-9_]+)=(.*)$/.exec(argv[i + 1] ?? "");
  if (!m) { process.stderr.write(`--env takes AX_NAME=value, got ${JSON.stringify(argv[i + 1] ?? null)}\n`); process.exit(2); }
  nodeEnv[m[1]!] = m[2]!;
});
const benchOpts: AxBenchOptions = {
  ...(num("shards") !== undefined ? { shards: num("shards")! } : {}),
  ...(num("tick") !== undefined ? { tickMs: num("tick")! } : {}),
  ...(num("max-in-flight") !== undefined ? { maxInFlight: num("max-in-flight")! } : {}),
  executorConcurrency: num("concurrency") ?? EXECUTOR_CONCURRENCY,
  ...(num("event-flush") !== undefined ? { eventFlushMs: num("event-flush")! } : {}),
  cpuProfDir: opt("prof") ?? null,
  ...(nodeFlags.length ? { nodeFlags } : {}),
  ...(Object.keys(nodeEnv).length ? { extraEnv: nodeEnv } : {}),
  crossCheckToleranceMs: num("xcheck-tolerance") ?? 20,
};
const DEFAULT_SHARDS = Number(ENV_DEFAULTS.AX_SHARDS);
const DEFAULT_TICK_MS = parseDuration("AX_TICK", ENV_DEFAULTS.AX_TICK!);

/** What makes this invocation's rows an exploration, in words (empty: the documented method). */
function explorationOf(o: AxBenchOptions): string[] {
  const out: string[] = [];
  if (o.shards !== undefined && o.shards !== DEFAULT_SHARDS) out.push(`${o.shards} shards`);
  if (o.tickMs !== undefined && o.tickMs !== DEFAULT_TICK_MS) out.push(`tick ${o.tickMs} ms`);
  if (o.maxInFlight !== undefined) out.push(`max in flight ${o.maxInFlight}`);
  if (o.executorConcurrency !== EXECUTOR_CONCURRENCY) out.push(`executor concurrency ${o.executorConcurrency}`);
  if (o.eventFlushMs !== undefined) out.push(`event flush ${o.eventFlushMs} ms`);
  if (o.nodeFlags?.length) out.push(`node flags ${o.nodeFlags.join(" ")}`);
  for (const [k, v] of Object.entries(o.extraEnv ?? {})) out.push(`${k}=${v}`);
  if (isExploration(o) && !out.length) out.push("non-default node settings");
  return out;
}
const runExploration = [
  ...explorationOf(benchOpts),
  ...(num("tasks") !== undefined ? [`tasks ${num("tasks")}`] : []),
  ...(num("rate") !== undefined ? [`rate ${num("rate")}`] : []),
  ...(warmup !== DEFAULT_WARMUP ? [`warm-up ${warmup}`] : []),
  ...(num("window") !== undefined ? [`window ${num("window")} s`] : []),
  ...(num("budget") !== undefined ? [`budget ${num("budget")} s`] : []),
];

const r1 = (v: number) => Math.round(v * 10) / 10;
const r2 = (v: number) => Math.round(v * 100) / 100;
const ZERO: NodeUsage = { cpuS: 0, rssMb: 0, heapUsedMb: 0, maxRssMb: 0 };
const NO_SERVERS: ServersCpu = { postgres: 0, redis: 0, nats: 0, total: 0 };

/**
 * CPU per run over the measured window, all processes: the node (BullMQ: the worker), PostgreSQL
 * (this namespace's own backends when known), Redis, NATS and the executor (the bench process).
 * ax's Redis and NATS are the machine's shared servers (other work on the box counts too); the
 * peer's Redis is its own instance.
 */
function cpuPerRun(s: RecorderSummary | null, u0: NodeUsage, u1: NodeUsage, sv: ServersCpu, cpuRuns?: number): Record<string, unknown> {
  if (!s || !s.runs) return {};
  const runs = cpuRuns ?? s.runs;
  const us = (cpuS: number) => r1((cpuS * 1e6) / runs);
  const parts = { node: us(u1.cpuS - u0.cpuS), postgres: us(sv.pgOwn ?? sv.postgres), redis: us(sv.redis), nats: us(sv.nats), executor: us(sv.executor ?? 0) };
  return { cpuUsPerRun: r1(parts.node + parts.postgres + parts.redis + parts.nats + parts.executor), cpuUsPerRunParts: parts };
}

function row(scenario: string, tasks: number, rate: number | null, s: RecorderSummary | null, u0: NodeUsage, u1: NodeUsage, sv: ServersCpu, extra: Record<string, unknown> = {}, cpuRuns?: number): ResultRow {
  const achieved = s && s.runs > 1 && s.lastStartMs !== null && s.firstStartMs !== null && s.lastStartMs > s.firstStartMs
    ? Math.round((s.runs - 1) / ((s.lastStartMs - s.firstStartMs) / 1000)) : null;
  return {
    scenario, tasks, rate, achievedRate: achieved,
    latencyMs: s ? s.latencyMs : null, steadyLatencyMs: s ? s.steadyLatencyMs : null, lost: s ? s.lost : 0, duplicated: s ? s.duplicated : 0, early: s ? s.early : 0,
    nodeCpuS: r2(u1.cpuS - u0.cpuS), ...(u1.sysS !== undefined && u0.sysS !== undefined ? { nodeSysS: r2(u1.sysS - u0.sysS) } : {}),
    nodeRssMb: r1(Math.max(u1.rssMb, u0.rssMb)), serversCpuS: sv.total, serversCpu: sv, ...cpuPerRun(s, u0, u1, sv, cpuRuns),
    ...(s?.breakdownMs ? { breakdownMs: s.breakdownMs } : {}), ...extra,
  };
}

/** The cross-check's figures as a row carries them. */
const xcFields = (x: CrossCheckResult) => ({ crossCheck: { runsRows: x.rows, started: x.started, refused: x.refused, redated: x.redated, afterWindow: x.afterWindow,
  startGapP99Ms: x.startGapP99Ms, maxStartGapMs: x.maxStartGapMs, tableP50: x.tableLatencyMs?.p50 ?? null, tableP99: x.tableLatencyMs?.p99 ?? null } });

/**
 * A step whose row is to be printed: its tasks were all created before the first was due (else the
 * measured window missed the start of the firing), and the runs table agrees. Otherwise the
 * scenario ends with the reason (RefusedRow).
 */
function agreed(x: { xc: CrossCheckResult | CrossCheckError; createdLateMs: number; createMs: number }, what: string): CrossCheckResult {
  if (x.createdLateMs > 0) throw new RefusedRow(`${what}: creating the tasks took ${Math.round(x.createMs)} ms and ended ${x.createdLateMs} ms after the first was due; the machine is too busy for this lead time`);
  if (x.xc instanceof CrossCheckError) throw x.xc;
  return x.xc;
}

/** A peer step whose jobs were not all added before the first was due is refused, as ax's. */
function peerAgreed(p: { createdLateMs: number; createMs: number }, what: string): void {
  if (p.createdLateMs > 0) throw new RefusedRow(`${what}: adding the jobs took ${Math.round(p.createMs)} ms and ended ${p.createdLateMs} ms after the first was due; the machine is too busy for this lead time`);
}

interface AxStep {
  s: RecorderSummary; u0: NodeUsage; u1: NodeUsage; sv: ServersCpu; createMs: number; xc: CrossCheckResult | CrossCheckError;
  /** T0: the first measured due time */ dueMs: number;
  /** How long after T0 the last task was created (0: in time). */ createdLateMs: number;
  /** The runs the CPU window holds: the measured ones and the warm-up's. */ cpuRuns: number;
}

/**
 * One measured step on a started bench: `tasks` one-shot tasks due at `dueOf(T0, i)`, after
 * `warm` unmeasured ones due just before T0 at `warmRate`/s (`warmGapMs` before T0 at the latest),
 * so the measured runs meet a node and servers already running. Waits until every measured task
 * ran (or `graceMs` after the last due time), then cross-checks with the runs table.
 */
async function axStep(b: AxBench, prefix: string, tasks: number, dueOf: (T0: number, i: number) => number,
  o: { warm: number; warmRate: number; warmGapMs?: number; graceMs?: number }): Promise<AxStep> {
  const warmSpanMs = o.warm > 0 ? Math.ceil((o.warm * 1000) / o.warmRate) + (o.warmGapMs ?? 0) : 0;
  const leadMs = Math.max(minLeadMs, Math.ceil((tasks + o.warm) / 12) + 4000) + warmSpanMs;
  const T0 = Date.now() + leadMs;
  const due = (i: number) => dueOf(T0, i);
  const rec = b.record(prefix, tasks, T0, due);
  const warmDue = (i: number) => T0 - warmSpanMs + Math.floor((i * 1000) / o.warmRate);
  if (o.warm > 0) await b.bulkCreate(WARMUP_PREFIX, o.warm, warmDue);
  const cr = await b.bulkCreate(prefix, tasks, due);
  const createdLateMs = Math.max(0, Date.now() - T0);
  if (Date.now() > T0 - 1000) log(`warning: creating ${tasks} tasks took ${Math.round(cr.ms)}ms, close to the lead of ${leadMs}ms`);
  // CPU from CPU_AHEAD_MS before T0: what the node does ahead of the due times (a spread burst is
  // recorded up to 10 s before it) counts, and so do the warm-up's runs due in the window.
  const heap0 = process.memoryUsage().heapUsed;
  const cw = cpuWindow(Date.now(), T0, o.warm, warmDue);
  await sleep(Math.max(0, cw.fromMs - Date.now()));
  const own0 = await b.pgOwnCpuS(); const me0 = process.cpuUsage(); const u0 = await b.usage(); const s0 = serversCpu();
  await sleep(Math.max(0, T0 - 300 - Date.now()));
  // The executor runs in this process: what it holds ahead of T0 shows in this heap.
  if (verbose) log(`heap of the bench process (recorder and executor): ${Math.round(heap0 / 1e6)} MB after creation, ${Math.round(process.memoryUsage().heapUsed / 1e6)} MB 300 ms before T0`);
  log(`created ${tasks} tasks in ${Math.round(cr.ms)}ms; the first is due at ${new Date(T0).toISOString().slice(11, 23)}`);
  await b.profStart();
  const pg0 = verbose ? await b.pgStats() : null;
  const graceMs = o.graceMs ?? 30_000;
  // --verbose: once a second, the node's limiter (runs in flight, tasks waiting for a place), its
  // shards' fired/finished counters and the persister's last batch, beside the runs seen so far.
  const sampler = verbose ? setInterval(() => {
    void b.nodeStatus().then((x) => {
      const y = x as { limiter?: unknown; shardTotals?: Record<string, number>; persister?: { batches: number; lastBatchMs: number } };
      log("sample", JSON.stringify({ limiter: y.limiter, fired: y.shardTotals?.fired, finished: y.shardTotals?.finished, waited: y.shardTotals?.waited, deferredWrites: y.shardTotals?.deferredWrites, flushedWrites: y.shardTotals?.flushedWrites,
        rounds: y.shardTotals?.rounds, mails: y.shardTotals?.mails,
        batches: y.persister?.batches, lastBatchMs: Math.round(y.persister?.lastBatchMs ?? 0), ran: rec.distinct }));
    }, () => undefined);
  }, 1000) : null;
  const done = await rec.waitFor(tasks, due(tasks - 1) - Date.now() + graceMs).finally(() => { if (sampler) clearInterval(sampler); });
  if (!done) log(`warning: only ${rec.distinct}/${tasks} ran within ${graceMs / 1000}s after the last due time`);
  await sleep(1000); // a duplicate would show up now
  rec.freeze();
  const u1 = await b.usage(); const sv = diffServers(s0, serversCpu());
  sv.pgOwn = Math.round((await b.pgOwnCpuS() - own0) * 100) / 100;
  const me = process.cpuUsage(me0); sv.executor = Math.round((me.user + me.system) / 1e4) / 100;
  const prof = await b.profStop(`${prefix.replace(/[^a-z0-9]/gi, "")}-${tasks}`);
  if (prof) log(`profile: ${prof}`);
  if (pg0) {
    const pg1 = await b.pgStats();
    log("pg", Object.fromEntries(Object.entries(pg1).map(([k, v]) => [k, v - (pg0[k] ?? 0)])), "node", await b.nodeStatus().then((x) => { const y = x as { persister?: unknown; limiter?: unknown; shardTotals?: unknown }; return { persister: y.persister, limiter: y.limiter, shards: y.shardTotals }; }));
    log("executor", b.executor.stats);
  }
  const s = rec.summary();
  // The runs table trails the handlers by the event path (executor flush, the node's round): at
  // thousands of runs a second the last second of starts may not be written yet. Read again
  // until it agrees or 15 s pass; only then is a disagreement a finding.
  const check = () => b.crossCheck(prefix).catch((e: unknown) => { if (e instanceof CrossCheckError) return e; throw e; });
  let xc = await check();
  for (let attempt = 0; attempt < 15 && xc instanceof CrossCheckError; attempt++) { await sleep(1000); xc = await check(); }
  if (xc instanceof CrossCheckError) log(`cross-check of ${prefix}: ${xc.message}`);
  return { s, u0, u1, sv, createMs: cr.ms, xc, dueMs: T0, createdLateMs, cpuRuns: s.runs + cw.warmRuns };
}

/** A seed step: `tasks` due from T0 on at `rate`/s, warmed with `warm` runs at the same rate. */
const axSeed = (b: AxBench, prefix: string, tasks: number, rate: number, warm = 0) =>
  axStep(b, prefix, tasks, (T0, i) => T0 + Math.floor((i * 1000) / rate), { warm, warmRate: rate });

async function withBench<T>(opts: AxBenchOptions, fn: (b: AxBench) => Promise<T>): Promise<T> {
  const b = await AxBench.start(opts);
  try { return await fn(b); } catch (e) {
    if (!(e instanceof RefusedRow)) log(`the node's log (last lines):\n${b.logTail()}`);
    throw e;
  } finally { await b.stop(); }
}

type Emit = (r: ResultRow, series?: { ax?: SeriesPoint[]; peer?: SeriesPoint[] }) => void;

/** ax ÷ peer ratios of two seed-like rows. */
function seedRatios(a: ResultRow, p: ResultRow): Record<string, number | null> {
  const q = (x: number | null | undefined, y: number | null | undefined) => (x !== null && x !== undefined && y ? r2(x / y) : null);
  return {
    p99: q(a.latencyMs?.p99, p.latencyMs?.p99), steadyP99: q(a.steadyLatencyMs?.p99, p.steadyLatencyMs?.p99), p50: q(a.latencyMs?.p50, p.latencyMs?.p50),
    nodeCpuS: q(a.nodeCpuS, p.nodeCpuS), serversCpuS: q(a.serversCpuS, p.serversCpuS), cpuUsPerRun: q(a.cpuUsPerRun as number | undefined, p.cpuUsPerRun as number | undefined),
  };
}

const peerExtra = (label: string, hz: number, warm = warmup) => ({ peer: label, peerConfig: { redisHz: hz, workers: 1, concurrency: PEER_CONCURRENCY, warmup: warm } });

/** The seed-500k ax row of this invocation at the product defaults (the shards scenario reuses it). */
let seed500Default: { row: ResultRow; series: SeriesPoint[] } | null = null;

async function seedScenario(name: string, defTasks: number, defRate: number, emit: Emit): Promise<void> {
  const tasks = num("tasks") ?? (quick ? Math.round(defTasks / 10) : defTasks);
  const rate = num("rate") ?? defRate;
  log(`${name}: ${tasks} tasks at ${rate}/s, after ${warmup} unmeasured`);
  const ax = await withBench(benchOpts, (b) => axSeed(b, "t", tasks, rate, warmup));
  const axRow = row(name, tasks, rate, ax.s, ax.u0, ax.u1, ax.sv, { createPerSec: Math.round(tasks / (ax.createMs / 1000)), ...xcFields(agreed(ax, `${name} (ax)`)) }, ax.cpuRuns);
  if (name === "seed-500k" && !runExploration.length) seed500Default = { row: axRow, series: ax.s.series };
  const peers: Array<{ row: ResultRow; series: SeriesPoint[] }> = [];
  if (peer) for (const v of peerVariants) {
    log(`${name}: the same on BullMQ (redis-server hz ${v.hz})`);
    const pr = await runBullSeed({ tasks, rate, warmup, hz: v.hz, minLeadMs });
    peerAgreed(pr, `${name} (${v.label})`);
    const peerRow = row(name, tasks, rate, pr.s, pr.u0, pr.u1, pr.sv, peerExtra(v.label, v.hz), pr.cpuRuns);
    peerRow.ratios = seedRatios(axRow, peerRow);
    peerRow.ratio = (peerRow.ratios as Record<string, number | null>).p99 ?? null;
    peers.push({ row: peerRow, series: pr.s.series });
  }
  emit(axRow, { ax: ax.s.series, ...(peers[0] ? { peer: peers[0].series } : {}) });
  for (const p of peers) emit(p.row);
}

async function maxRateScenario(emit: Emit): Promise<void> {
  const windowS = num("window") ?? (quick ? 3 : 10);
  const budgetS = num("budget") ?? (quick ? 60 : 360);
  const p99Limit = 100;
  const start = num("rate") ?? (quick ? 4000 : 6000);
  log(`max-rate: sweep from ${start}/s, ${windowS}s per step, p99 <= ${p99Limit}ms, budget ${budgetS}s`);
  const steps: Array<{ rate: number; p99: number; lost: number; dup: number; early: number; achieved: number | null; pass: boolean; crossCheck: boolean }> = [];
  const bestBox: { v: { rate: number; r: ResultRow; s: RecorderSummary } | null } = { v: null };
  await withBench(benchOpts, async (b) => {
    // A fresh node is cold (JIT, first plans): a first step at full rate failed on that alone and
    // then capped the bisection. One unmeasured step at half the start rate first, as for BullMQ.
    const warm = sweepWarmUp(start, windowS);
    log(`max-rate warm-up: ${warm.tasks} tasks at ${warm.rate}/s (not measured)`);
    await axSeed(b, "w-", warm.tasks, warm.rate);
    await sleep(1000);
    const t0 = Date.now();
    const search = new RateSearch(start); let step = 0;
    while ((Date.now() - t0) / 1000 < budgetS && step < 16) {
      const rate = search.rate;
      const tasks = Math.round(rate * windowS);
      const r = await axSeed(b, `s${step}-`, tasks, rate);
      const agrees = !(r.xc instanceof CrossCheckError);
      const pass = r.s.lost === 0 && r.s.duplicated === 0 && r.s.early === 0 && r.s.latencyMs.p99 <= p99Limit;
      // A passing step whose figures the runs table contradicts cannot be the row: stop here.
      if (pass) agreed(r, `max-rate step ${step} (ax)`);
      const rr = row("max-rate", tasks, rate, r.s, r.u0, r.u1, r.sv, agrees ? xcFields(r.xc as CrossCheckResult) : {}, r.cpuRuns);
      steps.push({ rate, p99: r.s.latencyMs.p99, lost: r.s.lost, dup: r.s.duplicated, early: r.s.early, achieved: rr.achievedRate, pass, crossCheck: agrees });
      log(`max-rate step ${step}: ${rate}/s → p99 ${r.s.latencyMs.p99}ms lost ${r.s.lost} dup ${r.s.duplicated} early ${r.s.early}${agrees ? "" : " (runs table disagrees)"} ${pass ? "pass" : "FAIL"}`);
      step++;
      if (pass && (!bestBox.v || rate > bestBox.v.rate)) bestBox.v = { rate, r: rr, s: r.s };
      const next = search.next(pass, r.s.lost === 0 && r.s.duplicated === 0 && r.s.early === 0);
      if (next === null) break;
      if (next === "again") log(`max-rate: ${rate}/s once more (failed on lateness alone)`);
      await sleep(1000);
    }
  });
  const best = bestBox.v;
  const axRow = best ? best.r : row("max-rate", 0, 0, null, ZERO, ZERO, NO_SERVERS);
  axRow.sweep = steps;
  axRow.p99LimitMs = p99Limit;
  axRow.warmup = sweepWarmUp(start, windowS).tasks; // the sweep's own unmeasured step, not --warmup
  emit(axRow, best ? { ax: best.s.series } : undefined);
  if (peer) {
    log("max-rate: the same sweep on BullMQ (redis-server hz 100)");
    const v = peerVariants[0]!;
    const pr = await runBullSweep({ start, windowS, budgetS, p99Limit, hz: v.hz, log, minLeadMs });
    const warmTasks = sweepWarmUp(start, windowS).tasks;
    const peerRow = pr.best ? row("max-rate", pr.best.tasks, pr.best.rate, pr.best.s, pr.best.u0, pr.best.u1, pr.best.sv, peerExtra(v.label, v.hz, warmTasks), pr.best.cpuRuns)
      : row("max-rate", 0, 0, null, ZERO, ZERO, NO_SERVERS, peerExtra(v.label, v.hz, warmTasks));
    peerRow.sweep = pr.steps;
    peerRow.ratio = axRow.rate && peerRow.rate ? r2(axRow.rate / peerRow.rate) : null;
    peerRow.ratios = { rate: peerRow.ratio, achievedRate: axRow.achievedRate && peerRow.achievedRate ? r2(axRow.achievedRate / peerRow.achievedRate) : null,
      cpuUsPerRun: axRow.cpuUsPerRun && peerRow.cpuUsPerRun ? r2((axRow.cpuUsPerRun as number) / (peerRow.cpuUsPerRun as number)) : null };
    emit(peerRow);
  }
}

/** The rate of the warm-up runs before a burst (the seed-500k rate), ending 2 s before the burst. */
const BURST_WARM_RATE = 8200;

/** burst: `tasks` due at one instant; the figure is the last handler start after that instant. */
function burstRow(tasks: number, x: { s: RecorderSummary; u0: NodeUsage; u1: NodeUsage; sv: ServersCpu; dueMs: number; cpuRuns: number }, extra: Record<string, unknown>): ResultRow {
  const { s, dueMs } = x;
  return row("burst", tasks, null, s, x.u0, x.u1, x.sv, { lastStartMs: s.lastStartMs !== null ? Math.round(s.lastStartMs - dueMs) : null,
    ...extra, achievedRate: s.lastStartMs !== null && s.lastStartMs > dueMs ? Math.round(s.runs / ((s.lastStartMs - dueMs) / 1000)) : null }, x.cpuRuns);
}

async function burstScenario(emit: Emit): Promise<void> {
  const tasks = num("tasks") ?? (quick ? 10_000 : 100_000);
  log(`burst: ${tasks} tasks due at one instant, after ${warmup} unmeasured`);
  const ax = await withBench(benchOpts, (b) => axStep(b, "t", tasks, (T0) => T0, { warm: warmup, warmRate: BURST_WARM_RATE, warmGapMs: 2000, graceMs: 120_000 }));
  const axRow = burstRow(tasks, ax, xcFields(agreed(ax, "burst (ax)")));
  const peers: ResultRow[] = [];
  if (peer) for (const v of peerVariants) {
    log(`burst: the same on BullMQ (redis-server hz ${v.hz})`);
    const pr = await runBullBurst({ tasks, warmup, warmRate: BURST_WARM_RATE, hz: v.hz, minLeadMs });
    peerAgreed(pr, `burst (${v.label})`);
    const pRow = burstRow(tasks, pr, peerExtra(v.label, v.hz));
    const a = axRow.lastStartMs as number | null; const p = pRow.lastStartMs as number | null;
    pRow.ratio = a !== null && p ? r2(a / p) : null;
    pRow.ratios = { lastStartMs: pRow.ratio, cpuUsPerRun: axRow.cpuUsPerRun && pRow.cpuUsPerRun ? r2((axRow.cpuUsPerRun as number) / (pRow.cpuUsPerRun as number)) : null };
    peers.push(pRow);
  }
  emit(axRow, { ax: ax.s.series });
  for (const p of peers) emit(p);
}

/**
 * shards: seed-500k (seed-50k's size with --quick) at the default 64 shards and at 4 (an
 * exploration, labelled), one node each; ax only. The 64-shard side reuses this invocation's
 * seed-500k row when there is one.
 */
async function shardsScenario(emit: Emit): Promise<void> {
  const tasks = num("tasks") ?? (quick ? 50_000 : 500_000);
  const rate = num("rate") ?? 8200;
  const other = benchOpts.shards !== undefined && benchOpts.shards !== DEFAULT_SHARDS ? benchOpts.shards : 4;
  const base: AxBenchOptions = { ...benchOpts }; delete base.shards;
  const run = async (o: AxBenchOptions, label: string) => {
    log(`shards: ${tasks} tasks at ${rate}/s on ${label}`);
    const r = await withBench(o, (b) => axSeed(b, "t", tasks, rate, warmup));
    return { row: row("shards", tasks, rate, r.s, r.u0, r.u1, r.sv, xcFields(agreed(r, `shards, ${label}`)), r.cpuRuns), series: r.s.series };
  };
  const d = seed500Default && seed500Default.row.tasks === tasks && seed500Default.row.rate === rate
    ? { row: { ...seed500Default.row, scenario: "shards", reusedFrom: "seed-500k" }, series: seed500Default.series }
    : await run(base, `${DEFAULT_SHARDS} shards (the default)`);
  const x = await run({ ...base, shards: other }, `${other} shards (exploration)`);
  x.row.shards = other;
  x.row.exploration = [`${other} shards`];
  const q = (a: unknown, b: unknown) => (typeof a === "number" && typeof b === "number" && b ? r2(a / b) : null);
  d.row.ratios = { vsShards: other, p99: q(d.row.latencyMs?.p99, x.row.latencyMs?.p99), steadyP99: q(d.row.steadyLatencyMs?.p99, x.row.steadyLatencyMs?.p99), cpuUsPerRun: q(d.row.cpuUsPerRun, x.row.cpuUsPerRun) };
  d.row.ratio = (d.row.ratios as Record<string, number | null>).p99 ?? null;
  emit(d.row, { ax: d.series });
  emit(x.row, { ax: x.series });
}

async function idleScenario(emit: Emit): Promise<void> {
  const tasks = num("tasks") ?? (quick ? 50_000 : 1_000_000);
  log(`idle-1m: ${tasks} tasks due next week`);
  await withBench(benchOpts, async (b) => {
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
  await withBench(benchOpts, async (b) => {
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
  shards: shardsScenario,
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
  if (runExploration.length) log(`exploration (rows labelled, kept out of the table): ${runExploration.join(", ")}`);
  const rows: Array<{ row: ResultRow; series?: { ax?: SeriesPoint[]; peer?: SeriesPoint[] } }> = [];
  const emit: Emit = (r, series) => {
    const exploration = [...runExploration, ...((r.exploration as string[] | undefined) ?? [])];
    const out: ResultRow = { ...r, quick, method: METHOD, exploration,
      ...(r.peer ? {} : { shards: (r.shards as number | undefined) ?? benchOpts.shards ?? DEFAULT_SHARDS, tickMs: benchOpts.tickMs ?? DEFAULT_TICK_MS,
        maxInFlight: benchOpts.maxInFlight ?? Number(ENV_DEFAULTS.AX_MAX_IN_FLIGHT), executorConcurrency: benchOpts.executorConcurrency, warmup: (r.warmup as number | undefined) ?? warmup }) };
    process.stdout.write(JSON.stringify(out) + "\n");
    rows.push({ row: out, ...(series ? { series } : {}) });
    if (seriesFile && series) appendFileSync(seriesFile, JSON.stringify({ scenario: out.scenario, ...series }) + "\n");
    // Correctness first: a run never started, run twice, or started before its due time fails the bench.
    const bad = [out.lost && `${out.lost} lost`, out.duplicated && `${out.duplicated} duplicated`, out.early && `${out.early} started before their due time (early)`].filter(Boolean);
    if (bad.length) {
      log(`${out.scenario} (${out.peer ?? "ax"}): CORRECTNESS FAILURE: ${bad.join(", ")}`);
      if (!out.peer) process.exitCode = 1;
    }
  };
  for (const n of names) {
    try { await SCENARIOS[n]!(emit); } catch (e) {
      if (e instanceof RefusedRow) log(`${n}: REFUSED, the row is not printed or recorded: ${e.message}`);
      else log(`${n} failed: ${(e as Error).stack ?? e}`);
      process.exitCode = 1;
    }
  }
  if (!flag("no-docs") && rows.length) writeReports(rows, { date, commit, machine });
  process.exit();
}

await main();
