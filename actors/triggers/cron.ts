import { AxError, InvalidInputError } from "../../common/index.ts";
import type { DstGap, DstRepeat } from "./types.ts";
import { MAX_OFFSET_MS, canonicalTimeZone, instantsOfWall, offsetMsAt, pieceAt, yearStart, type Piece } from "./zone.ts";

/**
 * Cron support: field-by-field validation whose errors name the field and the token, a matcher
 * over wall-clock times, and the zone arithmetic that turns matching wall times into instants
 * under the DST policy of docs/TRIGGERS.md. No cron library is involved: matching is a walk over
 * the expression's own value sets, and instants come from the exact offset table in zone.ts, so
 * gaps, repeats, 30/45-minute shifts and midnight transitions are right by construction.
 *
 * Accepted syntax, per field: `*`, `n`, `a-b`, `*\/s`, `a-b/s`, `a/s` and comma lists of these;
 * month and day-of-week also take three-letter names (jan, mon; any case); day-of-week takes
 * 0-7 (0 and 7 are Sunday). Extensions: `L` (last day) in day-of-month, `dL` (last weekday d
 * of the month) in day-of-week, and `d#n` (n-th weekday d) as the whole day-of-week field.
 */

interface FieldSpec {
  readonly name: string;
  readonly min: number;
  readonly max: number;
  /** Upper end of `*`; day-of-week accepts 7 for Sunday but `*` means 0-6. */
  readonly starMax: number;
  readonly names?: readonly string[];
}

const MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"] as const;
const DAY_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"] as const;

const SECOND: FieldSpec = { name: "second", min: 0, max: 59, starMax: 59 };
const MINUTE: FieldSpec = { name: "minute", min: 0, max: 59, starMax: 59 };
const HOUR: FieldSpec = { name: "hour", min: 0, max: 23, starMax: 23 };
const DAY_OF_MONTH: FieldSpec = { name: "day-of-month", min: 1, max: 31, starMax: 31 };
const MONTH: FieldSpec = { name: "month", min: 1, max: 12, starMax: 12, names: MONTH_NAMES };
const DAY_OF_WEEK: FieldSpec = { name: "day-of-week", min: 0, max: 7, starMax: 6, names: DAY_NAMES };

/** Most days each month can have (February: leap years). */
const MAX_DAYS = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31] as const;

const MAX_EXPR_LENGTH = 256;

/** What an expression allows, field by field (the parsed form the matcher works from). */
export interface CronFields {
  readonly seconds: readonly number[];
  readonly minutes: readonly number[];
  readonly hours: readonly number[];
  readonly months: readonly number[];
  /** null: day-of-month is `*`. */
  readonly daysOfMonth: { readonly values: readonly number[]; readonly last: boolean } | null;
  /** null: day-of-week is `*`. `last`: weekdays written dL; `nth`: the whole field was d#n. */
  readonly daysOfWeek: { readonly values: readonly number[]; readonly last: readonly number[]; readonly nth: { readonly day: number; readonly n: number } | null } | null;
}

export interface ValidatedCron {
  /** Trimmed, single-spaced, in the field count the user wrote (5 or 6). */
  readonly expr: string;
  /** Always six fields (second first). */
  readonly sixField: string;
  readonly fields: CronFields;
}

function cronError(expr: unknown, why: string): never {
  throw new InvalidInputError("cron", expr, why, "AX_E_CRON_FIELD");
}

/** Parses one field into the set of values it allows; throws naming the field and token. */
interface ParsedField { values: Set<number>; lastDay: boolean; lastWeekdays: Set<number>; nth: { day: number; n: number } | null }

/**
 * Parses one field into the set of values it allows; throws naming the field and token.
 * Overlapping items (`0,7` in day-of-week, `*\/15,30`, `8-18,12`) are merged, as in every cron.
 */
function parseField(expr: string, f: FieldSpec, text: string): ParsedField {
  const bad = (detail: string): never => cronError(expr, `${f.name} field "${text}": ${detail}`);
  const values = new Set<number>();
  const lastWeekdays = new Set<number>();
  let lastDay = false;

  const value = (token: string, item: string): number => {
    if (token === "") bad(`"${item}" is missing a value`);
    if (/^\d+$/.test(token)) {
      const n = Number(token);
      if (n < f.min || n > f.max) bad(`${token} is out of range ${f.min}-${f.max}`);
      return n;
    }
    const named = f.names?.indexOf(token.toLowerCase()) ?? -1;
    if (named >= 0) return named + f.min;
    return bad(`"${token}" is not a number${f.names ? ` or a name (${f.names[0]}-${f.names[f.names.length - 1]})` : ""}`);
  };

  if (f === DAY_OF_WEEK && text.includes("#")) {
    const m = /^([^#]+)#([^#]*)$/.exec(text);
    if (!m) bad(`"#" takes one weekday and an occurrence, e.g. 5#3 (third Friday), and no list or range`);
    const day = value(m![1]!, text);
    if (!/^[1-5]$/.test(m![2]!)) bad(`occurrence "${m![2]}" must be 1-5`);
    return { values, lastDay, lastWeekdays, nth: { day: day % 7, n: Number(m![2]) } };
  }

  for (const item of text.split(",")) {
    if (item === "") bad("empty list item");
    // Hashed values are seeded per parse; without a shared seed every node would pick a
    // different minute and a failover would move the schedule.
    if (/^H(?:\(|\/|$)/.test(item)) bad(`"${item}": H (hashed) values are not supported`);
    if (f === DAY_OF_MONTH && item === "L") { lastDay = true; continue; }
    if (f === DAY_OF_WEEK && /L$/.test(item)) {
      if (!/^[0-7]L$/.test(item)) bad(`"${item}": L in day-of-week needs one weekday number, e.g. 5L (last Friday)`);
      lastWeekdays.add(Number(item[0]) % 7);
      continue;
    }
    const parts = item.split("/");
    if (parts.length > 2) bad(`"${item}" has more than one "/"`);
    const [base = "", stepText] = parts;
    let lo: number; let hi: number;
    if (base === "*") { lo = f.min; hi = f.starMax; }
    else if (base.includes("-")) {
      const ends = base.split("-");
      if (ends.length !== 2) bad(`"${item}" is not a range a-b`);
      lo = value(ends[0]!, item); hi = value(ends[1]!, item);
      if (lo > hi) bad(`range "${base}" runs backwards (wrap-around ranges are not supported)`);
    } else {
      lo = value(base, item);
      // "a/s" means a, a+s, ... up to the end of the field, as in Vixie cron (day-of-week "a/s"
      // runs up to 7 = Sunday).
      hi = stepText === undefined ? lo : f.max;
    }
    let step = 1;
    if (stepText !== undefined) {
      if (!/^\d+$/.test(stepText) || Number(stepText) < 1) bad(`step "${stepText}" in "${item}" must be a whole number >= 1`);
      step = Number(stepText);
      // `*/90` in minutes silently means "at minute 0"; someone who wrote it wanted something else.
      if (step > hi - lo) bad(`step ${step} in "${item}" leaves only ${lo} in ${lo}-${hi}; write ${lo} if that is meant`);
    }
    for (let v = lo; v <= hi; v += step) values.add(f === DAY_OF_WEEK ? v % 7 : v);
  }
  return { values, lastDay, lastWeekdays, nth: null };
}

const sorted = (s: Set<number>): number[] => [...s].sort((a, b) => a - b);

/**
 * Validates a 5- or 6-field cron expression. Every refusal is AX_E_CRON_FIELD on field "cron",
 * naming the cron field and the offending token.
 */
export function validateCron(input: unknown): ValidatedCron {
  if (typeof input !== "string") cronError(input, "must be a string such as \"0 2 * * *\"");
  if (input.length > MAX_EXPR_LENGTH) cronError(input, `longer than ${MAX_EXPR_LENGTH} characters`);
  const trimmed = input.trim();
  if (trimmed.startsWith("@")) cronError(input, `macros such as ${trimmed.split(/\s+/)[0]} are not supported; write the fields, e.g. "0 0 * * *"`);
  const atoms = trimmed === "" ? [] : trimmed.split(/\s+/);
  if (atoms.length !== 5 && atoms.length !== 6) {
    cronError(input, `expected 5 fields (minute hour day-of-month month day-of-week) or 6 (second first), got ${atoms.length}`);
  }
  const six = atoms.length === 6 ? atoms : ["0", ...atoms];
  const specs = [SECOND, MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK];
  const parsed = six.map((text, i) => parseField(input, specs[i]!, text));

  const [domText, monthText, dowText] = [six[3]!, six[4]!, six[5]!];
  if (domText !== "*" && dowText !== "*") {
    // Vixie cron fires when EITHER day field matches, which almost nobody expects; refuse it
    // and say why.
    cronError(input, `day-of-month "${domText}" and day-of-week "${dowText}" are both restricted; cron would fire when either matches. Set one of them to *`);
  }
  const dom = parsed[3]!;
  if (domText !== "*" && !dom.lastDay) {
    const months = parsed[4]!.values;
    const possible = [...dom.values].some((d) => [...months].some((m) => d <= MAX_DAYS[m - 1]!));
    if (!possible) cronError(input, `day-of-month "${domText}" never occurs in month "${monthText}"`);
  }
  const [sec, min, hour, , month, dow] = parsed as [ParsedField, ParsedField, ParsedField, ParsedField, ParsedField, ParsedField];
  const fields: CronFields = {
    seconds: sorted(sec.values), minutes: sorted(min.values), hours: sorted(hour.values), months: sorted(month.values),
    daysOfMonth: domText === "*" ? null : { values: sorted(dom.values), last: dom.lastDay },
    daysOfWeek: dowText === "*" ? null : { values: sorted(dow.values), last: sorted(dow.lastWeekdays), nth: dow.nth },
  };
  return { expr: atoms.join(" "), sixField: six.join(" "), fields };
}


/* ------------------------------------------------------------------------------------------ */
/*  Matching naive wall-clock times (a wall time is written as the UTC ms of the same fields).  */

const SEC = 1000;
const DAY = 86_400_000;
/** The Gregorian calendar (weekdays included) repeats every 400 years: a valid expression matches within one cycle. */
const MONTHS_SCANNED = 401 * 12;
/** Slots are computed for years 1 to 9999; outside, a trigger has no slots. */
export const CRON_FIRST_MS = yearStart(1);
export const CRON_LAST_MS = yearStart(10_000) - SEC;

function utcDay(y: number, mo: number, d: number): number {
  return y >= 100 ? Date.UTC(y, mo - 1, d) : yearStart(y) + (Date.UTC(2001, mo - 1, d) - Date.UTC(2001, 0, 1)) + (mo > 2 && isLeap(y) ? DAY : 0);
}
function isLeap(y: number): boolean {
  return (y % 4 === 0 && y % 100 !== 0) || y % 400 === 0;
}
function daysIn(y: number, mo: number): number {
  return mo === 2 ? (isLeap(y) ? 29 : 28) : [31, 0, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][mo - 1]!;
}

/** index[x] = index in `values` of the first value >= x (ge) or the last value <= x (le), -1 if none. */
function indexTable(values: readonly number[], size: number, ge: boolean): Int8Array {
  const t = new Int8Array(size).fill(-1);
  for (let x = 0; x < size; x++) {
    if (ge) { const i = values.findIndex((v) => v >= x); t[x] = i; }
    else { for (let i = values.length - 1; i >= 0; i--) if (values[i]! <= x) { t[x] = i; break; } }
  }
  return t;
}

/** Matches wall-clock times against the fields; all arithmetic on naive (zone-less) times. */
export class WallMatcher {
  readonly #S: readonly number[]; readonly #M: readonly number[]; readonly #H: readonly number[];
  readonly #geS: Int8Array; readonly #geM: Int8Array; readonly #geH: Int8Array;
  readonly #leS: Int8Array; readonly #leM: Int8Array; readonly #leH: Int8Array;
  readonly #months: boolean[] = new Array<boolean>(13).fill(false);
  readonly #dom: { set: boolean[]; last: boolean } | null;
  readonly #dow: { set: boolean[]; last: boolean[]; nth: { day: number; n: number } | null } | null;
  /** The hour field allows all 24 hours (the default DST repeat rule depends on it). */
  readonly allHours: boolean;

  constructor(f: CronFields) {
    this.#S = f.seconds; this.#M = f.minutes; this.#H = f.hours;
    this.#geS = indexTable(f.seconds, 60, true); this.#leS = indexTable(f.seconds, 60, false);
    this.#geM = indexTable(f.minutes, 60, true); this.#leM = indexTable(f.minutes, 60, false);
    this.#geH = indexTable(f.hours, 24, true); this.#leH = indexTable(f.hours, 24, false);
    for (const m of f.months) this.#months[m] = true;
    this.allHours = f.hours.length === 24;
    if (f.daysOfMonth) {
      const set = new Array<boolean>(32).fill(false);
      for (const d of f.daysOfMonth.values) set[d] = true;
      this.#dom = { set, last: f.daysOfMonth.last };
    } else this.#dom = null;
    if (f.daysOfWeek) {
      const set = new Array<boolean>(7).fill(false);
      const last = new Array<boolean>(7).fill(false);
      for (const d of f.daysOfWeek.values) set[d] = true;
      for (const d of f.daysOfWeek.last) last[d] = true;
      this.#dow = { set, last, nth: f.daysOfWeek.nth };
    } else this.#dow = null;
  }

  #dayMatches(day: number, dim: number, wd: number): boolean {
    const dom = this.#dom; const dow = this.#dow;
    if (dom !== null && !(dom.set[day] || (dom.last && day === dim))) return false;
    if (dow !== null && !(dow.set[wd] || (dow.last[wd] && day + 7 > dim) || (dow.nth !== null && dow.nth.day === wd && Math.ceil(day / 7) === dow.nth.n))) return false;
    return true;
  }

  /** First allowed second-of-day >= sod, or -1. */
  #todGE(sod: number): number {
    const S = this.#S; const M = this.#M; const H = this.#H;
    const h = Math.floor(sod / 3600); const m = Math.floor(sod / 60) % 60; const s = sod % 60;
    const hi = this.#geH[h]!;
    if (hi < 0) return -1;
    if (H[hi]! > h) return H[hi]! * 3600 + M[0]! * 60 + S[0]!;
    const mi = this.#geM[m]!;
    if (mi >= 0) {
      if (M[mi]! > m) return h * 3600 + M[mi]! * 60 + S[0]!;
      const si = this.#geS[s]!;
      if (si >= 0) return h * 3600 + m * 60 + S[si]!;
      if (mi + 1 < M.length) return h * 3600 + M[mi + 1]! * 60 + S[0]!;
    }
    return hi + 1 < H.length ? H[hi + 1]! * 3600 + M[0]! * 60 + S[0]! : -1;
  }

  /** Last allowed second-of-day <= sod, or -1. */
  #todLE(sod: number): number {
    const S = this.#S; const M = this.#M; const H = this.#H;
    const lastS = S[S.length - 1]!; const lastM = M[M.length - 1]!;
    const h = Math.floor(sod / 3600); const m = Math.floor(sod / 60) % 60; const s = sod % 60;
    const hi = this.#leH[h]!;
    if (hi < 0) return -1;
    if (H[hi]! < h) return H[hi]! * 3600 + lastM * 60 + lastS;
    const mi = this.#leM[m]!;
    if (mi >= 0) {
      if (M[mi]! < m) return h * 3600 + M[mi]! * 60 + lastS;
      const si = this.#leS[s]!;
      if (si >= 0) return h * 3600 + m * 60 + S[si]!;
      if (mi - 1 >= 0) return h * 3600 + M[mi - 1]! * 60 + lastS;
    }
    return hi - 1 >= 0 ? H[hi - 1]! * 3600 + lastM * 60 + lastS : -1;
  }

  /** The smallest matching wall time >= `wall`, or null (none within the years 1-9999). */
  next(wall: number): number | null {
    const w = Math.max(CRON_FIRST_MS, Math.ceil(wall / SEC) * SEC);
    if (!(w <= CRON_LAST_MS + 2 * MAX_OFFSET_MS)) return null;
    const d = new Date(w);
    let y = d.getUTCFullYear(); let mo = d.getUTCMonth() + 1; let day = d.getUTCDate();
    let sod = d.getUTCHours() * 3600 + d.getUTCMinutes() * 60 + d.getUTCSeconds();
    for (let n = 0; n <= MONTHS_SCANNED && y <= 10_000; n++) {
      if (this.#months[mo]) {
        const dim = daysIn(y, mo);
        const first = utcDay(y, mo, 1);
        const wd1 = new Date(first).getUTCDay();
        for (; day <= dim; day++, sod = 0) {
          if (!this.#dayMatches(day, dim, (wd1 + day - 1) % 7)) continue;
          const t = this.#todGE(sod);
          if (t >= 0) return first + (day - 1) * DAY + t * SEC;
        }
      }
      mo++; if (mo === 13) { mo = 1; y++; }
      day = 1; sod = 0;
    }
    return null;
  }

  /** The largest matching wall time <= `wall`, or null. */
  prev(wall: number): number | null {
    const w = Math.min(CRON_LAST_MS + 2 * MAX_OFFSET_MS, Math.floor(wall / SEC) * SEC);
    if (!(w >= CRON_FIRST_MS)) return null;
    const d = new Date(w);
    let y = d.getUTCFullYear(); let mo = d.getUTCMonth() + 1; let day = d.getUTCDate();
    let sod = d.getUTCHours() * 3600 + d.getUTCMinutes() * 60 + d.getUTCSeconds();
    for (let n = 0; n <= MONTHS_SCANNED && y >= 1; n++) {
      if (this.#months[mo]) {
        const dim = daysIn(y, mo);
        const first = utcDay(y, mo, 1);
        const wd1 = new Date(first).getUTCDay();
        for (; day >= 1; day--, sod = 86_399) {
          if (!this.#dayMatches(day, dim, (wd1 + day - 1) % 7)) continue;
          const t = this.#todLE(sod);
          if (t >= 0) return first + (day - 1) * DAY + t * SEC;
        }
      }
      mo--; if (mo === 0) { mo = 12; y--; }
      day = daysIn(y, mo); sod = 86_399;
    }
    return null;
  }

  /** Whether the wall time (whole seconds) matches. */
  matches(wall: number): boolean {
    return wall % SEC === 0 && this.next(wall) === wall;
  }
}

/* ------------------------------------------------------------------------------------------ */
/*  DST policy and the zone arithmetic.                                                         */

export type { DstGap, DstRepeat };
export const DST_GAPS: readonly DstGap[] = ["shift", "skip", "transition"];
export const DST_REPEATS: readonly DstRepeat[] = ["first", "second", "both"];


export interface CachedCron {
  readonly expr: string;
  readonly tz: string;
  readonly matcher: WallMatcher;
  readonly gap: DstGap;
  /** Resolved: an expression whose hour field is all 24 hours defaults to "both", any other to "first". */
  readonly repeat: DstRepeat;
}

/** Wall-time intervals [a, b), ascending. */
type Iv = readonly [number, number];

const H18 = MAX_OFFSET_MS;
/** Two instants with the same wall time are at most this far apart (offsets differ by < 36 h). */
const H36 = 2 * MAX_OFFSET_MS;

/** The wall times of the instants in [from, to), as intervals in instant order. */
function wallsOf(tz: string, from: number, to: number): Iv[] {
  const out: Iv[] = [];
  for (let x = from; x < to;) {
    const p = pieceAt(tz, x);
    const e = Math.min(p.end, to);
    out.push([x + p.offset, e + p.offset]);
    x = e;
  }
  return out;
}

function minus(ivs: readonly Iv[], cuts: readonly Iv[]): Iv[] {
  let out: Iv[] = [...ivs];
  for (const [ca, cb] of cuts) {
    if (cb <= ca) continue;
    const next: Iv[] = [];
    for (const [a, b] of out) {
      if (cb <= a || ca >= b) { next.push([a, b]); continue; }
      if (a < ca) next.push([a, ca]);
      if (cb < b) next.push([cb, b]);
    }
    out = next;
  }
  return out;
}

/** The walls a piece may fire at for instants [lo, hi), after the repeat rule. */
function ownWalls(c: CachedCron, p: Piece, lo: number, hi: number): Iv[] {
  const ivs: Iv[] = [[lo + p.offset, hi + p.offset]];
  if (c.repeat === "first") return minus(ivs, wallsOf(c.tz, p.start - H36, p.start));
  if (c.repeat === "second") return minus(ivs, wallsOf(c.tz, p.end, p.end + H36));
  return ivs;
}

/** The wall times skipped by the transition at the start of `p` (none unless the clock jumped forward). */
function gapBefore(c: CachedCron, p: Piece): { before: number; ivs: Iv[] } | null {
  const before = offsetMsAt(c.tz, p.start - 1);
  if (before >= p.offset) return null;
  const ivs = minus([[p.start + before, p.start + p.offset]], wallsOf(c.tz, p.start - H36, p.start + H36));
  return ivs.length > 0 ? { before, ivs } : null;
}

let lastSteps = 0;
let maxSteps = 0;
/**
 * Each step is one piece (a stretch of constant offset, at most a year) and a handful of
 * matcher calls. A valid expression matches within a 400-year cycle and empty stretches are
 * jumped over, so calls take a few steps; the limit is a guard against a bug, not a budget.
 */
const STEP_GUARD = 100_000;

function guard(c: CachedCron, steps: number, at: number): void {
  if (steps > STEP_GUARD) {
    throw new AxError("AX_E_INTERNAL", `cron "${c.expr}" in ${c.tz}: no progress after ${STEP_GUARD} steps near ${new Date(at).toISOString()} (a bug)`);
  }
}

/** For tests: steps taken by the latest next()/prev() and the most by any call so far. */
export function cronStepStats(): { last: number; max: number } {
  return { last: lastSteps, max: maxSteps };
}
function record(steps: number): void {
  lastSteps = steps;
  if (steps > maxSteps) maxSteps = steps;
}

/**
 * The first slot strictly after `afterMs`, or null (none before year 10000).
 *
 * Slots of a piece p (offset o, instants [start, end)): instants s whose wall time s + o
 * matches and passes the repeat rule; plus, when the clock jumped forward at p.start, the
 * matching wall times W it skipped: "shift" fires at W read with the offset before the jump,
 * "transition" at p.start, "skip" not at all. Those lie in [p.start, p.start + 36 h), so the
 * walk starts 36 h early and stops at the first piece that starts after the best slot found.
 */
export function cronNext(c: CachedCron, afterMs: number): number | null {
  const m = c.matcher;
  const x = Math.max(CRON_FIRST_MS, Math.floor(afterMs / SEC) * SEC + SEC);
  if (x > CRON_LAST_MS) return null;
  let best = Infinity;
  let steps = 0;
  let p = pieceAt(c.tz, x - H36);
  for (;;) {
    guard(c, ++steps, p.start);
    if (p.start > best) break;
    if (c.gap !== "skip") {
      const g = gapBefore(c, p);
      if (g !== null) {
        for (const [a, b] of g.ivs) {
          if (c.gap === "shift") {
            const w = m.next(Math.max(a, x + g.before));
            if (w !== null && w < b) best = Math.min(best, w - g.before);
          } else if (p.start >= x) {
            const w = m.next(a);
            if (w !== null && w < b) best = Math.min(best, p.start);
          }
        }
      }
    }
    const lo = Math.max(p.start, x);
    if (lo < p.end) {
      for (const [a, b] of ownWalls(c, p, lo, p.end)) {
        const w = m.next(a);
        if (w !== null && w < b) { best = Math.min(best, w - p.offset); break; }
      }
    }
    if (p.end > CRON_LAST_MS) break;
    let to = p.end;
    if (best === Infinity) {
      // Nothing here: any later slot has a matching wall time >= p.end - 18 h and lies at
      // most 18 h before it; its gap, if any, started at most 36 h before that.
      const w = m.next(p.end - H18);
      if (w === null) break;
      to = Math.max(p.end, w - H18 - H36);
    }
    p = pieceAt(c.tz, to);
  }
  record(steps);
  return best === Infinity || best > CRON_LAST_MS ? null : best;
}

/** The last slot strictly before `beforeMs`, or null. The mirror image of cronNext. */
export function cronPrev(c: CachedCron, beforeMs: number): number | null {
  const m = c.matcher;
  const y = Math.min(CRON_LAST_MS, Math.ceil(beforeMs / SEC) * SEC - SEC);
  if (y < CRON_FIRST_MS) return null;
  let best = -Infinity;
  let steps = 0;
  let p = pieceAt(c.tz, y);
  for (;;) {
    guard(c, ++steps, p.start);
    // A piece's slots are below max(end, start + 36 h) (a shifted gap slot may pass its end).
    if (Math.max(p.end, p.start + H36) <= best) break;
    const hi = Math.min(p.end - SEC, y);
    if (hi >= p.start) {
      const ivs = ownWalls(c, p, p.start, hi + SEC);
      for (let i = ivs.length - 1; i >= 0; i--) {
        const [a, b] = ivs[i]!;
        const w = m.prev(b - SEC);
        if (w !== null && w >= a) { best = Math.max(best, w - p.offset); break; }
      }
    }
    if (c.gap !== "skip") {
      const g = gapBefore(c, p);
      if (g !== null) {
        for (const [a, b] of g.ivs) {
          if (c.gap === "shift") {
            const w = m.prev(Math.min(b - SEC, y + g.before));
            if (w !== null && w >= a) best = Math.max(best, w - g.before);
          } else if (p.start <= y) {
            const w = m.next(a);
            if (w !== null && w < b) best = Math.max(best, p.start);
          }
        }
      }
    }
    if (p.start <= CRON_FIRST_MS) break;
    let to = p.start - 1;
    if (best === -Infinity) {
      // Any earlier slot has a matching wall time below p.start + 18 h and lies at most 18 h after it.
      const w = m.prev(p.start + H18);
      if (w === null) break;
      to = Math.min(p.start - 1, w + H18);
    }
    p = pieceAt(c.tz, to);
  }
  record(steps);
  return best === -Infinity || best < CRON_FIRST_MS ? null : best;
}

/** Whether the wall-clock fields of `ms` (in the cron's zone) match the expression. */
export function cronIncludes(c: CachedCron, ms: number): boolean {
  return c.matcher.matches(ms + offsetMsAt(c.tz, ms));
}

/** Why a slot is where it is, for explain() and previews. */
export type SlotNote =
  | { kind: "plain"; wall: number }
  /** The named wall time was skipped by the clock; `wall` is the time the expression named. */
  | { kind: "gap-shift" | "gap-transition"; wall: number }
  /** The wall time happened `of` times; this slot is copy number `copy` (1-based). */
  | { kind: "repeat"; wall: number; copy: number; of: number; fired: DstRepeat };

export function slotNote(c: CachedCron, slotMs: number): SlotNote {
  const off = offsetMsAt(c.tz, slotMs);
  const wall = slotMs + off;
  if (c.matcher.matches(wall)) {
    const all = instantsOfWall(c.tz, wall);
    if (all.length > 1) return { kind: "repeat", wall, copy: all.indexOf(slotMs) + 1, of: all.length, fired: c.repeat };
    return { kind: "plain", wall };
  }
  const p = pieceAt(c.tz, slotMs);
  // The jump whose skipped wall times produced this slot: the latest forward jump at or before it.
  for (let q = p, n = 0; n < 8; n++) {
    const before = offsetMsAt(c.tz, q.start - 1);
    if (before < q.offset) {
      if (c.gap === "transition") {
        const w = c.matcher.next(q.start + before);
        return { kind: "gap-transition", wall: w ?? q.start + before };
      }
      return { kind: "gap-shift", wall: slotMs + before };
    }
    q = pieceAt(c.tz, q.start - 1);
  }
  return { kind: "plain", wall };
}

/**
 * Matching wall times that no slot stands for in (fromMs, toMs]: those in a gap under
 * `dst-gap skip`, and the copies of a repeated wall time the repeat rule does not fire.
 * `at` is the instant the wall time fell in (the jump for a gap). At most `max` of them.
 */
export function cronUnfired(c: CachedCron, fromMs: number, toMs: number, max = 20): Array<{ wall: number; at: number; why: "gap" | "repeat" }> {
  const out: Array<{ wall: number; at: number; why: "gap" | "repeat" }> = [];
  for (let x = fromMs + 1; x <= toMs && out.length < max;) {
    const p = pieceAt(c.tz, x);
    if (c.gap === "skip" && p.start > fromMs && p.start <= toMs) {
      const g = gapBefore(c, p);
      for (const [a, b] of g?.ivs ?? []) {
        for (let w = c.matcher.next(a); w !== null && w < b && out.length < max; w = c.matcher.next(w + SEC)) out.push({ wall: w, at: p.start, why: "gap" });
      }
    }
    if (c.repeat !== "both") {
      const lo = Math.max(p.start, fromMs + SEC); const hi = Math.min(p.end, toMs + SEC);
      if (lo < hi) {
        const fired = ownWalls(c, p, lo, hi);
        for (const [a, b] of minus([[lo + p.offset, hi + p.offset]], fired)) {
          for (let w = c.matcher.next(a); w !== null && w < b && out.length < max; w = c.matcher.next(w + SEC)) out.push({ wall: w, at: w - p.offset, why: "repeat" });
        }
      }
    }
    x = p.end;
  }
  return out.sort((a, b) => a.at - b.at);
}

/**
 * Up to `n` slots strictly between `floorMs` and `beforeMs`, ascending, the latest ones.
 * Used to jump over a long outage without walking every slot.
 */
export function cronLatestBefore(c: CachedCron, beforeMs: number, floorMs: number, n: number): number[] {
  const out: number[] = [];
  for (let cursor = beforeMs; out.length < n;) {
    const p = cronPrev(c, cursor);
    if (p === null || p <= floorMs) break;
    out.push(p);
    cursor = p;
  }
  return out.reverse();
}

/* ------------------------------------------------------------------------------------------ */

// Bounded so a flood of distinct expressions cannot grow memory without limit; Map keeps
// insertion order, which makes it a cheap LRU (touch = delete + set).
const CACHE_LIMIT = 10_000;
const cache = new Map<string, CachedCron>();
let parseCount = 0;

const keyOf = (expr: string, tz: string, gap: DstGap | undefined, repeat: DstRepeat | undefined): string =>
  `${tz}\u0000${expr}\u0000${gap ?? ""}\u0000${repeat ?? ""}`;

/**
 * The compiled expression for (expr, tz, DST policy), built at most once while cached.
 * Validates on a miss, so a spec read back from storage gets the same checks as user input.
 */
export function cachedCron(expr: string, tz: string, dst: { gap?: DstGap; repeat?: DstRepeat } = {}): CachedCron {
  const rawKey = keyOf(expr, tz, dst.gap, dst.repeat);
  const hit = cache.get(rawKey);
  if (hit !== undefined) {
    cache.delete(rawKey);
    cache.set(rawKey, hit);
    return hit;
  }
  const v = validateCron(expr);
  const zone = canonicalTimeZone("tz", tz);
  const key = keyOf(v.expr, zone, dst.gap, dst.repeat);
  let entry = cache.get(key);
  if (entry === undefined) {
    const matcher = new WallMatcher(v.fields);
    parseCount++;
    entry = { expr: v.expr, tz: zone, matcher, gap: dst.gap ?? "shift", repeat: dst.repeat ?? (matcher.allHours ? "both" : "first") };
    cache.set(key, entry);
  }
  // A non-canonical spelling ("asia/shanghai", extra spaces) gets its own key to the same entry.
  if (rawKey !== key) cache.set(rawKey, entry);
  while (cache.size > CACHE_LIMIT) cache.delete(cache.keys().next().value!);
  return entry;
}

/** For tests: how many times an expression was really compiled, and the cache size. */
export function cronCacheStats(): { parses: number; size: number } {
  return { parses: parseCount, size: cache.size };
}
