import { InvalidInputError, formatDuration, parseDuration } from "../../common/index.ts";
import { MAX_TRIGGER_DURATION_MS, compileTrigger } from "./compile.ts";
import { DST_GAPS, DST_REPEATS, validateCron } from "./cron.ts";
import type { TriggerSpec } from "./types.ts";
import { daysFromCivil } from "./civil.ts";
import { canonicalTimeZone, isoUtc } from "./zone.ts";

export interface TriggerInput {
  cron?: string;
  tz?: string;
  /** DST policy of a cron trigger (docs/TRIGGERS.md); absent = the default. */
  dstGap?: string;
  dstRepeat?: string;
  every?: string | number;
  fixedDelay?: string | number;
  at?: string;
  delay?: string | number;
}

type TriggerKindField = "cron" | "every" | "fixedDelay" | "at" | "delay";

// CLI flags and JSON bodies say "absent" as undefined or null; both mean "not given".
const given = (v: unknown): boolean => v !== undefined && v !== null;

function duration(field: string, value: unknown): number {
  if (typeof value !== "string" && typeof value !== "number") {
    throw new InvalidInputError(field, value, "must be a duration such as 10s or a number of milliseconds", "AX_E_DURATION");
  }
  const ms = parseDuration(field, value);
  // parseDuration rounds: 0.4 passes its "> 0" check and comes back as 0, an endless loop.
  if (ms < 1) throw new InvalidInputError(field, value, "must be at least 1ms", "AX_E_DURATION");
  if (ms > MAX_TRIGGER_DURATION_MS) throw new InvalidInputError(field, value, `must be at most ${formatDuration(MAX_TRIGGER_DURATION_MS)}`, "AX_E_DURATION");
  return ms;
}

const ISO_RE = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?(Z|[+-]\d{2}:?\d{2})?$/i;

/**
 * Parses an ISO-8601 instant that carries its own offset. Done by hand rather than with
 * Date.parse, whose handling of "2026-02-30", "+0800" and offset-less strings varies and, worst,
 * reads an offset-less time in the server's local zone.
 */
export function parseIsoInstant(field: string, input: unknown): number {
  if (typeof input === "string") {
    const fast = canonicalUtcInstant(input);
    if (fast === fast) return fast; // not NaN
  }
  return parseIsoInstantSlow(field, input);
}

const DAYS_IN_MONTH = [0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

/** Two ASCII digits at i as a number, or NaN. */
function digits2(s: string, i: number): number {
  const a = s.charCodeAt(i) - 48, b = s.charCodeAt(i + 1) - 48;
  return a >= 0 && a <= 9 && b >= 0 && b <= 9 ? a * 10 + b : NaN;
}

/**
 * The instant of a valid time in the form clients send most (`toISOString()`'s:
 * `YYYY-MM-DDTHH:MM:SS.sssZ`, or without `.sss`), read without the regular expression and Date;
 * NaN for anything else (another form, or a value out of range), which parseIsoInstantSlow
 * then reads or refuses. Same result as the slow path wherever it answers (test/unit/civil.test.ts).
 */
function canonicalUtcInstant(s: string): number {
  const n = s.length;
  if ((n !== 20 && n !== 24) || s.charCodeAt(n - 1) !== 90 /* Z */) return NaN;
  if (s.charCodeAt(4) !== 45 || s.charCodeAt(7) !== 45 || s.charCodeAt(10) !== 84 || s.charCodeAt(13) !== 58 || s.charCodeAt(16) !== 58) return NaN; // - - T : :
  let milli = 0;
  if (n === 24) {
    if (s.charCodeAt(19) !== 46 /* . */) return NaN;
    const m = digits2(s, 20), c = s.charCodeAt(22) - 48;
    if (!(c >= 0 && c <= 9)) return NaN;
    milli = m * 10 + c;
  }
  const year = digits2(s, 0) * 100 + digits2(s, 2), month = digits2(s, 5), day = digits2(s, 8);
  const hour = digits2(s, 11), minute = digits2(s, 14), second = digits2(s, 17);
  // NaN fails every comparison: a non-digit anywhere falls through to the slow path.
  if (!(month >= 1 && month <= 12 && day >= 1 && hour <= 23 && minute <= 59 && second <= 59 && milli >= 0)) return NaN;
  if (day > (month === 2 && isLeap(year) ? 29 : DAYS_IN_MONTH[month]!)) return NaN;
  return daysFromCivil(year, month, day) * 86_400_000 + hour * 3_600_000 + minute * 60_000 + second * 1000 + milli;
}

/** parseIsoInstant for every form it accepts, and every refusal. Exported for the differential test. */
export function parseIsoInstantSlow(field: string, input: unknown): number {
  const refuse = (why: string): never => { throw new InvalidInputError(field, input, why, "AX_E_TRIGGER"); };
  if (typeof input !== "string") return refuse("must be an ISO-8601 time such as 2026-03-08T09:00:00Z");
  const m = ISO_RE.exec(input.trim());
  if (!m) return refuse("not an ISO-8601 time; use e.g. 2026-03-08T09:00:00Z or 2026-03-08T17:00:00+08:00");
  const [, y, mo, d, h, mi, s = "0", frac = "", off] = m;
  if (off === undefined) return refuse("needs a time-zone offset or Z (e.g. 2026-03-08T09:00:00+08:00); a local time is ambiguous");
  const year = Number(y), month = Number(mo), day = Number(d), hour = Number(h), minute = Number(mi), second = Number(s);
  if (month < 1 || month > 12) refuse(`month ${mo} is out of range 01-12`);
  const daysInMonth = new Date(Date.UTC(2000, month, 0)).getUTCDate() - (month === 2 && !isLeap(year) ? 1 : 0);
  if (day < 1 || day > daysInMonth) refuse(`day ${d} does not exist in ${y}-${mo}`);
  if (hour > 23) refuse(`hour ${h} is out of range 00-23`);
  if (minute > 59) refuse(`minute ${mi} is out of range 00-59`);
  if (second > 59) refuse(`second ${s} is out of range 00-59`);
  let offsetMin = 0;
  if (off.toUpperCase() !== "Z") {
    const om = /^([+-])(\d{2}):?(\d{2})$/.exec(off)!;
    const oh = Number(om[2]), omin = Number(om[3]);
    if (oh > 18 || omin > 59 || (oh === 18 && omin > 0)) refuse(`offset ${off} is out of range -18:00..+18:00`);
    offsetMin = (om[1] === "-" ? -1 : 1) * (oh * 60 + omin);
  }
  const ms = Number(frac.slice(0, 3).padEnd(3, "0"));
  // Date.UTC maps years 0-99 to 1900-1999; setUTCFullYear does not.
  const date = new Date(Date.UTC(2000, month - 1, day, hour, minute, second, ms));
  date.setUTCFullYear(year);
  return date.getTime() - offsetMin * 60_000;
}

function isLeap(y: number): boolean {
  return (y % 4 === 0 && y % 100 !== 0) || y % 400 === 0;
}

/**
 * Validates trigger input from the CLI or API and returns a normalized spec. Every refusal is
 * an InvalidInputError naming the field: "trigger" for a missing or conflicting kind,
 * "cron"/"tz"/"every"/"fixedDelay"/"at"/"delay" for a bad value.
 */
export function parseTrigger(input: TriggerInput, nowMs: number, opts: { pastToleranceMs?: number } = {}): TriggerSpec {
  if (input === null || typeof input !== "object") {
    throw new InvalidInputError("trigger", input, "must be an object with one of cron, every, fixedDelay, at, delay", "AX_E_TRIGGER");
  }
  if (!Number.isFinite(nowMs)) throw new InvalidInputError("nowMs", nowMs, "must be epoch milliseconds", "AX_E_INVALID");
  const tolerance = opts.pastToleranceMs ?? 60_000;
  if (!Number.isFinite(tolerance) || tolerance < 0) {
    throw new InvalidInputError("pastToleranceMs", tolerance, "must be >= 0", "AX_E_INVALID");
  }

  // Named loads (input[k] over a list of the fields is a megamorphic load a field, on every task created).
  const kinds: TriggerKindField[] = [];
  if (given(input.cron)) kinds.push("cron");
  if (given(input.every)) kinds.push("every");
  if (given(input.fixedDelay)) kinds.push("fixedDelay");
  if (given(input.at)) kinds.push("at");
  if (given(input.delay)) kinds.push("delay");
  if (kinds.length === 0) {
    throw new InvalidInputError("trigger", input, "give one of cron, every, fixedDelay, at, delay", "AX_E_TRIGGER");
  }
  if (kinds.length > 1) {
    const conflicting = Object.fromEntries(kinds.map((k) => [k, input[k]]));
    throw new InvalidInputError("trigger", conflicting, `${kinds.join(" and ")} conflict: give exactly one of cron, every, fixedDelay, at, delay`, "AX_E_TRIGGER");
  }
  const kind = kinds[0]!;
  if (kind !== "cron") {
    const f = given(input.tz) ? "tz" : given(input.dstGap) ? "dstGap" : given(input.dstRepeat) ? "dstRepeat" : null;
    if (f) throw new InvalidInputError(f, input[f], `${f} only applies to cron triggers, not to ${kind}`, "AX_E_TRIGGER");
  }

  switch (kind) {
    case "cron": {
      const { expr } = validateCron(input.cron);
      const tz = given(input.tz) ? canonicalTimeZone("tz", input.tz) : "UTC";
      const spec: TriggerSpec = { kind: "cron", expr, tz };
      if (given(input.dstGap)) {
        if (!DST_GAPS.includes(input.dstGap as never)) throw new InvalidInputError("dstGap", input.dstGap, `must be ${DST_GAPS.join(", ")} (a wall time the clock skips: fire it shifted by the jump, not at all, or at the jump)`, "AX_E_TRIGGER");
        spec.dstGap = input.dstGap as NonNullable<typeof spec.dstGap>;
      }
      if (given(input.dstRepeat)) {
        if (!DST_REPEATS.includes(input.dstRepeat as never)) throw new InvalidInputError("dstRepeat", input.dstRepeat, `must be ${DST_REPEATS.join(", ")} (a wall time that happens twice: fire the first, the second or both)`, "AX_E_TRIGGER");
        spec.dstRepeat = input.dstRepeat as NonNullable<typeof spec.dstRepeat>;
      }
      // Compiling warms the cache, and one next() proves the expression fires at all, so a
      // combination the field checks missed fails here, at the user, not later in the scheduler.
      compileTrigger(spec).next(nowMs);
      return spec;
    }
    case "every":
      return { kind: "fixed_rate", everyMs: duration("every", input.every), anchorMs: nowMs };
    case "fixedDelay":
      return { kind: "fixed_delay", delayMs: duration("fixedDelay", input.fixedDelay) };
    case "delay":
      return { kind: "once", atMs: nowMs + duration("delay", input.delay) };
    case "at": {
      const atMs = parseIsoInstant("at", input.at);
      if (atMs < nowMs - tolerance) {
        throw new InvalidInputError("at", input.at,
          `${isoUtc(atMs)} is ${formatDuration(nowMs - atMs)} in the past (now ${isoUtc(nowMs)}; at most ${formatDuration(tolerance)} is tolerated)`, "AX_E_TRIGGER");
      }
      return { kind: "once", atMs };
    }
  }
}
