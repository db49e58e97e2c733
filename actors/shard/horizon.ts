import type { Clock, Logger } from "../../common/index.ts";
import { HashedWheel, type WheelRef } from "../wheel/index.ts";
import type { DueIndex, Store } from "../store/index.ts";

/**
 * What the wheel holds for a shard:
 * k 0: a task's due time (`due`; the entry is placed `leadMs` before it, on the decision grid, see schedule());
 * k 1: a run's timeout.
 */
export type WheelItem = { k: 0; id: number; due: number } | { k: 1; runId: string };

/** A round's changes to the shard's due index in Redis, applied once its write is durable. */
export interface DueIndexChanges {
  redisAdd: Array<{ id: number; dueMs: number }>;
  redisRemove: number[];
}

export interface HorizonOptions {
  shard: number;
  tickMs: number;
  wheelSize: number;
  clock: Clock;
  log: Logger;
  due: Pick<DueIndex, "rebuildFrom" | "takeDue">;
  store: Pick<Store, "dueOfShard">;
  /** How far ahead due times are taken from Redis into the wheel (default: the wheel's span, at most 10 s). */
  horizonMs?: number;
  /** How often due entries are taken from Redis (default 250 ms, at most a quarter of the horizon). */
  refillEveryMs?: number;
  /** How long before its due time a task's run is decided (default 100 ms, at most half the horizon). */
  leadMs?: number;
  /**
   * The decision grid (default 0: none). Entries placed ahead are placed at the last multiple of
   * it (wall-clock epoch ms) at or before `due - leadMs`, so a shard decides the runs due in one
   * step together, between `leadMs` and `leadMs + decideStepMs` ahead, and every shard of a node
   * on the same instants (one round each, written in one batch) instead of at every tick.
   * At most `leadMs`.
   */
  decideStepMs?: number;
  /**
   * At most this many due times are placed on one step of the decision grid (default 0: no
   * bound). Past it they go on the latest earlier step with room, down to now: a burst of runs
   * due at one instant is decided and written over the seconds before it, at the pace the node
   * can keep, rather than all in the lead before it. Needs a decision grid.
   */
  perStep?: number;
  random?: () => number;
  /** Entries that came due on the wheel (tasks and timeouts), one call per tick. */
  onDue: (items: Array<{ dueMs: number; item: WheelItem }>, lateMs: number) => void;
  /** Entries the refill took from Redis for the near horizon. */
  onRefilled: (items: Array<{ id: number; dueMs: number }>) => void;
  /** The shard is active (refills stop otherwise). */
  active: () => boolean;
  /**
   * The due times the shard's decisions hold in memory that neither the wheel nor a wait for a
   * place keeps: a rebuild of the index puts them back (DueIndex.rebuildFrom).
   */
  inMemory?: () => Array<{ id: number; dueMs: number }>;
}

/** The furthest ahead a shard holds due times on its wheel (less with a smaller tick × wheel size). */
export const MAX_HORIZON_MS = 10_000;

/** The longest a shard waits between refills that find nothing due (see scheduleRefill). */
export const IDLE_REFILL_MAX_MS = 1000;

/**
 * A shard's horizon: the near future on a hashed wheel (due times within `horizonMs`, run
 * timeouts), the far future in the due index in Redis, and the refill that moves entries from
 * the one to the other. The actor decides; this module only remembers when to tell it.
 */
export class Horizon {
  readonly horizonMs: number;
  readonly leadMs: number;
  readonly decideStepMs: number;
  private readonly refillEveryMs: number;
  private readonly wheel: HashedWheel<WheelItem>;
  /**
   * Tasks due within the horizon. `inRedis`: the due index may still hold an entry for the task
   * (the API wrote one and asked the shard to load it); an entry the refill took holds none, so
   * firing or moving the task needs no removal from Redis.
   */
  private readonly inWheel = new Map<number, { dueMs: number; ref: WheelRef; inRedis: boolean }>();
  /**
   * Tasks off the wheel whose due-index entry is known to be gone: the refill took it (their
   * wheel entry came up without one), or a round removed it, and nothing was scheduled for them
   * since. Unscheduling such a task again (the round that ends a one-shot's run, a removal)
   * removes nothing from Redis: before, every completed one-shot task cost a ZREM of an entry
   * that was not there (half a Redis command per run at 4,000/s, one per shard and round).
   * Forgotten with the task's row (forget), so it holds no more than the shard's live tasks;
   * a task not in it is removed from Redis as before. Were Redis to hold an entry after all (a
   * ZREM that failed), the refill brings it back and onDue skips it: the row's due time decides.
   */
  private readonly unindexed = new Set<number>();
  /**
   * Due times placed per step of the decision grid (see perStep). Only counted up: an entry taken
   * off leaves its count, so a step is at worst thought fuller than it is (the run is decided a
   * step earlier). Steps in the past are dropped as the map grows.
   */
  private readonly stepLoad = new Map<number, number>();
  /** The last spread: entries due on step `from` were placed down to step `to` (the steps between are full). */
  private lastSpread = { from: NaN, to: NaN };
  private refillTimer: ReturnType<Clock["setTimeout"]> | null = null;
  private refilling: Promise<void> | null = null;
  private refills = 0;
  /** Refills in a row that took nothing: the next one waits twice as long, up to IDLE_REFILL_MAX_MS. */
  private emptyRefills = 0;
  /** refillSoon came while a refill was in flight: another follows it at once. */
  private refillAgain = false;
  /** The earliest due time the last refill left in the index (null: none, or not known). */
  private nextDueMs: number | null = null;

  constructor(private readonly o: HorizonOptions) {
    this.horizonMs = o.horizonMs ?? Math.min(MAX_HORIZON_MS, o.tickMs * o.wheelSize);
    this.leadMs = Math.max(0, Math.min(o.leadMs ?? 100, this.horizonMs / 2));
    this.decideStepMs = Math.max(0, Math.min(o.decideStepMs ?? 0, this.leadMs));
    this.refillEveryMs = o.refillEveryMs ?? Math.max(50, Math.min(250, Math.floor(this.horizonMs / 4)));
    this.wheel = new HashedWheel<WheelItem>({
      tickMs: o.tickMs, size: o.wheelSize, clock: o.clock,
      onExpire: (items, info) => o.onDue(items, info.lateMs),
    });
  }

  /** Entries on the wheel (due times and timeouts). */
  get size(): number { return this.wheel.size; }

  /**
   * How long until the wheel's tick that hands over the next step of the decision grid (the next
   * tick without a grid): mail that can wait for a round goes with that step's due times, one
   * round instead of two, and every shard of the node decides it in the same turn.
   */
  nextStepDelayMs(): number {
    const now = this.o.clock.now(); const step = this.decideStepMs;
    return this.wheel.msUntilTickFor(step > 0 ? (Math.floor(now / step) + 1) * step : now);
  }

  start(): void { this.wheel.start(); }

  /** Stops the wheel and the refills (a refill in flight finishes: see settled). */
  halt(): void {
    this.wheel.stop();
    if (this.refillTimer) this.o.clock.clearTimeout(this.refillTimer);
  }

  /** Resolves once a refill in flight has handed its entries over. */
  async settled(): Promise<void> { await this.refilling?.catch(() => undefined); }

  // ---- due times of tasks ------------------------------------------------------------------

  /** Within the horizon: on the wheel, `leadMs` ahead. Beyond it: into the due index with the round. */
  schedule(changes: DueIndexChanges, id: number, dueMs: number, inRedis = false): void {
    this.unindexed.delete(id);
    if (dueMs <= this.o.clock.now() + this.horizonMs) {
      // Placed `leadMs` ahead: the run is decided and written before its due time and released
      // (published) at it by the node's round (Persister), so the write is not on the fire path.
      this.inWheel.set(id, { dueMs, ref: this.wheel.add(this.placeAt(dueMs), { k: 0, id, due: dueMs }), inRedis });
    } else {
      changes.redisAdd.push({ id, dueMs });
      this.noteIndexed(dueMs);
    }
  }

  /** A due time this shard put into the index: the next refill comes by the time it is within the horizon. */
  private noteIndexed(dueMs: number): void {
    if (this.nextDueMs === null || dueMs < this.nextDueMs) this.nextDueMs = dueMs;
  }

  /** When a run due at `dueMs` is decided: `leadMs` ahead, rounded down to the decision grid. */
  decideAt(dueMs: number): number {
    const at = dueMs - this.leadMs;
    return this.decideStepMs > 0 ? Math.floor(at / this.decideStepMs) * this.decideStepMs : at;
  }

  /**
   * Where a due time goes on the wheel: decideAt, unless that step already holds `perStep`
   * entries; then the latest earlier step with room, down to the current step (an entry placed
   * there is decided at the next tick).
   */
  private placeAt(dueMs: number): number {
    const at = this.decideAt(dueMs);
    const cap = this.o.perStep ?? 0;
    const step = this.decideStepMs;
    if (cap <= 0 || step <= 0) return at;
    const now = this.o.clock.now();
    const current = Math.floor(now / step) * step;
    if (at <= current) return at;
    let to = at;
    // Entries of a burst come in due order: the steps the last one of its step skipped are still full.
    if (this.lastSpread.from === at && this.lastSpread.to < at) to = this.lastSpread.to;
    while (to > current && (this.stepLoad.get(to) ?? 0) >= cap) to -= step;
    if (to < current) to = current;
    this.lastSpread = { from: at, to };
    this.stepLoad.set(to, (this.stepLoad.get(to) ?? 0) + 1);
    if (this.stepLoad.size > 2 * Math.ceil(this.horizonMs / step) + 16) {
      for (const k of this.stepLoad.keys()) if (k < current) this.stepLoad.delete(k);
    }
    return to;
  }

  /** The task's entry on the wheel, cancelled and forgotten (undefined if it had none). */
  takeOff(id: number): { dueMs: number; inRedis: boolean } | undefined {
    const w = this.inWheel.get(id);
    if (w) { this.wheel.cancel(w.ref); this.inWheel.delete(id); }
    return w;
  }

  /** Takes the task's due time off the wheel and, where the due index may hold it, out of Redis. */
  unschedule(changes: DueIndexChanges, id: number): void {
    const w = this.takeOff(id);
    const gone = w ? !w.inRedis : this.unindexed.has(id);
    if (!gone) changes.redisRemove.push(id);
    this.unindexed.add(id);
  }

  /** Back into the due index with the round (not fired now: the shard is handing over, no place was free). */
  backToIndex(changes: DueIndexChanges, id: number, dueMs: number): void {
    this.unindexed.delete(id);
    changes.redisAdd.push({ id, dueMs });
    this.noteIndexed(dueMs);
  }

  /** The task's row left memory: what was known about its index entry goes too. */
  forget(id: number): void { this.unindexed.delete(id); }

  /** The task's due time on the wheel, if it has one. */
  dueOf(id: number): number | undefined { return this.inWheel.get(id)?.dueMs; }

  /**
   * A task's wheel entry came up: the current one for that due time? If so it leaves the wheel
   * and is returned (with whether Redis may still hold it); a superseded copy returns undefined.
   */
  cameDue(id: number, dueMs: number): { inRedis: boolean } | undefined {
    const w = this.inWheel.get(id);
    if (!w || w.dueMs !== dueMs) return undefined;
    this.inWheel.delete(id);
    if (!w.inRedis) this.unindexed.add(id);
    return w;
  }

  /**
   * Put back on the wheel where it goes without spreading (decideAt): a run spread ahead whose
   * executor cannot take it ahead now is decided in the lead, as any run is.
   */
  deferToLead(id: number, dueMs: number, inRedis: boolean): void { this.putBack(id, dueMs, inRedis, this.decideAt(dueMs)); }

  /** Put back on the wheel at its due time itself (decided then, not `leadMs` ahead). */
  holdUntilDue(id: number, dueMs: number, inRedis: boolean): void { this.putBack(id, dueMs, inRedis, dueMs); }

  /** A due time that came up goes back on the wheel, to come up again at `atMs`. */
  private putBack(id: number, dueMs: number, inRedis: boolean, atMs: number): void {
    this.unindexed.delete(id);
    this.inWheel.set(id, { dueMs, ref: this.wheel.add(atMs, { k: 0, id, due: dueMs }), inRedis });
  }

  /**
   * Entries from Redis onto the wheel. An entry for a task already on the wheel at another time
   * is one of the two copies of a reschedule still in flight (the round that moved it removes
   * the old entry from Redis only after its write). Neither copy is trusted: `currentDue`, from
   * the task's row loaded for this round, says which time is current.
   */
  refilled(changes: DueIndexChanges, items: ReadonlyArray<{ id: number; dueMs: number }>, currentDue: (id: number) => number | null | undefined): void {
    for (const it of items) {
      const w = this.inWheel.get(it.id);
      if (!w) { this.schedule(changes, it.id, it.dueMs); continue; }
      w.inRedis = false; // the refill took the index's entry for this task
      if (w.dueMs === it.dueMs) continue;
      const due = currentDue(it.id);
      if (due === null || due === undefined || due === w.dueMs) continue; // the wheel's copy stands (or onDue skips both)
      this.takeOff(it.id);
      this.schedule(changes, it.id, due);
    }
  }

  /** Every task due time on the wheel (handed back to Redis when the shard is released). */
  dueTimes(): Array<{ id: number; dueMs: number }> {
    return [...this.inWheel].map(([id, w]) => ({ id, dueMs: w.dueMs }));
  }

  // ---- timeouts of runs ----------------------------------------------------------------------

  addTimeout(atMs: number, runId: string): WheelRef { return this.wheel.add(atMs, { k: 1, runId }); }
  cancel(ref: WheelRef): void { this.wheel.cancel(ref); }

  // ---- refill from the due index ---------------------------------------------------------------

  /**
   * Takes the near horizon's due entries out of Redis and hands them over (onRefilled). The Redis
   * calls run beside the rounds, not inside one: at thousands of runs a second a refill moves
   * thousands of entries, and a round waiting for it held back every fire of the shard.
   * One refill at a time; the next is scheduled when it ends.
   */
  refill(): Promise<void> {
    if (!this.o.active() || this.refilling) return this.refilling ?? Promise.resolve();
    this.refilling = (async () => {
      let took = 0;
      try {
        for (let rebuilt = false; ;) {
          if (!this.o.active()) break;
          const taken = await this.o.due.takeDue(this.o.shard, this.o.clock.now() + this.horizonMs, 5000);
          if (taken === null) {
            // Once per refill: should it still be missing right after, the next refill tries again.
            if (rebuilt) break;
            this.o.log.warn("due index missing in Redis: rebuilding from the shard's memory and PostgreSQL");
            await this.o.due.rebuildFrom(this.o.shard, { memory: () => this.o.inMemory?.() ?? [], stored: () => this.o.store.dueOfShard(this.o.shard) });
            rebuilt = true;
            continue;
          }
          const items = taken.items;
          took += items.length;
          this.nextDueMs = taken.nextDueMs;
          if (items.length) this.o.onRefilled(items);
          if (items.length < 5000) break;
        }
      } catch (e) {
        // Redis unreachable: entries not taken stay there; the next refill tries again.
        this.o.log.warn({ err: String(e) }, "refill from the due index failed");
        took = -1; // not backed off: Redis may come back with entries due
        this.nextDueMs = null;
      } finally {
        this.emptyRefills = took === 0 ? this.emptyRefills + 1 : 0;
        this.refilling = null;
        if (this.refillAgain) { this.refillAgain = false; this.emptyRefills = 0; void this.refill(); } else this.scheduleRefill();
      }
    })();
    return this.refilling;
  }

  /**
   * Entries may have come into the index that are due soon (the API handed a task over, or wrote
   * a bulk of them): refill now instead of at a backed-off time. Coalesced: one refill at a time,
   * and at most one more right after it.
   */
  refillSoon(): void {
    if (!this.o.active()) return;
    if (this.refilling) { this.refillAgain = true; return; }
    if (this.refillTimer) { this.o.clock.clearTimeout(this.refillTimer); this.refillTimer = null; }
    this.emptyRefills = 0;
    void this.refill();
  }

  private scheduleRefill(): void {
    if (!this.o.active()) return;
    // The first one after loading at a random point of the period, so the shards of a node do not
    // all refill in the same instant. A shard whose refills keep finding nothing due within the
    // horizon backs off (250, 500, 1000 ms): most of an idle 64-shard node's Redis calls were
    // these. But never past the moment the earliest due time left in the index comes within the
    // horizon (the take says which), so a burst known ahead is taken as early as before, and what
    // the shard itself puts into the index (due beyond the horizon) likewise. What the API writes
    // later and due sooner comes with a hand-over (refillSoon), or waits for at most 1 s.
    let period = Math.min(IDLE_REFILL_MAX_MS, this.refillEveryMs * 2 ** Math.min(this.emptyRefills, 2));
    if (this.nextDueMs !== null) period = Math.min(period, this.nextDueMs - this.horizonMs - this.o.clock.now());
    const delay = this.refills++ === 0 ? Math.floor((this.o.random ?? Math.random)() * this.refillEveryMs) : Math.max(this.refillEveryMs, period);
    this.refillTimer = this.o.clock.setTimeout(() => { this.refillTimer = null; void this.refill(); }, delay);
  }
}
