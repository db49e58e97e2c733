import * as hdr from "hdr-histogram-js";

/** Wall-clock epoch ms with sub-millisecond resolution (the scheduler's due times are Date.now() based). */
export const wallNow = (): number => performance.timeOrigin + performance.now();

export interface LatencySummary { p50: number; p90: number; p99: number; max: number }
export interface SeriesPoint { t: number; n: number; p50: number; p99: number; max: number; /** due → fired, p99 (the rest is fired → handler start) */ fireP99?: number }

export interface RecorderSummary {
  expected: number;
  runs: number;
  /** Tasks never run. */
  lost: number;
  /** Tasks run more than once. */
  duplicated: number;
  latencyMs: LatencySummary;
  /**
   * Lateness of the runs due after the first WARMUP_MS of the run: the steady state, without the
   * cold start (JIT, first plans and connections) that dominates p99 in a one-minute run. Both
   * systems are measured the same way; latencyMs stays the whole-run figure.
   */
  steadyLatencyMs: LatencySummary | null;
  firstStartMs: number | null;
  lastStartMs: number | null;
  /** Per second since `originMs`: count and lateness percentiles (the plot). */
  series: SeriesPoint[];
  /** Where the lateness was spent: due → fired (wheel tick, mailbox, scheduling) and fired → handler start (write, publish, delivery). */
  breakdownMs?: { fireP50: number; fireP99: number; deliverP50: number; deliverP99: number };
}

const round = (v: number, d = 1) => Math.round(v * 10 ** d) / 10 ** d;
export const WARMUP_MS = 5000;
const newHist = (digits: 1 | 2 | 3 | 4 | 5 = 3) => hdr.build({ lowestDiscernibleValue: 1, highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: digits });
const summarize = (h: ReturnType<typeof newHist>): LatencySummary => {
  const ms = (us: number) => round(us / 1000);
  return { p50: ms(h.getValueAtPercentile(50)), p90: ms(h.getValueAtPercentile(90)), p99: ms(h.getValueAtPercentile(99)), max: ms(h.maxValue) };
};

/**
 * Lateness recorder: handler start − due time, per task index. An HDR histogram (µs, 3
 * significant digits) for the percentiles, a per-task run count for lost / duplicated, and
 * (start, lateness) pairs for the lateness-over-time plot.
 */
export class Recorder {
  private readonly hist = newHist();
  private steadyHist = newHist();
  private counts: Uint8Array;
  private starts: number[] = [];
  private lates: number[] = [];
  private fires: number[] = [];
  runs = 0;
  firstStartMs: number | null = null;
  lastStartMs: number | null = null;
  private waiters: Array<{ n: number; resolve: () => void }> = [];

  constructor(readonly expected: number, readonly originMs: number) {
    this.counts = new Uint8Array(expected);
  }

  /** Number of distinct tasks that ran at least once. */
  distinct = 0;

  private fireHist = newHist(2);
  private deliverHist = newHist(2);
  /** `firedMs` (when the scheduler decided to fire) splits the lateness into its two halves. */
  record(index: number, dueMs: number, startMs = wallNow(), firedMs?: number): void {
    const late = Math.max(0, startMs - dueMs);
    if (firedMs !== undefined) {
      this.fireHist.recordValue(Math.round(Math.max(0, firedMs - dueMs) * 1000));
      this.deliverHist.recordValue(Math.round(Math.max(0, startMs - firedMs) * 1000));
    }
    this.hist.recordValue(Math.round(late * 1000));
    if (dueMs >= this.originMs + WARMUP_MS) this.steadyHist.recordValue(Math.round(late * 1000));
    this.runs++;
    if (index >= 0 && index < this.expected) {
      const c = this.counts[index]!;
      if (c === 0) this.distinct++;
      if (c < 255) this.counts[index] = c + 1;
    }
    if (this.firstStartMs === null || startMs < this.firstStartMs) this.firstStartMs = startMs;
    if (this.lastStartMs === null || startMs > this.lastStartMs) this.lastStartMs = startMs;
    this.starts.push(startMs);
    this.lates.push(late);
    this.fires.push(firedMs === undefined ? NaN : Math.max(0, firedMs - dueMs));
    if (this.waiters.length) {
      this.waiters = this.waiters.filter((w) => { if (this.distinct >= w.n) { w.resolve(); return false; } return true; });
    }
  }

  /** Resolves when `n` distinct tasks ran, or after `timeoutMs` (resolves false). */
  waitFor(n: number, timeoutMs: number): Promise<boolean> {
    if (this.distinct >= n) return Promise.resolve(true);
    return new Promise((resolve) => {
      const t = setTimeout(() => resolve(false), timeoutMs);
      this.waiters.push({ n, resolve: () => { clearTimeout(t); resolve(true); } });
    });
  }

  summary(): RecorderSummary {
    let lost = 0; let duplicated = 0;
    for (let i = 0; i < this.expected; i++) { const c = this.counts[i]!; if (c === 0) lost++; else if (c > 1) duplicated++; }
    const h = this.hist;
    const ms = (us: number) => round(us / 1000);
    return {
      expected: this.expected, runs: this.runs, lost, duplicated,
      latencyMs: h.totalCount ? summarize(h) : { p50: NaN, p90: NaN, p99: NaN, max: NaN },
      steadyLatencyMs: this.steadyHist.totalCount ? summarize(this.steadyHist) : null,
      firstStartMs: this.firstStartMs, lastStartMs: this.lastStartMs,
      series: this.series(),
      ...(this.fireHist.totalCount ? { breakdownMs: {
        fireP50: ms(this.fireHist.getValueAtPercentile(50)), fireP99: ms(this.fireHist.getValueAtPercentile(99)),
        deliverP50: ms(this.deliverHist.getValueAtPercentile(50)), deliverP99: ms(this.deliverHist.getValueAtPercentile(99)),
      } } : {}),
    };
  }

  private series(): SeriesPoint[] {
    const buckets = new Map<number, { lates: number[]; fires: number[] }>();
    for (let i = 0; i < this.starts.length; i++) {
      const s = Math.floor((this.starts[i]! - this.originMs) / 1000);
      let b = buckets.get(s);
      if (!b) { b = { lates: [], fires: [] }; buckets.set(s, b); }
      b.lates.push(this.lates[i]!);
      if (!Number.isNaN(this.fires[i])) b.fires.push(this.fires[i]!);
    }
    const at = (v: number[], q: number) => v[Math.min(v.length - 1, Math.floor(q * v.length))]!;
    return [...buckets.keys()].sort((a, b) => a - b).map((t) => {
      const b = buckets.get(t)!;
      const v = b.lates.sort((x, y) => x - y);
      const f = b.fires.sort((x, y) => x - y);
      return { t, n: v.length, p50: round(at(v, 0.5)), p99: round(at(v, 0.99)), max: round(v[v.length - 1]!), ...(f.length ? { fireP99: round(at(f, 0.99)) } : {}) };
    });
  }
}
