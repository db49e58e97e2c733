import { createHash } from "node:crypto";
import { InvalidInputError, formatDuration, parseDuration } from "../../common/index.ts";
import { parseIsoInstant } from "./parse.ts";
import type { CompiledTrigger, TriggerSpec } from "./types.ts";
import { canonicalTimeZone, isoUtc, offsetMsAt } from "./zone.ts";

/**
 * Options that shape a trigger's slots without changing its arithmetic (docs/TRIGGERS.md,
 * "Jitter, window, max runs, calendars"). Stored in the trigger spec as `sched`, so they travel
 * with the trigger row (PostgreSQL, NATS) and need no column of their own. Pure: no I/O, no clock.
 */
export interface ScheduleOptions {
  /** Each slot's run is due `jitterFor(task, slot, jitterMs)` after it: 0..jitterMs, the same on every replay. */
  jitterMs?: number;
  /** Slots before startMs or after endMs (both inclusive bounds) are not fired. */
  startMs?: number;
  endMs?: number;
  /** The trigger stops after this many fired slots (catch-ups count; retries, manual and backfill runs do not). */
  maxRuns?: number;
  /** A named calendar of excluded dates: a slot on one of them is skipped and recorded `excluded`. */
  calendar?: string;
}

export interface ScheduleOptionsInput {
  jitter?: unknown;
  start?: unknown;
  end?: unknown;
  maxRuns?: unknown;
  excludeCalendar?: unknown;
}

export const CALENDAR_NAME_RE = /^[A-Za-z0-9_.-]{1,64}$/;
/** Jitter is a delay of the due time: at most a timer's reach. */
export const MAX_JITTER_MS = 24 * 86_400_000;
export const MAX_RUNS_LIMIT = 1_000_000_000;
/** How many upcoming slots a cron jitter is checked against (it must stay below every gap between them). */
const JITTER_GAP_SAMPLE = 1000;

const given = (v: unknown): boolean => v !== undefined && v !== null && v !== "";

/** A trigger spec with its options (what is stored). */
export type SpecWithOptions = TriggerSpec & { sched?: ScheduleOptions };

/**
 * Validates the options of one task against its trigger. Returns null when none is given.
 * Refusals are InvalidInputError naming the field (`jitter`, `start`, `end`, `maxRuns`, `excludeCalendar`).
 */
export function parseScheduleOptions(input: ScheduleOptionsInput, spec: TriggerSpec, t: CompiledTrigger, nowMs: number): ScheduleOptions | null {
  const o: ScheduleOptions = {};
  if (given(input.jitter)) {
    const v = input.jitter;
    if (typeof v !== "string" && typeof v !== "number") throw new InvalidInputError("jitter", v, "must be a duration such as 30s", "AX_E_DURATION");
    const ms = parseDuration("jitter", v);
    if (ms < 1 || ms > MAX_JITTER_MS) throw new InvalidInputError("jitter", v, `must be from 1ms to ${formatDuration(MAX_JITTER_MS)}`, "AX_E_DURATION");
    const gap = smallestGap(spec, t, nowMs);
    if (gap !== null && ms >= gap) {
      throw new InvalidInputError("jitter", v, `must be shorter than the trigger's shortest interval (${formatDuration(gap)}), or a run could come due after the next slot`, "AX_E_DURATION");
    }
    o.jitterMs = ms;
  }
  if (given(input.start)) o.startMs = instant("start", input.start);
  if (given(input.end)) {
    o.endMs = instant("end", input.end);
    if (o.endMs <= nowMs) throw new InvalidInputError("end", input.end, `is not in the future (now ${isoUtc(nowMs)}): no slot would fire`, "AX_E_TRIGGER");
  }
  if (o.startMs !== undefined && o.endMs !== undefined && o.endMs <= o.startMs) throw new InvalidInputError("end", input.end, "must be after start", "AX_E_TRIGGER");
  if (given(input.maxRuns)) {
    const v = input.maxRuns;
    const n = typeof v === "string" && /^\d+$/.test(v) ? Number(v) : v;
    if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 1 || n > MAX_RUNS_LIMIT) throw new InvalidInputError("maxRuns", v, `must be a whole number from 1 to ${MAX_RUNS_LIMIT}`);
    o.maxRuns = n;
  }
  if (given(input.excludeCalendar)) {
    const v = input.excludeCalendar;
    if (typeof v !== "string" || !CALENDAR_NAME_RE.test(v)) throw new InvalidInputError("excludeCalendar", v, "must be a calendar name (letters, digits, '.', '_' or '-', at most 64)");
    o.calendar = v;
  }
  if (spec.kind === "fixed_delay" && o.startMs !== undefined) throw new InvalidInputError("start", input.start, "not with --fixed-delay (its slots follow run completions)", "AX_E_TRIGGER");
  return Object.keys(o).length ? o : null;
}

function instant(field: string, v: unknown): number {
  if (typeof v === "number" && Number.isSafeInteger(v)) return v;
  return parseIsoInstant(field, v);
}

/** The shortest interval between upcoming slots (null: fewer than two slots, or a fixed delay). */
function smallestGap(spec: TriggerSpec, t: CompiledTrigger, nowMs: number): number | null {
  if (spec.kind === "fixed_rate") return spec.everyMs;
  if (spec.kind === "fixed_delay") return spec.delayMs;
  if (spec.kind === "once") return null;
  let min: number | null = null;
  let prev = t.next(nowMs);
  for (let i = 0; prev !== null && i < JITTER_GAP_SAMPLE; i++) {
    const n = t.next(prev);
    if (n === null) break;
    min = min === null ? n - prev : Math.min(min, n - prev);
    prev = n;
  }
  return min;
}

/** The spec to store: the trigger's own spec plus its options. */
export function withScheduleOptions(spec: TriggerSpec, o: ScheduleOptions | null): SpecWithOptions {
  return o ? { ...spec, sched: o } : spec;
}

/** The options of a stored spec (defensive: a malformed `sched` counts as none of the bad fields). */
export function scheduleOptionsOf(spec: unknown): ScheduleOptions | null {
  const s = (spec as { sched?: unknown } | null)?.sched;
  if (s === null || typeof s !== "object") return null;
  const r = s as Record<string, unknown>;
  const o: ScheduleOptions = {};
  const num = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);
  if (num(r.jitterMs) && r.jitterMs > 0) o.jitterMs = r.jitterMs;
  if (num(r.startMs)) o.startMs = r.startMs;
  if (num(r.endMs)) o.endMs = r.endMs;
  if (num(r.maxRuns) && r.maxRuns >= 1) o.maxRuns = r.maxRuns;
  if (typeof r.calendar === "string" && r.calendar) o.calendar = r.calendar;
  return o;
}

/**
 * The deterministic jitter of one slot: 0..jitterMs, from SHA-256 of the task's name and the slot
 * instant. The same task and slot always get the same delay (a replay, another node, a restart),
 * and different slots and tasks spread evenly.
 */
export function jitterFor(taskKey: string, slotMs: number, jitterMs: number): number {
  if (!(jitterMs > 0)) return 0;
  const h = createHash("sha256").update(`${taskKey}\u0000${slotMs}`).digest();
  // 48 bits: the modulo bias is below 2^-24 for any jitter up to 24 days.
  const x = h.readUIntBE(0, 6);
  return x % (Math.floor(jitterMs) + 1);
}

/**
 * The trigger seen through its window: next() never answers a slot before startMs (it asks the
 * trigger from startMs − 1) or after endMs (null). Everything else is the trigger's own.
 */
export function windowed(t: CompiledTrigger, o: ScheduleOptions): CompiledTrigger {
  const { startMs, endMs } = o;
  if (startMs === undefined && endMs === undefined) return t;
  return {
    spec: t.spec,
    describe: () => t.describe(),
    explain: (a, s) => t.explain(a, s),
    next(afterMs: number): number | null {
      const from = startMs !== undefined && afterMs < startMs - 1 ? startMs - 1 : afterMs;
      const n = t.next(from);
      if (n === null || (endMs !== undefined && n > endMs)) return null;
      return n;
    },
  };
}

/** The options in words, for `task show` ("" when none): "jitter 5m, from …, until …, at most 20 runs, excluding calendar holidays". */
export function describeOptions(o: ScheduleOptions | null): string {
  if (!o) return "";
  const parts: string[] = [];
  if (o.jitterMs !== undefined) parts.push(`jitter ${formatDuration(o.jitterMs)}`);
  if (o.startMs !== undefined) parts.push(`from ${isoUtc(o.startMs)}`);
  if (o.endMs !== undefined) parts.push(`until ${isoUtc(o.endMs)}`);
  if (o.maxRuns !== undefined) parts.push(`at most ${o.maxRuns} run(s)`);
  if (o.calendar !== undefined) parts.push(`excluding the dates of calendar ${o.calendar}`);
  return parts.join(", ");
}

/** Where a trigger's count of fired slots is kept in the task's trigger-slot map. */
export const runsKey = (triggerId: number | string): string => `runs:${triggerId}`;
export function runsTaken(slots: Readonly<Record<string, number>>, triggerId: number | string): number {
  const n = slots[runsKey(triggerId)];
  return typeof n === "number" && n > 0 ? n : 0;
}

/** Why a trigger with these options fires no more (null: it may still fire). */
export function scheduleEnded(o: ScheduleOptions, slots: Readonly<Record<string, number>>, triggerId: number, nowMs: number): string | null {
  if (o.maxRuns !== undefined && runsTaken(slots, triggerId) >= o.maxRuns) return `completed: ${o.maxRuns} of --max-runs ${o.maxRuns} runs fired`;
  if (o.endMs !== undefined && nowMs > o.endMs) return `completed: its window ended at ${isoUtc(o.endMs)} (--end)`;
  return null;
}

/**
 * The "now" a trigger with a window is planned at: once its end has passed, at the end (plus the
 * grace), so the missed slots counted by the misfire policy are the window's only.
 */
export function planNowOf(o: ScheduleOptions, nowMs: number, graceMs: number): number {
  return o.endMs !== undefined && nowMs > o.endMs + graceMs + 1 ? o.endMs + graceMs + 1 : nowMs;
}

interface PointerLike { dueMs: number; slotMs: number | null; source: string; reason: string }

/**
 * A pointer computed for a trigger with options, finished: a catch-up is due at the real now
 * (it may have been planned at the window's end), a slot outside the window is dropped, and a
 * scheduled slot is delayed by its jitter — the slot itself is kept, so `ax why` shows both.
 */
export function shapePointer<P extends PointerLike>(p: P, o: ScheduleOptions, taskKey: string, nowMs: number): P | null {
  if (p.slotMs !== null && ((o.endMs !== undefined && p.slotMs > o.endMs) || (o.startMs !== undefined && p.slotMs < o.startMs))) return null;
  if (p.source === "misfire") return p.dueMs < nowMs ? { ...p, dueMs: nowMs } : p;
  if (o.jitterMs === undefined || p.slotMs === null || p.source === "retry") return p;
  const j = jitterFor(taskKey, p.slotMs, o.jitterMs);
  return { ...p, dueMs: p.slotMs + j, reason: `${p.reason}; due ${formatDuration(j)} after the slot ${isoUtc(p.slotMs)} (--jitter ${formatDuration(o.jitterMs)}, fixed for this task and slot)` };
}

// ---- calendars ---------------------------------------------------------------------------------

/** A named set of excluded dates; `tz` null = each task's own zone. */
export interface Calendar { name: string; tz: string | null; dates: string[] }

const DATE_RE = /^(\d{4})-(\d{2})-(\d{2})$/;
export const MAX_CALENDAR_DATES = 10_000;

/** `2026-12-25,2027-01-01` (or an array) → sorted, distinct, real dates. */
export function parseCalendarDates(field: string, input: unknown): string[] {
  const items = typeof input === "string" ? input.split(",").map((s) => s.trim()).filter((s) => s.length) : Array.isArray(input) ? input : null;
  if (!items) throw new InvalidInputError(field, input, "must be dates like 2026-12-25,2027-01-01");
  if (items.length > MAX_CALENDAR_DATES) throw new InvalidInputError(field, items.length, `at most ${MAX_CALENDAR_DATES} dates`);
  const out = new Set<string>();
  for (const d of items) {
    const m = typeof d === "string" ? DATE_RE.exec(d) : null;
    if (!m) throw new InvalidInputError(field, d, "not a date in the form YYYY-MM-DD");
    const [y, mo, da] = [Number(m[1]), Number(m[2]), Number(m[3])];
    const check = new Date(Date.UTC(y, mo - 1, da));
    if (y < 1970 || check.getUTCFullYear() !== y || check.getUTCMonth() !== mo - 1 || check.getUTCDate() !== da) throw new InvalidInputError(field, d, "no such date (from 1970)");
    out.add(d as string);
  }
  return [...out].sort();
}

export function parseCalendarZone(input: unknown): string | null {
  return given(input) ? canonicalTimeZone("tz", input) : null;
}

/** The calendar date (YYYY-MM-DD) of an instant in a zone. */
export function dateInZone(ms: number, tz: string): string {
  return new Date(ms + offsetMsAt(tz, ms)).toISOString().slice(0, 10);
}

/** The zone a trigger's dates are read in: a cron trigger's own, UTC for the others. */
export function zoneOfSpec(spec: unknown): string {
  const tz = (spec as { kind?: string; tz?: unknown } | null)?.tz;
  return typeof tz === "string" && tz ? tz : "UTC";
}

/** The reason a slot is excluded by a calendar (null: it is not). Dates are read in the calendar's zone if it has one, else the trigger's. */
export function exclusionOf(slotMs: number, triggerZone: string, cal: Calendar): string | null {
  const tz = cal.tz ?? triggerZone;
  const date = dateInZone(slotMs, tz);
  // Sorted: binary search.
  let lo = 0, hi = cal.dates.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const d = cal.dates[mid]!;
    if (d === date) return `excluded: ${date} (${tz}) is in calendar ${cal.name}`;
    if (d < date) lo = mid + 1; else hi = mid - 1;
  }
  return null;
}
