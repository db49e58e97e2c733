import { InvalidInputError, formatDuration } from "../../common/index.ts";
import { DST_GAPS, DST_REPEATS, cachedCron, cronNext, cronUnfired, slotNote, type CachedCron, type DstGap, type DstRepeat } from "./cron.ts";
import type { CompiledTrigger, TriggerSpec } from "./types.ts";
import { formatInZone, isoUtc } from "./zone.ts";

/** Longest duration a trigger may use: keeps every slot a valid Date and the arithmetic exact. */
export const MAX_TRIGGER_DURATION_MS = 100 * 365 * 86_400_000;
/** The most slots one preview() may ask for (it is reachable from the API). */
export const MAX_PREVIEW = 10_000;

function specError(field: string, value: unknown, why: string): never {
  throw new InvalidInputError(field, value, why, "AX_E_TRIGGER");
}

function requireInstant(field: string, v: unknown): number {
  if (typeof v !== "number" || !Number.isFinite(v)) specError(field, v, "must be epoch milliseconds");
  return v;
}

function requireDuration(field: string, v: unknown): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 1 || v > MAX_TRIGGER_DURATION_MS) {
    specError(field, v, `must be whole milliseconds between 1 and ${formatDuration(MAX_TRIGGER_DURATION_MS)}`);
  }
  return v;
}

// Slots are compared with ===, so an afterMs of NaN would silently produce NaN slots.
function checkAfter(afterMs: number): void {
  if (!Number.isFinite(afterMs)) throw new InvalidInputError("afterMs", afterMs, "must be epoch milliseconds", "AX_E_INVALID");
}

/** A trailing remark when the caller's slot is not what next(afterMs) gives (e.g. a catch-up). */
function mismatch(expected: number | null, slotMs: number, afterText: string): string {
  if (expected === slotMs) return "";
  return expected === null
    ? `; note: the trigger has no slot after ${afterText}, so ${isoUtc(slotMs)} did not come from it`
    : `; note: the next slot after ${afterText} is actually ${isoUtc(expected)}`;
}

/** Wall time written as naive ms, as "2026-03-08T02:30:00". */
const wallText = (wall: number): string => new Date(wall).toISOString().slice(0, 19);

/** A remark on a slot that a DST rule placed ("" for an ordinary slot). */
export function dstRemark(c: CachedCron, slotMs: number): string {
  const n = slotNote(c, slotMs);
  switch (n.kind) {
    case "plain": return "";
    case "gap-shift":
      return `; the wall time ${wallText(n.wall)} did not exist that day (DST gap), so it fired as far after the gap as the clock jumped (dst-gap shift)`;
    case "gap-transition":
      return `; the wall time ${wallText(n.wall)} did not exist that day (DST gap), so it fired at the first instant after the gap (dst-gap transition)`;
    case "repeat": {
      // The first copy under "both" fires like any other slot; nothing to explain.
      if (n.copy === 1 && n.fired === "both") return "";
      const which = n.copy === 1 ? "first" : n.copy === 2 ? "second" : `copy ${n.copy}`;
      const rule = n.fired === "both" ? "every occurrence fires (dst-repeat both)" : `only the ${n.fired} fires (dst-repeat ${n.fired})`;
      return `; this is the ${which} occurrence of a wall time repeated when DST ended; ${rule}`;
    }
  }
}

class CronTrigger implements CompiledTrigger {
  readonly spec: Readonly<Extract<TriggerSpec, { kind: "cron" }>>;
  // Held directly, so next() costs no cache lookup.
  readonly #cron: CachedCron;
  constructor(expr: unknown, tz: unknown, dstGap: unknown, dstRepeat: unknown) {
    if (typeof tz !== "string") specError("tz", tz, "must be an IANA time zone name");
    if (dstGap !== undefined && !DST_GAPS.includes(dstGap as DstGap)) specError("dstGap", dstGap, `must be ${DST_GAPS.join(", ")}`);
    if (dstRepeat !== undefined && !DST_REPEATS.includes(dstRepeat as DstRepeat)) specError("dstRepeat", dstRepeat, `must be ${DST_REPEATS.join(", ")}`);
    const dst = { ...(dstGap !== undefined ? { gap: dstGap as DstGap } : {}), ...(dstRepeat !== undefined ? { repeat: dstRepeat as DstRepeat } : {}) };
    // validateCron() (inside cachedCron) also rejects a non-string expr with AX_E_CRON_FIELD.
    this.#cron = cachedCron(expr as string, tz, dst);
    this.spec = Object.freeze({
      kind: "cron", expr: this.#cron.expr, tz: this.#cron.tz,
      ...(dst.gap !== undefined ? { dstGap: dst.gap } : {}), ...(dst.repeat !== undefined ? { dstRepeat: dst.repeat } : {}),
    });
  }
  /** The compiled expression (with its resolved DST policy), for previews. */
  get cron(): CachedCron {
    return this.#cron;
  }
  next(afterMs: number): number | null {
    checkAfter(afterMs);
    return cronNext(this.#cron, afterMs);
  }
  describe(): string {
    const { dstGap, dstRepeat } = this.spec;
    const policy = [dstGap !== undefined ? `dst-gap ${dstGap}` : "", dstRepeat !== undefined ? `dst-repeat ${dstRepeat}` : ""].filter(Boolean).join(", ");
    return `cron "${this.spec.expr}" in ${this.spec.tz}${policy ? ` (${policy})` : ""}`;
  }
  explain(afterMs: number, slotMs: number): string {
    const { tz } = this.spec;
    const afterText = formatInZone(afterMs, tz);
    let s = `next time matching cron "${this.spec.expr}" in ${tz} after ${afterText}: ${formatInZone(slotMs, tz)} (${isoUtc(slotMs)})`;
    // The DST cases are exactly the ones that make people ask "why then?".
    s += dstRemark(this.#cron, slotMs);
    return s + mismatch(this.next(afterMs), slotMs, afterText);
  }
}

class FixedRateTrigger implements CompiledTrigger {
  readonly spec: Readonly<Extract<TriggerSpec, { kind: "fixed_rate" }>>;
  constructor(everyMs: unknown, anchorMs: unknown) {
    this.spec = Object.freeze({ kind: "fixed_rate", everyMs: requireDuration("everyMs", everyMs), anchorMs: requireInstant("anchorMs", anchorMs) });
  }
  next(afterMs: number): number | null {
    checkAfter(afterMs);
    const { everyMs, anchorMs } = this.spec;
    // The anchor itself is the creation instant, not a slot: k starts at 1.
    const k = afterMs < anchorMs + everyMs ? 1 : Math.floor((afterMs - anchorMs) / everyMs) + 1;
    return anchorMs + k * everyMs;
  }
  describe(): string {
    return `every ${formatDuration(this.spec.everyMs)} (anchored at ${isoUtc(this.spec.anchorMs)})`;
  }
  explain(afterMs: number, slotMs: number): string {
    const { everyMs, anchorMs } = this.spec;
    const every = formatDuration(everyMs);
    const k = (slotMs - anchorMs) / everyMs;
    const afterText = isoUtc(afterMs);
    return `first slot of every ${every} strictly after ${afterText}: anchor ${isoUtc(anchorMs)} + ${k} × ${every} = ${isoUtc(slotMs)}`
      + mismatch(this.next(afterMs), slotMs, afterText);
  }
}

class FixedDelayTrigger implements CompiledTrigger {
  readonly spec: Readonly<Extract<TriggerSpec, { kind: "fixed_delay" }>>;
  constructor(delayMs: unknown) {
    this.spec = Object.freeze({ kind: "fixed_delay", delayMs: requireDuration("delayMs", delayMs) });
  }
  next(afterMs: number): number | null {
    checkAfter(afterMs);
    return afterMs + this.spec.delayMs;
  }
  describe(): string {
    return `${formatDuration(this.spec.delayMs)} after the previous run finished`;
  }
  explain(afterMs: number, slotMs: number): string {
    const afterText = isoUtc(afterMs);
    return `${formatDuration(this.spec.delayMs)} after ${afterText} (when the previous run finished, or the trigger was created): ${isoUtc(slotMs)}`
      + mismatch(this.next(afterMs), slotMs, afterText);
  }
}

class OnceTrigger implements CompiledTrigger {
  readonly spec: Readonly<Extract<TriggerSpec, { kind: "once" }>>;
  constructor(atMs: unknown) {
    this.spec = Object.freeze({ kind: "once", atMs: requireInstant("atMs", atMs) });
  }
  next(afterMs: number): number | null {
    checkAfter(afterMs);
    return this.spec.atMs > afterMs ? this.spec.atMs : null;
  }
  describe(): string {
    return `once at ${isoUtc(this.spec.atMs)}`;
  }
  explain(afterMs: number, slotMs: number): string {
    const afterText = isoUtc(afterMs);
    return `the single slot of a once trigger, at ${isoUtc(this.spec.atMs)}` + mismatch(this.next(afterMs), slotMs, afterText);
  }
}

/**
 * Turns a stored spec into something that computes slots. Re-validates the spec (it may come
 * back from storage written by an older version); cron expressions are parsed once per
 * (expr, tz) and shared.
 */
export function compileTrigger(spec: TriggerSpec): CompiledTrigger {
  const s = spec as { kind?: unknown } & Record<string, unknown>;
  if (s === null || typeof s !== "object") specError("trigger", spec, "must be a trigger spec object");
  switch (s.kind) {
    case "cron": return new CronTrigger(s.expr, s.tz, s.dstGap, s.dstRepeat);
    case "fixed_rate": return new FixedRateTrigger(s.everyMs, s.anchorMs);
    case "fixed_delay": return new FixedDelayTrigger(s.delayMs);
    case "once": return new OnceTrigger(s.atMs);
    default: return specError("kind", s.kind, "must be cron, fixed_rate, fixed_delay or once");
  }
}

/**
 * The next `count` slots after `fromMs`, fewer if the trigger runs out. For fixed_delay this
 * assumes every run finishes the instant it starts, so it is a lower bound on real times.
 */
export function preview(t: CompiledTrigger, fromMs: number, count: number): number[] {
  if (!Number.isSafeInteger(count) || count < 0 || count > MAX_PREVIEW) {
    throw new InvalidInputError("count", count, `must be a whole number between 0 and ${MAX_PREVIEW}`, "AX_E_INVALID");
  }
  const out: number[] = [];
  let after = fromMs;
  while (out.length < count) {
    const s = t.next(after);
    if (s === null) break;
    out.push(s);
    after = s;
  }
  return out;
}

/** One previewed slot, or a wall time a DST rule left out (`slotMs` null). */
export interface PreviewMark {
  slotMs: number | null;
  /** What a DST rule did here: "" for an ordinary slot. */
  note: string;
}

/**
 * preview() with the DST rules made visible: each slot a rule moved or chose among copies
 * carries a note, and the wall times a rule left out (a gap under dst-gap skip, the unfired
 * copies of a repeated wall time) are listed between the slots, in order.
 */
export function previewMarks(t: CompiledTrigger, fromMs: number, count: number): PreviewMark[] {
  const slots = preview(t, fromMs, count);
  if (!(t instanceof CronTrigger)) return slots.map((slotMs) => ({ slotMs, note: "" }));
  const c = t.cron;
  const out: PreviewMark[] = [];
  let prev = fromMs;
  for (const slotMs of slots) {
    for (const u of cronUnfired(c, prev, slotMs)) {
      out.push({
        slotMs: null,
        note: u.why === "gap"
          ? `skipped: ${wallText(u.wall)} did not exist (DST gap at ${isoUtc(u.at)}; dst-gap skip)`
          : `not fired: ${wallText(u.wall)} at ${isoUtc(u.at)}, a repeated wall time whose other copy fires (dst-repeat ${c.repeat})`,
      });
    }
    out.push({ slotMs, note: dstRemark(c, slotMs).replace(/^; /, "") });
    prev = slotMs;
  }
  return out;
}
