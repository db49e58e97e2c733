/**
 * The cross-check: after a measured step, the runs table (the system's own record, in the
 * namespace's PostgreSQL schema) must agree with what the bench saw in its handler. A row whose
 * figures disagree is refused (not printed, not recorded), with the reason.
 *
 * The recorder's window is closed (Recorder.freeze) before: table runs that started after it are
 * left out, and so is a task whose only start the table puts within MAX_START_GAP_MS before the
 * close (its handler may have started just after).
 *
 * Checked, per task the bench created in the step:
 * - the number of runs with a start in the table = the number of handler starts the bench saw;
 * - every run's `due_ms` = the due time the bench assigned (the engine fired what was asked), or,
 *   for a run the engine re-dated (source `misfire`: fired more than its grace late; `retry`:
 *   refused at the in-flight bound and retried), its `slot_ms` = that due time. Re-dated runs are
 *   counted (a finding: their own `due_ms`/`scheduledAt` no longer show how late they are), and
 *   the bench's lateness still runs from the due time it assigned;
 * - the table's `started_ms` (the executor SDK's Date.now() when it took the run) is not after the
 *   handler's own Date.now(), and at most MAX_START_GAP_MS before it (the SDK starts a whole batch
 *   before the handlers run; on a starved 2-core box that alone took up to ~200 ms);
 * - the row's figures: p50 and p99 of the lateness by the table (started_ms − due) are within
 *   `toleranceMs` of the bench's own (handler start − due), over the same runs;
 * - the table's `fired_ms` = the `firedAt` the dispatch carried, and is not after `started_ms`.
 */
import { summarize, type LatencySummary, type Recorder } from "./recorder.ts";

/** One runs-table row of a measured task. */
export type RunRowTuple = [index: number, dueMs: number, firedMs: number | null, startedMs: number | null, state: string, source: string, slotMs: number | null];

export interface CrossCheckResult {
  ok: boolean;
  /** Why it disagrees (the first few cases of each kind). */
  problems: string[];
  /** Runs in the table for the measured tasks, of which started, of which refused (in-flight bound). */
  rows: number; started: number; refused: number;
  /** Started runs in the table after the recorder's window closed (not compared). */
  afterWindow: number;
  /** Runs whose due_ms the engine moved (by source), their slot_ms being the bench's due time. */
  redated: Record<string, number>;
  /** Handler start − table started_ms over the tasks (ms): p99 and largest. */
  startGapP99Ms: number; maxStartGapMs: number;
  /** Lateness by the table alone (started_ms − due_ms): for the reader to compare with the bench's. */
  tableLatencyMs: LatencySummary | null;
}

/** A handler start this long after the table's started_ms means the two are not the same run's record. */
export const MAX_START_GAP_MS = 1000;

export function crossCheck(rows: RunRowTuple[], rec: Recorder, dueOf: (i: number) => number, toleranceMs: number): CrossCheckResult {
  const problems: string[] = [];
  const cases = new Map<string, number>();
  const note = (kind: string, msg: string) => {
    const n = (cases.get(kind) ?? 0) + 1; cases.set(kind, n);
    if (n <= 3) problems.push(msg);
  };
  const startedCount = new Uint8Array(rec.expected);
  const firstStarted = new Float64Array(rec.expected).fill(NaN);
  const firstFired = new Float64Array(rec.expected).fill(NaN);
  let started = 0; let refused = 0; let afterWindow = 0;
  const closedAt = rec.frozenAt ?? Infinity;
  const redated: Record<string, number> = {};
  const tableLate: number[] = [];
  for (const [i, dueMs, firedMs, startedMs, state, source, slotMs] of rows) {
    if (!(i >= 0 && i < rec.expected)) { note("index", `the runs table has a run of task index ${i}, which the bench did not create`); continue; }
    if (state === "refused") refused++;
    const assigned = dueOf(i);
    if (dueMs !== assigned) {
      if ((source === "misfire" || source === "retry") && slotMs === assigned) redated[source] = (redated[source] ?? 0) + 1;
      else note("due", `task ${i}: due_ms ${dueMs} (source ${source}, slot_ms ${slotMs}) in the runs table, the bench assigned ${assigned}`);
    }
    if (startedMs === null) continue;
    if (startedMs > closedAt) { afterWindow++; continue; }
    started++;
    // The table's own lateness, from the due time it says the task had before any re-dating.
    tableLate.push(startedMs - (dueMs !== assigned && slotMs !== null ? slotMs : dueMs));
    if (firedMs !== null && firedMs > startedMs) note("order", `task ${i}: fired_ms ${firedMs} after started_ms ${startedMs}`);
    if (startedCount[i]! < 255) startedCount[i]!++;
    if (Number.isNaN(firstStarted[i]!) || startedMs < firstStarted[i]!) { firstStarted[i] = startedMs; firstFired[i] = firedMs ?? NaN; }
  }
  let maxGap = 0;
  const gaps: number[] = [];
  const benchLate: number[] = []; const tableFirstLate: number[] = [];
  for (let i = 0; i < rec.expected; i++) {
    const f = rec.first(i);
    const seen = f?.runs ?? 0;
    if (seen === 0 && startedCount[i]! > 0 && firstStarted[i]! > closedAt - MAX_START_GAP_MS) continue; // straddles the close
    if (seen !== startedCount[i]) { note("count", `task ${i}: ${seen} handler start(s), ${startedCount[i]} started run(s) in the runs table`); continue; }
    if (!f) continue;
    const gap = f.startMs - firstStarted[i]!;
    gaps.push(gap);
    if (gap > maxGap) maxGap = gap;
    // 1 ms of slack below: both are whole-ms Date.now() of the same process, taken in that order.
    if (gap < -1 || gap > MAX_START_GAP_MS) note("start", `task ${i}: the handler started at ${f.startMs}, the runs table says ${firstStarted[i]} (${gap} ms apart; allowed -1 to ${MAX_START_GAP_MS})`);
    benchLate.push(f.startMs - dueOf(i)); tableFirstLate.push(firstStarted[i]! - dueOf(i));
    if (f.firedMs !== null && !Number.isNaN(firstFired[i]!) && f.firedMs !== firstFired[i]) note("fired", `task ${i}: the dispatch said firedAt ${f.firedMs}, the runs table fired_ms ${firstFired[i]}`);
  }
  for (const [kind, n] of cases) if (n > 3) problems.push(`… ${n} cases of "${kind}" in all`);
  if (benchLate.length) {
    const b = summarize(benchLate); const t = summarize(tableFirstLate);
    for (const k of ["p50", "p99"] as const) {
      if (Math.abs(b[k] - t[k]) > toleranceMs) problems.push(`${k} lateness: ${b[k]} ms by the handler, ${t[k]} ms by the runs table (more than ${toleranceMs} ms apart)`);
    }
  }
  return { ok: problems.length === 0, problems, rows: rows.length, started, refused, afterWindow, redated, startGapP99Ms: gaps.length ? summarize(gaps).p99 : 0, maxStartGapMs: maxGap,
    tableLatencyMs: tableLate.length ? summarize(tableLate) : null };
}
