/**
 * Bounded dispatch: at most `max` runs in flight per executor on this node. A full executor
 * refuses new runs (they go to retry with backoff) instead of queueing without bound.
 * Shard actors on one node share executors, so the count lives here, owned by the node and
 * used synchronously (one event loop: no races).
 */
export class InFlightLimiter {
  private counts = new Map<string, number>();
  private limits = new Map<string, number>();
  constructor(private readonly defaultMax: number) {}
  setLimit(executor: string, max: number): void { this.limits.set(executor, max); }
  limitOf(executor: string): number { return Math.min(this.limits.get(executor) ?? this.defaultMax, this.defaultMax); }
  tryAcquire(executor: string): boolean {
    const n = this.counts.get(executor) ?? 0;
    if (n >= this.limitOf(executor)) return false;
    this.counts.set(executor, n + 1);
    return true;
  }
  /** For runs found in flight when a shard is loaded: counted even past the limit. */
  force(executor: string): void { this.counts.set(executor, (this.counts.get(executor) ?? 0) + 1); }
  release(executor: string): void {
    const n = (this.counts.get(executor) ?? 0) - 1;
    if (n <= 0) this.counts.delete(executor); else this.counts.set(executor, n);
  }
  /** Runs in flight per executor (executors with none are left out). */
  byExecutor(): Map<string, number> { return new Map(this.counts); }
  inFlight(executor?: string): number {
    if (executor !== undefined) return this.counts.get(executor) ?? 0;
    let t = 0; for (const v of this.counts.values()) t += v; return t;
  }
}
