/**
 * Bounded dispatch: at most `max` runs in flight per executor on this node. A scheduled run that
 * finds its executor full waits for a free place, earliest due time first, instead of being
 * refused and retried: refusing at the bound turned a burst of 100,000 runs into 800,000 run rows
 * (each refusal wrote a row and scheduled a retry that met the same full executor), and the
 * PostgreSQL load it caused starved the node's lease renewals. Waiting costs no row: one entry
 * here per waiting task (a task waits for at most one slot at a time) and its row held in its
 * shard's memory until its place comes, so both are bounded by the number of tasks the node owns.
 *
 * Shard actors on one node share executors, so the count and the queue live here, owned by the
 * node and used synchronously (one event loop: no races). A waiter is told it has a place through
 * its `wake` callback, which posts mail to its shard; the place is then the shard's (it must use
 * it for a dispatch or give it back with `release`). A waiter whose shard stopped, or whose task
 * no longer waits for that due time, answers false and the place goes to the next one.
 */
export interface CapacityWaiter {
  dueMs: number;
  /** True: the waiter took the place. False: it no longer wants it (stale). */
  wake: () => boolean;
}

export class InFlightLimiter {
  private counts = new Map<string, number>();
  private limits = new Map<string, number>();
  /** Executors whose limit was set (their own, or null: the node's). */
  private known = new Set<string>();
  private queues = new Map<string, WaiterHeap>();
  /** Places outside the limit: runs sent ahead to executors that hold them (see tryAcquireAhead). */
  private aheadCounts = new Map<string, number>();
  /**
   * `placesAhead.max`: runs per executor that may be placed ahead of the lead outside the limit (0:
   * none; every run takes a place under the limit); `placesAhead.holds`: does the executor hold runs
   * received ahead of their due time until it (the node's registrations, as the Persister asks)?
   */
  constructor(private readonly defaultMax: number,
    private readonly placesAhead: { max: number; holds: (executor: string) => boolean } = { max: 0, holds: () => false }) {}

  /** The executor's own limit (never above the node's); null: the node's. */
  setLimit(executor: string, max: number | null): void {
    this.known.add(executor);
    if (max === null) this.limits.delete(executor); else this.limits.set(executor, max);
    this.pump(executor);
  }
  limitOf(executor: string): number { return Math.min(this.limits.get(executor) ?? this.defaultMax, this.defaultMax); }

  /** A place now, if the executor has one and nobody due earlier waits for it. */
  tryAcquire(executor: string): boolean {
    this.pump(executor);
    if (this.waiting(executor) > 0) return false;
    const n = this.counts.get(executor) ?? 0;
    if (n >= this.limitOf(executor)) return false;
    this.counts.set(executor, n + 1);
    return true;
  }

  /**
   * A place for a run decided further ahead than the lead (the horizon spread a burst due at one
   * instant over the seconds before it), at an executor that holds runs until their due time.
   * It is outside the limit, which bounds what an executor works on or is offered now: a held run
   * costs its executor memory until its due time, not a handler, so these places are bounded by
   * `placesAhead.max` instead. Only while nobody waits for a place: a run due now never waits behind one
   * due later. False: take a place under the limit as any run does.
   */
  tryAcquireAhead(executor: string): boolean {
    if (!this.mayGoAhead(executor)) return false;
    this.aheadCounts.set(executor, (this.aheadCounts.get(executor) ?? 0) + 1);
    return true;
  }

  /** Would tryAcquireAhead give a place now? */
  mayGoAhead(executor: string): boolean {
    return this.placesAhead.holds(executor) && this.waiting(executor) === 0 && (this.aheadCounts.get(executor) ?? 0) < this.placesAhead.max;
  }

  /** Runs placed ahead per executor (see tryAcquireAhead), finished or withdrawn ones not counted. */
  ahead(executor?: string): number {
    if (executor !== undefined) return this.aheadCounts.get(executor) ?? 0;
    let t = 0; for (const v of this.aheadCounts.values()) t += v; return t;
  }

  /** Queues a waiter (after a failed tryAcquire); it is woken, earliest due first, as places free. */
  wait(executor: string, waiter: CapacityWaiter): void {
    let q = this.queues.get(executor);
    if (!q) { q = new WaiterHeap(); this.queues.set(executor, q); }
    q.push(waiter);
    this.pump(executor);
  }

  /** Runs waiting for a place (stale entries of stopped shards included until they are reached). */
  waiting(executor?: string): number {
    if (executor !== undefined) return this.queues.get(executor)?.size ?? 0;
    let t = 0; for (const q of this.queues.values()) t += q.size; return t;
  }

  /** For runs found in flight when a shard is loaded: counted even past the limit. */
  force(executor: string): void { this.counts.set(executor, (this.counts.get(executor) ?? 0) + 1); }

  /** A place given back; `ahead`: one of tryAcquireAhead's (which frees no place under the limit). */
  release(executor: string, ahead = false): void {
    if (ahead) {
      const a = (this.aheadCounts.get(executor) ?? 0) - 1;
      if (a <= 0) this.aheadCounts.delete(executor); else this.aheadCounts.set(executor, a);
      return;
    }
    const n = (this.counts.get(executor) ?? 0) - 1;
    if (n <= 0) this.counts.delete(executor); else this.counts.set(executor, n);
    this.pump(executor);
  }
  /** The limit that applies to each executor this node knows (its own, or else the node's). */
  limitsByExecutor(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const e of new Set([...this.known, ...this.counts.keys(), ...this.queues.keys()])) out[e] = this.limitOf(e);
    return out;
  }
  /** Runs in flight per executor, those placed ahead included (executors with none are left out). */
  byExecutor(): Map<string, number> {
    const out = new Map(this.counts);
    for (const [e, n] of this.aheadCounts) out.set(e, (out.get(e) ?? 0) + n);
    return out;
  }
  inFlight(executor?: string): number {
    if (executor !== undefined) return this.counts.get(executor) ?? 0;
    let t = 0; for (const v of this.counts.values()) t += v; return t;
  }

  /** Hands free places to waiters, earliest due first; stale waiters are dropped on the way. */
  private pump(executor: string): void {
    const q = this.queues.get(executor);
    if (!q) return;
    while (q.size > 0 && (this.counts.get(executor) ?? 0) < this.limitOf(executor)) {
      const w = q.pop()!;
      if (w.wake()) this.counts.set(executor, (this.counts.get(executor) ?? 0) + 1);
    }
    if (q.size === 0) this.queues.delete(executor);
  }
}

/** A binary min-heap on due time; ties keep no particular order. */
class WaiterHeap {
  private items: CapacityWaiter[] = [];
  get size(): number { return this.items.length; }

  push(w: CapacityWaiter): void {
    const a = this.items;
    a.push(w);
    let i = a.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (a[parent]!.dueMs <= a[i]!.dueMs) break;
      [a[parent], a[i]] = [a[i]!, a[parent]!];
      i = parent;
    }
  }

  pop(): CapacityWaiter | undefined {
    const a = this.items;
    const top = a[0];
    const last = a.pop();
    if (a.length === 0 || last === undefined) return top;
    a[0] = last;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1, r = l + 1;
      let m = i;
      if (l < a.length && a[l]!.dueMs < a[m]!.dueMs) m = l;
      if (r < a.length && a[r]!.dueMs < a[m]!.dueMs) m = r;
      if (m === i) break;
      [a[m], a[i]] = [a[i]!, a[m]!];
      i = m;
    }
    return top;
  }
}
