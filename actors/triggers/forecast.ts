import { InvalidInputError } from "../../common/index.ts";
import { cachedCron, cronPrev } from "./cron.ts";
import { exclusionOf, jitterFor, windowed, zoneOfSpec, type Calendar, type ScheduleOptions } from "./options.ts";
import { planAfter } from "./plan.ts";
import type { CompiledTrigger, MisfirePolicy, TriggerSpec } from "./types.ts";

/**
 * Slots ahead of time, for `ax forecast` and `ax task backfill`. Pure: the caller hands in each
 * task's compiled trigger, options, calendar and state; nothing here reads a clock or a store.
 */

/** Most slots one listing walks (a backfill, or all tasks of one forecast together). */
export const MAX_LISTED_SLOTS = 2_000_000;

export class TooManySlotsError extends InvalidInputError {
  constructor(field: string, limit: number) {
    super(field, limit, `the window holds more than ${limit} slots; narrow it`);
  }
}

/** Every slot s of `t` with fromMs <= s <= toMs, ascending; at most `cap` (more throws TooManySlotsError). */
export function slotsBetween(t: CompiledTrigger, fromMs: number, toMs: number, cap: number, field = "to"): number[] {
  const out: number[] = [];
  for (let s = t.next(fromMs - 1); s !== null && s <= toMs; s = t.next(s)) {
    if (out.length >= cap) throw new TooManySlotsError(field, cap);
    out.push(s);
  }
  return out;
}

/** The last slot at or before `x` (null: none). Cron walks backwards; fixed rate is arithmetic; once is its instant. */
export function lastSlotAtOrBefore(spec: TriggerSpec, t: CompiledTrigger, x: number): number | null {
  switch (spec.kind) {
    case "cron": {
      const dst = { ...(spec.dstGap ? { gap: spec.dstGap } : {}), ...(spec.dstRepeat ? { repeat: spec.dstRepeat } : {}) };
      return cronPrev(cachedCron(spec.expr, spec.tz, dst), x + 1);
    }
    case "fixed_rate": {
      const k = Math.floor((x - spec.anchorMs) / spec.everyMs);
      return k >= 1 ? spec.anchorMs + k * spec.everyMs : null;
    }
    case "once": return spec.atMs <= x ? spec.atMs : null;
    case "fixed_delay": return null;
  }
  void t;
  return null;
}

/** One task's trigger as the forecast sees it. */
export interface ForecastTrigger {
  /** The task's name: the jitter key. */
  task: string;
  triggerId: number;
  spec: TriggerSpec;
  compiled: CompiledTrigger;
  options: ScheduleOptions | null;
  calendar: Calendar | null;
  /** Slots this trigger has fired so far (for --max-runs) and the latest of them (null: none). */
  taken: number;
  lastSlotMs: number | null;
  createdMs: number;
}

/**
 * The due times of the runs one trigger will fire with a due time in [fromMs, toMs): its slots
 * inside its window, minus calendar-excluded dates, while --max-runs lasts (slots between its
 * last fired slot and fromMs use up runs first), each delayed by its jitter. `budget` counts
 * the slots walked, shared by every trigger of one forecast.
 */
export function forecastDues(f: ForecastTrigger, fromMs: number, toMs: number, budget: { left: number }): number[] {
  const o = f.options ?? {};
  const t = windowed(f.compiled, o);
  const jitter = o.jitterMs ?? 0;
  const zone = zoneOfSpec(f.spec);
  let left = o.maxRuns !== undefined ? o.maxRuns - f.taken : Infinity;
  const out: number[] = [];
  if (left <= 0) return out;
  // With a run limit, every slot from the last fired one uses up a run; without, the walk starts
  // just before the window (less the jitter). A cron trigger has no slot before its creation.
  const floor = f.spec.kind === "cron" ? f.createdMs : Number.MIN_SAFE_INTEGER;
  let s: number | null = o.maxRuns !== undefined
    ? t.next(f.lastSlotMs ?? floor)
    : t.next(Math.max(fromMs - jitter - 1, floor));
  for (; s !== null && s < toMs && left > 0; s = t.next(s)) {
    if (--budget.left < 0) throw new TooManySlotsError("to", MAX_LISTED_SLOTS);
    if (f.calendar && exclusionOf(s, zone, f.calendar)) continue;
    left--;
    const due = s + (jitter ? jitterFor(f.task, s, jitter) : 0);
    if (due >= fromMs && due < toMs) out.push(due);
  }
  return out;
}

export type ForecastPer = "minute" | "hour";
export const PER_MS: Record<ForecastPer, number> = { minute: 60_000, hour: 3_600_000 };

/** Counts per bucket (bucket = floor(due / per) * per, UTC-aligned), the busiest bucket, the total. */
export function bucketize(dues: Iterable<number>, per: ForecastPer): { buckets: Array<{ atMs: number; fires: number }>; peak: { atMs: number; fires: number } | null; total: number } {
  const size = PER_MS[per];
  const m = new Map<number, number>();
  let total = 0;
  for (const d of dues) {
    const b = Math.floor(d / size) * size;
    m.set(b, (m.get(b) ?? 0) + 1);
    total++;
  }
  const buckets = [...m].sort((a, b) => a[0] - b[0]).map(([atMs, fires]) => ({ atMs, fires }));
  let peak: { atMs: number; fires: number } | null = null;
  for (const b of buckets) if (!peak || b.fires > peak.fires) peak = b;
  return { buckets, peak, total };
}

export interface WhatIf {
  /** Slots that fell in the outage (cron stops counting at CRON_MISSED_COUNT_LIMIT). */
  missed: number;
  /** The slots of the catch-up runs the misfire policy fires when the cluster is back (calendar-excluded ones left out). */
  catchUp: number[];
  /** Catch-up slots a calendar excludes (they would be recorded `excluded`, not run). */
  excluded: number;
}

/**
 * "The cluster is down from downFrom to downTo": what this trigger does at downTo. Its last
 * slot at or before downFrom counts as fired; planAfter — the function the shards use after an
 * outage — decides the catch-up under the task's misfire policy; a fixed-delay trigger counts as
 * having finished a run at downFrom.
 */
export function whatIfDown(f: ForecastTrigger, misfire: MisfirePolicy, downFrom: number, downTo: number, graceMs = 1000): WhatIf {
  const o = f.options ?? {};
  const none: WhatIf = { missed: 0, catchUp: [], excluded: 0 };
  let left = o.maxRuns !== undefined ? o.maxRuns - f.taken : Infinity;
  if (left <= 0) return none;
  const t = windowed(f.compiled, o);
  let last: number | null;
  if (f.spec.kind === "fixed_delay") last = downFrom;
  else {
    const cap = o.endMs !== undefined ? Math.min(downFrom, o.endMs) : downFrom;
    last = lastSlotAtOrBefore(f.spec, f.compiled, cap);
    if (last !== null && o.startMs !== undefined && last < o.startMs) last = null;
    if (last === null && f.createdMs > downFrom) return none; // created after the outage began
  }
  if (o.maxRuns !== undefined && last !== null && f.spec.kind !== "fixed_delay") {
    // Slots from the last fired one up to the outage use up runs first.
    const floor = f.spec.kind === "cron" ? f.createdMs : Number.MIN_SAFE_INTEGER;
    let used = 0;
    for (let s = t.next(f.lastSlotMs ?? floor); s !== null && s <= last && used < left; s = t.next(s)) {
      if (++used > MAX_LISTED_SLOTS) throw new TooManySlotsError("downFrom", MAX_LISTED_SLOTS);
    }
    left -= used;
    if (left <= 0) return none;
  }
  const planNow = o.endMs !== undefined ? Math.min(downTo, o.endMs + graceMs + 1) : downTo;
  const plan = planAfter(t, last, planNow, misfire, { graceMs, createdAtMs: Math.min(f.createdMs, downFrom) });
  // misfire=once fires one run, for the latest missed slot (the shard walks to it).
  const fired = plan.fire.map((x) => x.slotMs).filter((s) => (o.startMs === undefined || s >= o.startMs) && (o.endMs === undefined || s <= o.endMs));
  const zone = zoneOfSpec(f.spec);
  const kept = f.calendar ? fired.filter((s) => !exclusionOf(s, zone, f.calendar!)) : fired;
  return { missed: plan.missed, catchUp: kept.slice(0, Number.isFinite(left) ? left : undefined), excluded: fired.length - kept.length };
}
