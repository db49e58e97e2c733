import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { LatencySummary, SeriesPoint } from "./recorder.ts";
import { launcherFlags } from "./launcher.ts";

/**
 * The measurement method of a row. 2: one clock (Date.now() at handler start − the bench's own due
 * time, signed, early counted), the runs-table cross-check, ax at the product defaults, BullMQ on
 * its own Redis at hz 100 (concurrency 100, warmed like ax). Rows without it are older.
 */
export const METHOD = 2;

export interface ResultRow {
  scenario: string;
  tasks: number;
  rate: number | null;
  achievedRate: number | null;
  latencyMs: LatencySummary | null;
  /** Lateness of the runs due after the first 5 s (the recorder's steadyLatencyMs). */
  steadyLatencyMs?: LatencySummary | null;
  lost: number;
  duplicated: number;
  /** Handler starts before the due time (method 2; a correctness failure). */
  early?: number;
  nodeCpuS: number;
  nodeRssMb: number;
  serversCpuS: number;
  peer?: string;
  ratio?: number | null;
  method?: number;
  /** What differs from the documented method (non-default shards, tick, …): never in the table. */
  exploration?: string[];
  [k: string]: unknown;
}

interface Stored { row: ResultRow; series?: { ax?: SeriesPoint[]; peer?: SeriesPoint[] }; date: string; commit: string; machine: Machine }
interface Machine { nproc: number; memoryGb: number; cpu: string }

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const RESULTS = join(root, "bench", "results.json");
const MD = join(root, "docs", "BENCHMARKS.md");
const SVG = join(root, "docs", "bench-lateness.svg");
const ORDER = ["seed-50k", "seed-500k", "max-rate", "burst", "shards", "idle-1m", "create"];
const ANALYSIS = join(root, "bench", "analysis.md");

/**
 * The targets of issue 12 (engine v2), checked against the latest full-size rows of the current
 * method (explorations only for the 64 vs 4 shards target, whose other shard count is one).
 */
export function targets(all: ReadonlyArray<Pick<Stored, "row">>): string {
  const get = (sc: string, peer?: string) => all.find((x) => x.row.scenario === sc && (x.row.peer ?? undefined) === peer && !x.row.exploration?.length)?.row;
  const mark = (ok: boolean | null) => (ok === null ? "not run" : ok ? "met" : "**not met**");
  const s5 = get("seed-500k"); const s5b = get("seed-500k", "bullmq"); const mr = get("max-rate"); const mrb = get("max-rate", "bullmq");
  const bu = get("burst"); const bub = get("burst", "bullmq"); const sh = get("shards"); const cr = get("create");
  // The default's shards row carries the ratios; the other shard count's row is an exploration.
  const shx = all.find((x) => x.row.scenario === "shards" && !x.row.peer && (x.row.exploration?.length ?? 0) > 0)?.row;
  const num = (v: unknown) => (typeof v === "number" ? v : null);
  const p99 = s5?.latencyMs?.p99 ?? null; const p99b = s5b?.latencyMs?.p99 ?? null;
  const shR = sh?.ratios as { p99?: number | null; cpuUsPerRun?: number | null; vsShards?: number } | undefined;
  // A sweep whose first step failed searched only below its start: one slow second in that step
  // decides the row, and a ratio against it says nothing about the target either way.
  const unsearched = (r: ResultRow | undefined, who: string): string | null => {
    const sweep = (r?.sweep as Array<{ rate: number; pass: boolean }> | undefined) ?? [];
    // The first rate's last attempt (a step failed on lateness alone was run once more).
    const first = sweep.length ? sweep.filter((x) => x.rate === sweep[0]!.rate).at(-1) : undefined;
    return first && !first.pass ? `not shown (${who}'s sweep failed its first step, ${first.rate}/s, and searched only below it)` : null;
  };
  const within10 = (r: number | null | undefined) => r !== null && r !== undefined && r >= 1 / 1.1 && r <= 1.1;
  // A seed that fell behind has a lateness set by how far behind it got, not by its shards: the
  // ratio of two such runs says nothing either way, and a default that fell behind beside a
  // 4-shard run that kept the rate has missed the target whatever the ratio.
  const kept = (r: ResultRow | undefined) => (r && typeof r.rate === "number" && typeof r.achievedRate === "number" ? r.achievedRate >= 0.98 * r.rate : null);
  const shardsStatus = (): string => {
    const k64 = kept(sh); const k4 = kept(shx);
    const rates = `${fmt(sh?.achievedRate)}/s and ${fmt(shx?.achievedRate)}/s of ${fmt(sh?.rate)}`;
    if (k64 === false && k4 === false) return `not shown (both runs fell behind, ${rates}: the ratio says nothing)`;
    if (k64 === false) return `**not met** (the default fell behind, ${rates})`;
    if (k4 === false) return `not shown (the ${fmt(shR?.vsShards)}-shard run fell behind, ${rates})`;
    return mark(sh ? within10(shR?.p99) && within10(shR?.cpuUsPerRun) : null);
  };
  const rows = [
    ["seed-500k p99 ≤ 20 ms and ≤ BullMQ's, 0 lost, 0 duplicated", s5 ? `p99 ${fmt(p99)} ms (BullMQ ${fmt(p99b)}), lost ${s5.lost}, dup ${s5.duplicated}, early ${fmt(s5.early)}` : "–",
      mark(s5 ? p99 !== null && p99 <= 20 && (p99b === null || p99 <= p99b) && s5.lost === 0 && s5.duplicated === 0 && !s5.early : null)],
    ["max-rate (p99 ≤ 100 ms) ≥ 1.5 × BullMQ's", mr ? `${fmt(mr.rate)}/s vs BullMQ ${fmt(mrb?.rate)}/s (×${fmt(mrb?.ratio)})` : "–",
      unsearched(mr, "ax") ?? unsearched(mrb, "BullMQ") ?? mark(mr && mrb ? (mr.rate ?? 0) >= 1.5 * (mrb.rate ?? Infinity) : null)],
    ["max-rate CPU per run (all processes) ≤ 80 µs", mr ? `${fmt(mr.cpuUsPerRun)} µs` : "–", mark(mr && num(mr.cpuUsPerRun) !== null ? num(mr.cpuUsPerRun)! <= 80 : null)],
    ["64 vs 4 shards: seed-500k p99 and CPU per run within 10 %", sh ? `p99 ×${fmt(shR?.p99)}, CPU per run ×${fmt(shR?.cpuUsPerRun)} (64 ÷ ${fmt(shR?.vsShards)})` : "–", shardsStatus()],
    ["burst 100k: last start no later than BullMQ's", bu ? `${fmt(bu.lastStartMs)} ms vs BullMQ ${fmt(bub?.lastStartMs)} ms` : "–", mark(bu && bub && num(bu.lastStartMs) !== null && num(bub.lastStartMs) !== null ? num(bu.lastStartMs)! <= num(bub.lastStartMs)! : null)],
    ["create ≥ 50,000 tasks/s", cr ? `${cr.rate}/s` : "–", mark(cr ? (cr.rate ?? 0) >= 50_000 : null)],
  ];
  return ["| target | latest full-size result | status |", "|---|---|---|", ...rows.map((r) => `| ${r.join(" | ")} |`)].join("\n");
}

const keyOf = (r: ResultRow) => `${r.scenario}|${r.peer ?? "ax"}|${r.quick ? "quick" : "full"}${r.exploration?.length ? `|${r.exploration.join(",")}` : ""}`;
const current = (s: Stored) => s.row.method === METHOD;
const explored = (s: Stored) => (s.row.exploration?.length ?? 0) > 0;

/** Merges this run's rows into bench/results.json (latest row per scenario, peer and size) and rewrites the docs from it. */
export function writeReports(rows: Array<{ row: ResultRow; series?: { ax?: SeriesPoint[]; peer?: SeriesPoint[] } }>, meta: { date: string; commit: string; machine: Machine }): void {
  const stored: Record<string, Stored> = existsSync(RESULTS) ? JSON.parse(readFileSync(RESULTS, "utf8")) : {};
  for (const r of rows) stored[keyOf(r.row)] = { row: r.row, ...(r.series ? { series: r.series } : {}), ...meta };
  if (rows.length) writeFileSync(RESULTS, JSON.stringify(stored, null, 1) + "\n");
  mkdirSync(dirname(MD), { recursive: true });
  const all = Object.values(stored);
  const plot = pickPlot(all);
  if (plot) writeFileSync(SVG, svg(plot));
  writeFileSync(MD, markdown(all, plot));
}

function pickPlot(all: Stored[]): Stored | null {
  for (const pool of [all.filter((x) => current(x) && !explored(x)), all.filter((x) => !current(x))]) for (const name of ["seed-500k", "seed-50k"]) for (const size of ["full", "quick"]) {
    const s = pool.find((x) => x.row.scenario === name && !x.row.peer && (x.row.quick ? "quick" : "full") === size && x.series?.ax?.length);
    if (s) return s;
  }
  return null;
}

const fmt = (v: unknown) => (v === null || v === undefined || (typeof v === "number" && Number.isNaN(v)) ? "–" : typeof v === "number" ? String(v) : String(v));

const systemOf = (r: ResultRow) => (r.peer ?? "ax") + (r.exploration?.length ? ` (${r.exploration.join(", ")})` : "");

function table(rows: Stored[]): string {
  const head = "| scenario | system | tasks | rate /s | achieved /s | p50 ms | p90 ms | p99 ms | p99 after 5 s ms | max ms | lost | dup | early | CPU µs/run | node CPU s | node RSS MB | servers CPU s | ratio | date | commit |";
  const sep = "|" + "---|".repeat(20);
  const lines = rows.sort((a, b) => ORDER.indexOf(a.row.scenario) - ORDER.indexOf(b.row.scenario) || (a.row.peer ? 1 : 0) - (b.row.peer ? 1 : 0) || systemOf(a.row).localeCompare(systemOf(b.row))).map(({ row: r, date, commit }) => {
    const l = r.latencyMs; const steady = r.steadyLatencyMs;
    return `| ${r.scenario} | ${systemOf(r)} | ${r.tasks} | ${fmt(r.rate)} | ${fmt(r.achievedRate)} | ${fmt(l?.p50)} | ${fmt(l?.p90)} | ${fmt(l?.p99)} | ${fmt(steady?.p99)} | ${fmt(l?.max)} | ${r.lost} | ${r.duplicated} | ${fmt(r.early)} | ${fmt(r.cpuUsPerRun)} | ${r.nodeCpuS} | ${r.nodeRssMb} | ${r.serversCpuS} | ${fmt(r.ratio)} | ${date.slice(0, 16).replace("T", " ")} | ${commit} |`;
  });
  return [head, sep, ...lines].join("\n");
}

function extras(rows: Stored[]): string {
  const out: string[] = [];
  for (const { row: r } of rows) {
    if (r.scenario === "max-rate" && Array.isArray(r.sweep)) {
      out.push(`- max-rate sweep (${r.peer ?? "ax"}): ` + (r.sweep as Array<{ rate: number; p99: number; lost: number; pass: boolean }>).map((s) => `${s.rate}/s → p99 ${s.p99} ms${s.lost ? `, ${s.lost} lost` : ""} ${s.pass ? "✓" : "✗"}`).join("; "));
    }
    if (r.scenario === "burst") out.push(`- burst (${systemOf(r)}): the last of ${r.tasks} runs started ${fmt(r.lastStartMs)} ms after the common due time${r.peer ? ` (ax ÷ ${r.peer}: ×${fmt(r.ratio)})` : ""}`);
    if (r.scenario === "shards" && !r.exploration?.length && r.ratios) {
      const q = r.ratios as { vsShards?: number; p99?: number | null; steadyP99?: number | null; cpuUsPerRun?: number | null };
      out.push(`- shards: seed at ${fmt(r.rate)}/s on one node, ${fmt(r.shards)} shards (the default) ÷ ${fmt(q.vsShards)} shards (an exploration): p99 ×${fmt(q.p99)}, p99 after 5 s ×${fmt(q.steadyP99)}, CPU per run ×${fmt(q.cpuUsPerRun)}`);
    }
    if (r.crossCheck && !r.peer) {
      const x = r.crossCheck as { started: number; refused: number; maxStartGapMs: number; tableP99: number | null; redated?: Record<string, number> };
      const red = Object.entries(x.redated ?? {}).map(([k, n]) => `${n} re-dated as ${k}`).join(", ");
      out.push(`- ${r.scenario} (${systemOf(r)}): the runs table agrees (${x.started} started runs, handler start at most ${x.maxStartGapMs} ms after started_ms, p99 by the table alone ${fmt(x.tableP99)} ms${x.refused ? `, ${x.refused} runs refused at the in-flight bound` : ""}${red ? `; ${red}` : ""})`);
    }
    if (r.scenario === "idle-1m" && r.bytesPerTask) {
      const b = r.bytesPerTask as { node: number; redis: number; postgres: number };
      out.push(`- idle-1m: node RSS ${r.nodeRssMb} MB (${fmt(r.nodeRssBaseMb)} MB before the tasks), i.e. ${b.node} B per task in the node; Redis ${b.redis} B per task; PostgreSQL ${b.postgres} B per task (tasks + triggers + links, with indexes)`);
    }
    if (r.scenario === "create") out.push(`- create: ${r.rate} tasks/s through \`task.bulkCreate\` (calls of 5000 specs, 3 in flight)`);
  }
  return out.join("\n");
}

function markdown(all: Stored[], plot: Stored | null): string {
  const now = all.filter((s) => current(s) && !explored(s));
  const full = now.filter((s) => !s.row.quick);
  const quick = now.filter((s) => s.row.quick);
  const exploration = all.filter((s) => current(s) && explored(s));
  const older = all.filter((s) => !current(s));
  const m = (full[0] ?? quick[0] ?? all[0])?.machine;
  return `# Benchmarks

Generated by \`npm run bench -- <scenario|all> [--quick] [--no-peer] [--peer-hz 10] [--prof DIR]\`
(bench/run.ts); each run rewrites this page from \`bench/results.json\`, which keeps the latest row of
every scenario. Machine: ${m ? `${m.nproc} cores (${m.cpu}), ${m.memoryGb} GB memory` : "?"}; PostgreSQL 15, Redis 7 and
NATS ${"2.9"} JetStream on loopback on the same machine, shared with other work (numbers are noisy:
compare ratios within one run). ax runs at the product defaults (${"64"} shards, 20 ms tick, in-flight bound
20000, \`${launcherFlags().join(" ")}\` as on \`ax\`'s launcher line, one node, one executor instance of concurrency 100); BullMQ on its own Redis at \`hz 100\`. See
[Method](#method).

## Results

${full.length ? table(full) : "(no full-size run with the current method yet: `npm run bench -- all`)"}

${extras(full)}

## Targets

${targets([...full, ...exploration.filter((s) => !s.row.quick && s.row.scenario === "shards")])}

${existsSync(ANALYSIS) ? (full.length ? "" : "*The analysis below was written about the rows now listed under \"Rows measured with the older method\"; it predates the [Method](#method) below.*\n\n") + readFileSync(ANALYSIS, "utf8").trim() + "\n" : ""}
${quick.length ? `### Scaled-down runs (\`--quick\`)\n\n${table(quick)}\n\n${extras(quick)}\n` : ""}
${exploration.length ? `### Explorations (non-default settings; not in the table above nor in the targets)\n\n${table(exploration)}\n\n${extras(exploration)}\n` : ""}
${older.length ? `### Rows measured with the older method\n\nBefore the method below: lateness was the handler start by \`performance.timeOrigin + performance.now()\`\nminus the dispatch's own \`scheduledAt\` (the node's \`Date.now()\`; a run the engine re-dated as a misfire\nafter 1 s counted from its new due time), with negative values clamped to 0; ax ran 4 shards with a\nbench-only in-flight bound of 200,000, executor concurrency 4096 and a 10 s lease; BullMQ used the shared Redis at\n\`hz 10\` with concurrency 1000 and no warm-up; no cross-check. Not comparable with the rows above.\n\n${table(older)}\n` : ""}
${plot ? `## Lateness over time (${plot.row.scenario}${plot.row.quick ? ", scaled down" : ""}${current(plot) ? "" : ", older method"})\n\n![lateness per second](bench-lateness.svg)\n\np99 and max lateness per second of the run, ax and BullMQ.\n` : ""}
## Method

- **One clock, outside the system under test.** Lateness = \`Date.now()\` taken first thing in the
  bench's handler − the due time the bench itself assigned to task *i* (\`T0 + ⌊i·1000/rate⌋\`,
  kept by the bench and passed to \`task.bulkCreate\` as \`at\`; for BullMQ carried in the job's data).
  Both are \`Date.now()\` on this machine, the clock the scheduler uses to define "due"; the
  dispatch's own \`scheduledAt\` and \`firedAt\` never enter the lateness (\`firedAt\` only splits it
  into due → fired and fired → start for the breakdown).
- **Early is a failure, not a zero.** A handler that starts before its due time has a negative
  lateness; it is counted in **early** (a correctness failure: the bench exits non-zero) and kept
  negative in the percentiles. Percentiles are nearest-rank over the sorted signed values (whole
  milliseconds, at most about a million a row: exact, and no offset needed as an HDR histogram
  would for negative values).
- **Cross-check.** After each measured step the bench reads the namespace's \`runs\` table and
  compares it with what its handler saw, task by task: the number of started runs equals the
  number of handler starts; every run's \`due_ms\` is the due time the bench assigned (or, for a
  run the engine re-dated as \`misfire\` or \`retry\`, its \`slot_ms\` is; such runs are counted);
  \`started_ms\` (the executor SDK's \`Date.now()\` when it took the run) is not after the
  handler's start and at most 1 s before it; \`fired_ms\` equals the dispatch's \`firedAt\` and is
  not after \`started_ms\`; and the row's p50 and p99 are within 20 ms (\`--xcheck-tolerance\`)
  of the same percentiles by the table alone (\`started_ms\` − the due time before any re-dating),
  over the same runs. A row that disagrees is refused: not printed, not recorded, the bench exits
  non-zero with the reason. So is a step whose tasks (or jobs) were still being created when the
  first came due, as its measured window missed the start (\`--lead MS\` gives creation more time
  on a busy machine; it changes nothing measured). The rows carry the table's own p99, the runs
  it shows refused at the in-flight bound and the runs it re-dated.
- **ax at the product defaults**: the node is started as \`ax node\` with no flags starts it
  (\`AX_SHARDS\` 64, \`AX_TICK\` 20 ms, \`AX_MAX_IN_FLIGHT\` 20000, default lease and heartbeat, the V8
  flags of \`bin/ax.mjs\`'s launcher line, \`${launcherFlags().join(" ")}\`; \`--expose-gc\` only makes
  \`gc()\` callable for idle-1m), one node in a child process, one
  executor instance registering itself through the SDK. The executor's concurrency is the user's
  choice, like BullMQ's worker concurrency: 100 on both sides. If the default in-flight bound
  limits a scenario, that shows (refused runs, lateness) and is a finding. \`--shards\`,
  \`--tick\`, \`--max-in-flight\`, \`--concurrency\`, \`--node-flags\`, \`--event-flush\`, \`--tasks\`,
  \`--rate\`, \`--window\`, \`--budget\` and a non-default \`--warmup\` are explorations: their rows are labelled with what
  differs and never feed the table or the targets.
- **Warm-up, both systems alike**: 20,000 unmeasured runs (2,000 with \`--quick\`) due just before
  the measured ones at the same rate (burst: at 8,200/s, ending 2 s before the burst instant), so
  the measured runs meet processes already running.
- **BullMQ peer, tuned** (bench/peer-bullmq.ts): its own \`redis-server\`, started for each peer row on
  a free loopback port with \`--hz 100 --save "" --appendonly no\` and stopped after it (also on an
  error or Ctrl-C). Redis checks blocked clients' timeouts \`hz\` times a second; at the default
  \`hz 10\` that puts a floor near 95 ms under BullMQ's delayed jobs, and users who care about latency
  raise it (\`--peer-hz 10\` adds a row at that setting, labelled \`bullmq-hz10\`). Delayed jobs with
  \`timestamp\` + \`delay\` = the same due times, added with \`addBulk\`; one Worker of concurrency 100
  in a child process; jobs removed on completion. BullMQ keeps its state in Redis without
  persistence; ax persists every transition in PostgreSQL with synchronous commit.
- **Scenarios**: one-shot tasks (\`at\` triggers) created through \`task.bulkCreate\` (5000 specs a
  call) before the first is due; the bench waits until every task ran. seed-50k: 50,000 due at
  835/s; seed-500k: 500,000 at 8,200/s; burst: 100,000 due at one instant (the figure is the last
  handler start after that instant), beside BullMQ's; shards: seed-500k on one node at 64 shards
  (the default; this run's seed-500k row when there is one) and at 4 (labelled exploration);
  idle-1m: 1,000,000 due next week; create: tasks registered per second.
- **max-rate**: a bounded sweep (windows of 10 s; ×1.5 while passing, then bisection to within
  10 %, at most 16 steps or the time budget) for the highest rate with p99 ≤ 100 ms, 0 lost, 0
  duplicated, 0 early and a cross-check that agrees, after one unmeasured step at half the start
  rate (both systems alike). One slow second can fail a 10 s step, so a step that fails on
  lateness alone is run once more before it counts (both systems alike; both attempts are
  listed). A sweep whose first rate still fails has searched only below its start: its row
  stands, but the max-rate target is then reported "not shown" rather than met or missed.
- **p99 after 5 s** = the same percentile over the runs due after the first 5 s of the run.
- **lost** = tasks not run by the end of the measured window (30 s after the last due time; burst:
  120 s after the instant); **dup** = tasks whose handler ran more than once. Handler starts after
  the window are in no figure (the cross-check leaves them out too).
- **achieved** = runs per second between the first and the last handler start (burst: runs / time
  from the due instant to the last start; create: tasks registered per second).
- **CPU µs/run** = CPU of every process involved from 11 s before the first measured due time
  (or the end of creation, if later) to the end of the measured window ÷ the runs due in it (the
  measured ones and the warm-up's): the node (BullMQ: the worker), this namespace's PostgreSQL
  backends, Redis, NATS and the executor (the bench process). The window opens that early
  because ax does work ahead of the due times (a burst is recorded up to 10 s before it, the
  horizon): that work counts. ax's Redis and NATS are the machine's shared servers, so other work on the box counts
  too; BullMQ's Redis is its own. **node CPU s / RSS** = the node (worker) process alone;
  **servers CPU s** = every postgres, redis-server and nats-server on the machine for ax, the peer's
  own redis-server for BullMQ.
- **ratio**: seed rows p99 ax ÷ BullMQ (< 1: ax is more punctual); max-rate the rate ax ÷ BullMQ
  (> 1: ax is ahead); burst the last start ax ÷ BullMQ (< 1: ax is done first); shards p99 at 64
  ÷ at 4. The JSON lines carry more (\`ratios\`, \`crossCheck\`, \`cpuUsPerRunParts\`).
`;
}

function svg(s: Stored): string {
  const W = 900, H = 420, L = 60, R = 20, T = 40, B = 50;
  const ax = s.series?.ax ?? []; const peer = s.series?.peer ?? [];
  const all = [...ax, ...peer];
  const tMax = Math.max(1, ...all.map((p) => p.t));
  const vMax = Math.max(1, ...all.map((p) => p.max));
  const vMin = 0.1;
  const ly = (v: number) => Math.log10(Math.max(vMin, v));
  const y = (v: number) => T + (H - T - B) * (1 - (ly(v) - ly(vMin)) / (ly(vMax * 1.2) - ly(vMin)));
  const x = (t: number) => L + (W - L - R) * (t / tMax);
  const path = (pts: SeriesPoint[], k: "p99" | "max") => pts.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${y(p[k]).toFixed(1)}`).join(" ");
  const ticks: string[] = [];
  for (let v = 0.1; v <= vMax * 1.2; v *= 10) ticks.push(`<line x1="${L}" x2="${W - R}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}" stroke="#ddd"/><text x="${L - 6}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end" font-size="11">${v >= 1 ? v.toFixed(0) : v.toFixed(1)}</text>`);
  for (let t = 0; t <= tMax; t += Math.max(1, Math.round(tMax / 10))) ticks.push(`<text x="${x(t).toFixed(1)}" y="${H - B + 16}" text-anchor="middle" font-size="11">${t}</text>`);
  const series = [
    { pts: ax, k: "p99" as const, color: "#1f77b4", dash: "", label: "ax p99" },
    { pts: ax, k: "max" as const, color: "#1f77b4", dash: "4 3", label: "ax max" },
    { pts: peer, k: "p99" as const, color: "#d62728", dash: "", label: "BullMQ p99" },
    { pts: peer, k: "max" as const, color: "#d62728", dash: "4 3", label: "BullMQ max" },
  ].filter((x) => x.pts.length);
  const legend = series.map((sr, i) => `<line x1="${L + 10 + i * 130}" x2="${L + 40 + i * 130}" y1="${T - 14}" y2="${T - 14}" stroke="${sr.color}" stroke-width="2" stroke-dasharray="${sr.dash}"/><text x="${L + 45 + i * 130}" y="${T - 10}" font-size="12">${sr.label}</text>`).join("");
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
${ticks.join("\n")}
<line x1="${L}" x2="${L}" y1="${T}" y2="${H - B}" stroke="#333"/><line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}" stroke="#333"/>
${series.map((sr) => `<path d="${path(sr.pts, sr.k)}" fill="none" stroke="${sr.color}" stroke-width="1.5" stroke-dasharray="${sr.dash}"/>`).join("\n")}
${legend}
<text x="${(L + W - R) / 2}" y="${H - 12}" text-anchor="middle" font-size="12">seconds since the first due time (${s.row.scenario}: ${s.row.tasks} tasks at ${s.row.rate}/s, ${s.date.slice(0, 10)}, ${s.commit})</text>
<text x="14" y="${(T + H - B) / 2}" transform="rotate(-90 14 ${(T + H - B) / 2})" text-anchor="middle" font-size="12">lateness per second, ms (log scale)</text>
</svg>
`;
}
