/**
 * Lateness recorder, one clock: lateness = `Date.now()` when the bench's own handler starts −
 * the due time the bench itself assigned to the task (both epoch ms from `Date.now()`, the
 * clock the scheduler uses to define "due"). Nothing the system under test reports (its
 * `scheduledAt`, its `firedAt`) enters the lateness; `firedAt` only splits it for the breakdown.
 *
 * Lateness is signed. A handler that starts before its due time is counted as `early` (a
 * correctness failure) and kept as a negative value: nothing is clamped.
 *
 * Percentiles are computed by sorting the signed values (nearest rank), not with an HDR
 * histogram: the values are whole milliseconds (Date.now()), at most about a million per row
 * (8 MB as a Float64Array, sorted in well under a second), so sorting is exact, needs no offset
 * for negative values and no trackable range, and costs nothing during the run.
 */

export interface LatencySummary { p50: number; p90: number; p99: number; max: number; /** the smallest (most negative when early) */ min?: number }
export interface SeriesPoint { t: number; n: number; p50: number; p99: number; max: number; /** due → fired, p99 (the rest is fired → handler start) */ fireP99?: number }

export interface RecorderSummary {
  expected: number;
  /** Handler starts of the expected tasks (duplicates included). */
  runs: number;
  /** Tasks not run by the end of the measured window (30 s after the last due time; burst 120 s). */
  lost: number;
  /** Tasks run more than once. */
  duplicated: number;
  /** Handler starts before the task's due time (a correctness failure; their lateness is negative). */
  early: number;
  /** Handler starts of tasks the bench did not create in this step (not in any figure). */
  unexpected: number;
  /** Handler starts after the window closed (freeze()): not in any figure. */
  afterWindow: number;
  latencyMs: LatencySummary;
  /**
   * Lateness of the runs due after the first WARMUP_MS of the run: the steady state, without the
   * cold start (JIT, first plans and connections). latencyMs stays the whole-run figure.
   */
  steadyLatencyMs: LatencySummary | null;
  firstStartMs: number | null;
  lastStartMs: number | null;
  /** Per second since `originMs` (by handler start): count and lateness percentiles (the plot). */
  series: SeriesPoint[];
  /**
   * Where the lateness was spent, by the system's own `firedAt` (same machine, same Date.now()):
   * due → fired (wheel, round) and fired → handler start (write, publish, delivery). Informative only.
   */
  breakdownMs?: { fireP50: number; fireP99: number; deliverP50: number; deliverP99: number };
}

const round = (v: number, d = 1) => Math.round(v * 10 ** d) / 10 ** d;
export const WARMUP_MS = 5000;

/** Nearest-rank percentile of an ascending array (q in (0, 1]). */
export function percentile(sorted: ArrayLike<number>, q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;
}

/** p50/p90/p99/max/min of signed values (sorts a copy). */
export function summarize(values: ArrayLike<number>): LatencySummary {
  const v = Float64Array.from(values).sort();
  if (v.length === 0) return { p50: NaN, p90: NaN, p99: NaN, max: NaN, min: NaN };
  return { p50: round(percentile(v, 0.5)), p90: round(percentile(v, 0.9)), p99: round(percentile(v, 0.99)), max: round(v[v.length - 1]!), min: round(v[0]!) };
}

/** A growable Float64Array (a plain number[] of 500k costs 4x the memory and GC of the hot path). */
class F64 {
  a = new Float64Array(1024);
  n = 0;
  push(v: number): void {
    if (this.n === this.a.length) { const b = new Float64Array(this.a.length * 2); b.set(this.a); this.a = b; }
    this.a[this.n++] = v;
  }
  view(): Float64Array { return this.a.subarray(0, this.n); }
}

/** One task's first handler start, as the cross-check needs it. */
export interface FirstStart { startMs: number; firedMs: number | null; runs: number }

/**
 * Per task index: run count (lost / duplicated), first handler start and the system's firedAt
 * (the cross-check); per handler start: signed lateness, start and due→fired (percentiles, plot).
 */
export class Recorder {
  private counts: Uint8Array;
  private firstStart: Float64Array;
  private firstFired: Float64Array;
  private starts = new F64();
  private lates = new F64();
  private fires = new F64();
  private steady = new F64();
  runs = 0;
  early = 0;
  unexpected = 0;
  afterWindow = 0;
  /** Date.now() when the measured window closed; later handler starts are not recorded. */
  frozenAt: number | null = null;
  firstStartMs: number | null = null;
  lastStartMs: number | null = null;
  /** Number of distinct tasks that ran at least once. */
  distinct = 0;
  private waiters: Array<{ n: number; resolve: () => void }> = [];

  constructor(readonly expected: number, readonly originMs: number) {
    this.counts = new Uint8Array(expected);
    this.firstStart = new Float64Array(expected).fill(NaN);
    this.firstFired = new Float64Array(expected).fill(NaN);
  }

  /**
   * A handler start of task `index`, due (as the bench assigned it) at `dueMs`, started at
   * `startMs` (Date.now() in the handler). `firedMs` is the system's own fire time, if it says.
   */
  record(index: number, dueMs: number, startMs: number, firedMs?: number): void {
    if (this.frozenAt !== null) { this.afterWindow++; return; }
    if (!(Number.isInteger(index) && index >= 0 && index < this.expected)) { this.unexpected++; return; }
    const late = startMs - dueMs;
    if (late < 0) this.early++;
    this.lates.push(late);
    this.starts.push(startMs);
    this.fires.push(firedMs === undefined ? NaN : firedMs - dueMs);
    if (dueMs >= this.originMs + WARMUP_MS) this.steady.push(late);
    this.runs++;
    const c = this.counts[index]!;
    if (c === 0) {
      this.distinct++;
      this.firstStart[index] = startMs;
      this.firstFired[index] = firedMs ?? NaN;
    }
    if (c < 255) this.counts[index] = c + 1;
    if (this.firstStartMs === null || startMs < this.firstStartMs) this.firstStartMs = startMs;
    if (this.lastStartMs === null || startMs > this.lastStartMs) this.lastStartMs = startMs;
    if (this.waiters.length) {
      this.waiters = this.waiters.filter((w) => { if (this.distinct >= w.n) { w.resolve(); return false; } return true; });
    }
  }

  /** Task `index`'s handler-start count and first start (null if it never ran). */
  first(index: number): FirstStart | null {
    const c = this.counts[index] ?? 0;
    if (c === 0) return null;
    const f = this.firstFired[index]!;
    return { startMs: this.firstStart[index]!, firedMs: Number.isNaN(f) ? null : f, runs: c };
  }

  /** Resolves when `n` distinct tasks ran, or after `timeoutMs` (resolves false). */
  waitFor(n: number, timeoutMs: number): Promise<boolean> {
    if (this.distinct >= n) return Promise.resolve(true);
    return new Promise((resolve) => {
      const t = setTimeout(() => resolve(false), timeoutMs);
      this.waiters.push({ n, resolve: () => { clearTimeout(t); resolve(true); } });
    });
  }

  /**
   * Closes the measured window: the summary and the cross-check see exactly the handler starts
   * before this instant (a run still firing afterwards would otherwise change one but not the other).
   */
  freeze(): void { this.frozenAt ??= Date.now(); }

  summary(): RecorderSummary {
    let lost = 0; let duplicated = 0;
    for (let i = 0; i < this.expected; i++) { const c = this.counts[i]!; if (c === 0) lost++; else if (c > 1) duplicated++; }
    const fires = this.fires.view();
    const fired: number[] = []; const deliver: number[] = [];
    const lates = this.lates.view();
    for (let i = 0; i < fires.length; i++) {
      if (Number.isNaN(fires[i]!)) continue;
      fired.push(fires[i]!); deliver.push(lates[i]! - fires[i]!);
    }
    const f = fired.length ? summarize(fired) : null; const d = deliver.length ? summarize(deliver) : null;
    return {
      expected: this.expected, runs: this.runs, lost, duplicated, early: this.early, unexpected: this.unexpected, afterWindow: this.afterWindow,
      latencyMs: summarize(lates),
      steadyLatencyMs: this.steady.n ? summarize(this.steady.view()) : null,
      firstStartMs: this.firstStartMs, lastStartMs: this.lastStartMs,
      series: this.series(),
      ...(f && d ? { breakdownMs: { fireP50: f.p50, fireP99: f.p99, deliverP50: d.p50, deliverP99: d.p99 } } : {}),
    };
  }

  private series(): SeriesPoint[] {
    const buckets = new Map<number, { lates: number[]; fires: number[] }>();
    const starts = this.starts.view(); const lates = this.lates.view(); const fires = this.fires.view();
    for (let i = 0; i < starts.length; i++) {
      const s = Math.floor((starts[i]! - this.originMs) / 1000);
      let b = buckets.get(s);
      if (!b) { b = { lates: [], fires: [] }; buckets.set(s, b); }
      b.lates.push(lates[i]!);
      if (!Number.isNaN(fires[i]!)) b.fires.push(fires[i]!);
    }
    return [...buckets.keys()].sort((a, b) => a - b).map((t) => {
      const b = buckets.get(t)!;
      const v = Float64Array.from(b.lates).sort();
      const f = Float64Array.from(b.fires).sort();
      return { t, n: v.length, p50: round(percentile(v, 0.5)), p99: round(percentile(v, 0.99)), max: round(v[v.length - 1]!), ...(f.length ? { fireP99: round(percentile(f, 0.99)) } : {}) };
    });
  }
}

/**
 * How long before the first measured due time the CPU window opens: the horizon (10 s, the
 * furthest ahead ax decides and records a run, for a spread burst) and a second. Earlier than
 * that a node, like BullMQ's worker, only idles: counting it would add idle cost to every run.
 */
export const CPU_AHEAD_MS = 11_000;

/**
 * When a step's CPU window opens (not before creation ended, `now`) and how many warm-up runs,
 * due at `warmDue(i)`, fall in it: they are counted with the measured runs.
 */
export function cpuWindow(now: number, T0: number, warm: number, warmDue: (i: number) => number): { fromMs: number; warmRuns: number } {
  const fromMs = Math.max(now, T0 - CPU_AHEAD_MS);
  let warmRuns = 0;
  for (let i = 0; i < warm; i++) if (warmDue(i) >= fromMs) warmRuns++;
  return { fromMs, warmRuns };
}
