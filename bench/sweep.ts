/**
 * The max-rate sweep's next step, shared by ax and the BullMQ peer so both are searched alike:
 * grow by 1.5x until a step fails, halve until one passes, then bisect until the bracket is
 * within 10 %. null = done. A step that fails on lateness alone is run once more first (see
 * runAgain).
 */
export function nextSweepRate(rate: number, lo: number, hi: number): number | null {
  if (hi === Infinity) return Math.round(rate * 1.5);
  if (lo === 0) return Math.round(rate / 2);
  if (hi / lo > 1.1) return Math.round((lo + hi) / 2);
  return null;
}

/**
 * The unmeasured step both sweeps run first on their fresh processes: half the start rate for
 * half a window (at most 5 s). Without it the first measured step also measured the cold start.
 */
export function sweepWarmUp(start: number, windowS: number): { rate: number; tasks: number } {
  const rate = Math.max(1, Math.round(start / 2));
  return { rate, tasks: Math.round(rate * Math.min(5, windowS / 2)) };
}

/**
 * Whether a failed step is run once more before it counts: when it failed on lateness alone (no
 * run lost, doubled or early) and this rate was not retried yet. On a shared 2-core box one slow
 * second fails a 10 s step, and a failure sets the bracket's top for the rest of the search: in
 * one table both systems failed their first step (ax p99 110 ms, BullMQ 183 ms at 6,000/s) and
 * were then searched below rates they had kept in other rows of the same run.
 */
export function runAgain(rate: number, correct: boolean, retried: Set<number>): boolean {
  if (!correct || retried.has(rate)) return false;
  retried.add(rate);
  return true;
}

/**
 * The sweep's bookkeeping, the same object for ax and the peer: the rate to measure now, and
 * after each measured step what comes next — the same rate once more (runAgain), the next rate
 * (nextSweepRate over the bracket of passing and failing rates), or null when the search is done.
 */
export class RateSearch {
  private lo = 0;
  private hi = Infinity;
  private readonly retried = new Set<number>();
  constructor(public rate: number) {}
  /** After a step at `this.rate`: `pass` met every criterion; `correct`: none lost, doubled or early. */
  next(pass: boolean, correct: boolean): "again" | number | null {
    if (!pass && runAgain(this.rate, correct, this.retried)) return "again";
    if (pass) this.lo = this.rate; else this.hi = this.rate;
    const next = nextSweepRate(this.rate, this.lo, this.hi);
    if (next !== null) this.rate = next;
    return next;
  }
}
