import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { LatencySummary, SeriesPoint } from "./recorder.ts";

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
  nodeCpuS: number;
  nodeRssMb: number;
  serversCpuS: number;
  peer?: string;
  ratio?: number | null;
  [k: string]: unknown;
}

interface Stored { row: ResultRow; series?: { ax?: SeriesPoint[]; peer?: SeriesPoint[] }; date: string; commit: string; machine: Machine }
interface Machine { nproc: number; memoryGb: number; cpu: string }

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const RESULTS = join(root, "bench", "results.json");
const MD = join(root, "docs", "BENCHMARKS.md");
const SVG = join(root, "docs", "bench-lateness.svg");
const ORDER = ["seed-50k", "seed-500k", "max-rate", "burst", "idle-1m", "create"];
const ANALYSIS = join(root, "bench", "analysis.md");

/** The speed targets of the benchmark issue, checked against the latest full-size rows. */
function targets(all: Stored[]): string {
  const get = (sc: string, peer?: string) => all.find((x) => x.row.scenario === sc && (x.row.peer ?? undefined) === peer && !x.row.quick)?.row;
  const mark = (ok: boolean | null) => (ok === null ? "not run" : ok ? "met" : "**not met**");
  const s5 = get("seed-500k"); const mr = get("max-rate"); const mrb = get("max-rate", "bullmq"); const idle = get("idle-1m"); const cr = get("create");
  const rows = [
    ["seed-500k p99 ≤ 50 ms, 0 lost, 0 duplicated", s5 ? `p99 ${s5.latencyMs?.p99} ms (after the first 5 s: ${fmt(s5.steadyLatencyMs?.p99)} ms), lost ${s5.lost}, dup ${s5.duplicated}` : "–",
      mark(s5 ? (s5.latencyMs?.p99 ?? Infinity) <= 50 && s5.lost === 0 && s5.duplicated === 0 : null)],
    ["max-rate ≥ 20,000 runs/s at p99 ≤ 100 ms", mr ? `${mr.rate}/s (p99 ${mr.latencyMs?.p99} ms)` : "–", mark(mr ? (mr.rate ?? 0) >= 20_000 : null)],
    ["max-rate ahead of BullMQ", mrb ? `ax ${mr?.rate}/s vs BullMQ ${mrb.rate}/s (×${mrb.ratio})` : "–", mark(mrb && mr ? (mr.rate ?? 0) > (mrb.rate ?? 0) : null)],
    ["idle-1m ≤ 1 GB node RSS", idle ? `${idle.nodeRssMb} MB` : "–", mark(idle ? idle.nodeRssMb <= 1024 : null)],
    ["create ≥ 50,000 tasks/s", cr ? `${cr.rate}/s` : "–", mark(cr ? (cr.rate ?? 0) >= 50_000 : null)],
  ];
  return ["| target | latest full-size result | status |", "|---|---|---|", ...rows.map((r) => `| ${r.join(" | ")} |`)].join("\n");
}

const keyOf = (r: ResultRow) => `${r.scenario}|${r.peer ?? "ax"}|${r.quick ? "quick" : "full"}`;

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
  for (const name of ["seed-500k", "seed-50k"]) for (const size of ["full", "quick"]) {
    const s = all.find((x) => x.row.scenario === name && !x.row.peer && (x.row.quick ? "quick" : "full") === size && x.series?.ax?.length);
    if (s) return s;
  }
  return null;
}

const fmt = (v: unknown) => (v === null || v === undefined || (typeof v === "number" && Number.isNaN(v)) ? "–" : typeof v === "number" ? String(v) : String(v));

function table(rows: Stored[]): string {
  const head = "| scenario | system | tasks | rate /s | achieved /s | p50 ms | p90 ms | p99 ms | p99 after 5 s ms | max ms | lost | dup | node CPU s | node RSS MB | servers CPU s | ratio ax/BullMQ | date | commit |";
  const sep = "|" + "---|".repeat(18);
  const lines = rows.sort((a, b) => ORDER.indexOf(a.row.scenario) - ORDER.indexOf(b.row.scenario) || (a.row.peer ? 1 : 0) - (b.row.peer ? 1 : 0)).map(({ row: r, date, commit }) => {
    const l = r.latencyMs; const steady = r.steadyLatencyMs;
    return `| ${r.scenario} | ${r.peer ?? "ax"} | ${r.tasks} | ${fmt(r.rate)} | ${fmt(r.achievedRate)} | ${fmt(l?.p50)} | ${fmt(l?.p90)} | ${fmt(l?.p99)} | ${fmt(steady?.p99)} | ${fmt(l?.max)} | ${r.lost} | ${r.duplicated} | ${r.nodeCpuS} | ${r.nodeRssMb} | ${r.serversCpuS} | ${fmt(r.ratio)} | ${date.slice(0, 16).replace("T", " ")} | ${commit} |`;
  });
  return [head, sep, ...lines].join("\n");
}

function extras(rows: Stored[]): string {
  const out: string[] = [];
  for (const { row: r } of rows) {
    if (r.scenario === "max-rate" && Array.isArray(r.sweep)) {
      out.push(`- max-rate sweep (${r.peer ?? "ax"}): ` + (r.sweep as Array<{ rate: number; p99: number; lost: number; pass: boolean }>).map((s) => `${s.rate}/s → p99 ${s.p99} ms${s.lost ? `, ${s.lost} lost` : ""} ${s.pass ? "✓" : "✗"}`).join("; "));
    }
    if (r.scenario === "burst" && !r.peer) out.push(`- burst: the last of ${r.tasks} runs started ${fmt(r.lastStartMs)} ms after the common due time`);
    if (r.scenario === "idle-1m" && r.bytesPerTask) {
      const b = r.bytesPerTask as { node: number; redis: number; postgres: number };
      out.push(`- idle-1m: node RSS ${r.nodeRssMb} MB (${fmt(r.nodeRssBaseMb)} MB before the tasks), i.e. ${b.node} B per task in the node; Redis ${b.redis} B per task; PostgreSQL ${b.postgres} B per task (tasks + triggers + links, with indexes)`);
    }
    if (r.scenario === "create") out.push(`- create: ${r.rate} tasks/s through \`task.bulkCreate\` (calls of 5000 specs, 3 in flight)`);
  }
  return out.join("\n");
}

function markdown(all: Stored[], plot: Stored | null): string {
  const full = all.filter((s) => !s.row.quick);
  const quick = all.filter((s) => s.row.quick);
  const m = (full[0] ?? quick[0])?.machine;
  const cfg = (full[0] ?? quick[0])?.row;
  return `# Benchmarks

Generated by \`npm run bench -- <scenario|all> [--quick] [--tasks N] [--rate R] [--no-peer] [--prof DIR]\`
(bench/run.ts); each run rewrites this page from \`bench/results.json\`, which keeps the latest row of
every scenario. Machine: ${m ? `${m.nproc} cores (${m.cpu}), ${m.memoryGb} GB memory` : "?"}; PostgreSQL 15, Redis 7 and
NATS ${"2.9"} JetStream on loopback on the same machine, shared with other work (numbers are noisy:
compare ratios within one run). Node config: ${fmt(cfg?.shards)} shards, ${fmt(cfg?.tickMs)} ms wheel tick, one node, one executor instance.

## Results

${full.length ? table(full) : "(no full-size run yet)"}

${extras(full)}

## Targets

${targets(full)}

${existsSync(ANALYSIS) ? readFileSync(ANALYSIS, "utf8").trim() + "\n" : ""}
${quick.length ? `### Scaled-down runs (\`--quick\` or \`--tasks\`)\n\n${table(quick)}\n\n${extras(quick)}\n` : ""}
${plot ? `## Lateness over time (${plot.row.scenario}${plot.row.quick ? ", scaled down" : ""})\n\n![lateness per second](bench-lateness.svg)\n\np99 and max lateness per second of the run, ax and BullMQ.\n` : ""}
## What is measured

- **Workload**: one-shot tasks (\`at\` triggers) created through the bulk API \`task.bulkCreate\`
  (5000 specs per call) before the first is due; then the harness waits until every task ran.
  seed-50k: 50,000 due at 835/s; seed-500k: 500,000 at 8,200/s; burst: 100,000 due at one instant;
  idle-1m: 1,000,000 due next week; create: tasks registered per second through the bulk API.
- **max-rate**: a bounded sweep (windows of 10 s; ×1.5 while passing, then bisection to within
  10 %, at most 12 steps or the time budget) for the highest rate with p99 ≤ 100 ms, 0 lost, 0 duplicated,
  after one unmeasured warm-up step at half the start rate (both systems alike).
- **Lateness** = executor handler start − due time (\`scheduledAt\`), in an HDR histogram
  (µs resolution, 3 significant digits). Every run goes through the whole path: wheel → round →
  fenced batch write to PostgreSQL → dispatch over JetStream → executor → started/completed events
  → fenced writes of the run and task rows.
- **p99 after 5 s** = the same percentile over the runs due after the first 5 s of the run, for
  ax and BullMQ alike: the steady state without the cold start (fresh processes: JIT, first plans),
  which is about 3 % of a 500k run and sets its whole-run p99. The targets read the whole-run p99.
- **lost** = tasks that never ran; **duplicated** = tasks whose handler ran more than once.
- **achieved** = runs per second between the first and the last handler start (burst: runs / time
  from the due instant to the last start; create: tasks registered per second).
- **node CPU s / RSS** = the ax node process (a child process, \`process.cpuUsage()\` and RSS),
  over the firing window; for BullMQ the Worker process. **servers CPU s** = CPU seconds of every
  postgres, redis-server and nats-server process over the same window, from /proc (includes
  whatever else the shared machine ran meanwhile).
- **ratio ax/BullMQ**: seed rows p99 lateness ax ÷ BullMQ (< 1: ax is more punctual); max-rate
  the sustained rate ax ÷ BullMQ (> 1: ax is ahead). The JSON lines carry more (\`ratios\`).
- **BullMQ** (bench/peer-bullmq.ts): delayed jobs with \`timestamp\` + \`delay\` = the same due times,
  added with \`addBulk\`, one Worker (concurrency 1000) in a child process, jobs removed on
  completion, a unique key prefix obliterated afterwards. BullMQ keeps its state in Redis, which
  runs here without persistence; ax persists every transition in PostgreSQL with synchronous commit.
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
