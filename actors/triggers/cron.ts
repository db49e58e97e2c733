import { CronExpressionParser, type CronExpression } from "cron-parser";
import { InvalidInputError } from "../../common/index.ts";
import { canonicalTimeZone } from "./zone.ts";

/**
 * Cron support: our own field-by-field validation (cron-parser's errors do not say which field
 * or token was wrong), and a cache of parsed expressions, because parsing costs ~100 µs and
 * next() sits on the scheduling hot path.
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

export interface ValidatedCron {
  /** Trimmed, single-spaced, in the field count the user wrote (5 or 6). */
  readonly expr: string;
  /** Always six fields (second first), the form handed to cron-parser in strict mode. */
  readonly sixField: string;
}

function cronError(expr: unknown, why: string): never {
  throw new InvalidInputError("cron", expr, why, "AX_E_CRON_FIELD");
}

/** Parses one field into the set of values it allows; throws naming the field and token. */
function parseField(expr: string, f: FieldSpec, text: string): { values: Set<number>; lastDay: boolean } {
  const bad = (detail: string): never => cronError(expr, `${f.name} field "${text}": ${detail}`);
  const values = new Set<number>();
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
    values.add(day % 7);
    return { values, lastDay };
  }

  for (const item of text.split(",")) {
    if (item === "") bad("empty list item");
    // Hashed values are seeded per parse; without a shared seed every node would pick a
    // different minute and a failover would move the schedule.
    if (/^H(?:\(|\/|$)/.test(item)) bad(`"${item}": H (hashed) values are not supported`);
    if (f === DAY_OF_MONTH && item === "L") { lastDay = true; continue; }
    if (f === DAY_OF_WEEK && /L$/.test(item)) {
      if (!/^[0-7]L$/.test(item)) bad(`"${item}": L in day-of-week needs one weekday number, e.g. 5L (last Friday)`);
      values.add(Number(item[0]) % 7);
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
      // "a/s" means a, a+s, ... up to the end of the field, as in Vixie cron (and cron-parser,
      // which runs day-of-week "a/s" up to 7 = Sunday).
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
  return { values, lastDay };
}

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
    // Vixie cron fires when EITHER day field matches, which almost nobody expects; cron-parser's
    // strict mode refuses it too, so say why here instead of passing on its generic error.
    cronError(input, `day-of-month "${domText}" and day-of-week "${dowText}" are both restricted; cron would fire when either matches. Set one of them to *`);
  }
  const dom = parsed[3]!;
  if (domText !== "*" && !dom.lastDay) {
    const months = parsed[4]!.values;
    const possible = [...dom.values].some((d) => [...months].some((m) => d <= MAX_DAYS[m - 1]!));
    if (!possible) cronError(input, `day-of-month "${domText}" never occurs in month "${monthText}"`);
  }
  return { expr: atoms.join(" "), sixField: six.join(" ") };
}

/* ------------------------------------------------------------------------------------------ */

export interface CachedCron {
  readonly expr: string;
  readonly tz: string;
  readonly expression: CronExpression;
}

// Bounded so a flood of distinct expressions cannot grow memory without limit; Map keeps
// insertion order, which makes it a cheap LRU (touch = delete + set).
const CACHE_LIMIT = 10_000;
const cache = new Map<string, CachedCron>();
let parseCount = 0;

const keyOf = (expr: string, tz: string): string => `${tz}\u0000${expr}`;

/**
 * The parsed expression for (expr, tz), parsed at most once while cached. Validates both on a
 * miss, so a spec read back from storage gets the same checks as user input.
 */
export function cachedCron(expr: string, tz: string): CachedCron {
  const rawKey = keyOf(expr, tz);
  const hit = cache.get(rawKey);
  if (hit !== undefined) {
    cache.delete(rawKey);
    cache.set(rawKey, hit);
    return hit;
  }
  const v = validateCron(expr);
  const zone = canonicalTimeZone("tz", tz);
  const key = keyOf(v.expr, zone);
  let entry = cache.get(key);
  if (entry === undefined) {
    let expression: CronExpression;
    try {
      expression = CronExpressionParser.parse(v.sixField, { tz: zone, strict: true, currentDate: 0 });
    } catch (e) {
      // Our validation should have caught everything; this is the backstop.
      cronError(expr, `refused by the cron parser: ${(e as Error).message}`);
    }
    parseCount++;
    entry = { expr: v.expr, tz: zone, expression };
    cache.set(key, entry);
  }
  // A non-canonical spelling ("asia/shanghai", extra spaces) gets its own key to the same entry.
  if (rawKey !== key) cache.set(rawKey, entry);
  while (cache.size > CACHE_LIMIT) cache.delete(cache.keys().next().value!);
  return entry;
}

/** For tests: how many times an expression was really parsed, and the cache size. */
export function cronCacheStats(): { parses: number; size: number } {
  return { parses: parseCount, size: cache.size };
}

/* ------------------------------------------------------------------------------------------ */

// The cached CronExpression is a stateful iterator shared by every trigger with the same
// (expr, tz); reset() + next() is safe because both run synchronously on one thread.

function noSlot(c: CachedCron, afterMs: number, e: unknown): never {
  throw new InvalidInputError("cron", c.expr,
    `no time matching it in ${c.tz} found after ${new Date(afterMs).toISOString()} (${(e as Error).message})`, "AX_E_CRON_FIELD");
}

/** First matching instant strictly after `afterMs`. */
export function cronNext(c: CachedCron, afterMs: number): number {
  try {
    c.expression.reset(new Date(afterMs));
    return c.expression.next().getTime();
  } catch (e) {
    return noSlot(c, afterMs, e);
  }
}

function cronPrev(c: CachedCron, beforeMs: number): number | null {
  try {
    c.expression.reset(new Date(beforeMs));
    return c.expression.prev().getTime();
  } catch {
    return null;
  }
}

/** Whether the wall-clock fields of `ms` (in the cron's zone) match the expression. */
export function cronIncludes(c: CachedCron, ms: number): boolean {
  return c.expression.includesDate(new Date(ms));
}

/**
 * Up to `n` slots strictly between `floorMs` and `beforeMs`, ascending, the latest ones.
 * Used to jump over a long outage without walking every slot.
 *
 * prev() is not the exact inverse of next() around DST: after a fall-back it returns the
 * second copy of a repeated wall time (e.g. 01:30 EST) that a forward walk from the first copy
 * skips. A slot only counts if next(prev(slot)) lands on it, which keeps the result identical to
 * what walking forward would have produced.
 */
export function cronLatestBefore(c: CachedCron, beforeMs: number, floorMs: number, n: number): number[] {
  const out: number[] = [];
  let cursor = beforeMs;
  for (let guard = 0; out.length < n && guard < 2 * n + 8; guard++) {
    const p = cronPrev(c, cursor);
    if (p === null || p <= floorMs) break;
    const q = cronPrev(c, p);
    if (q === null || cronNext(c, q) === p) out.push(p);
    cursor = p;
  }
  return out.reverse();
}
