import { InvalidInputError } from "../../common/index.ts";

/**
 * Time-zone helpers on top of Intl, so the trigger module needs no date library of its own.
 */

// Intl.DateTimeFormat construction costs tens of microseconds; explain()/describe() format
// many instants in few zones, so one formatter per zone is kept.
const formatters = new Map<string, Intl.DateTimeFormat>();

function formatter(tz: string): Intl.DateTimeFormat {
  let f = formatters.get(tz);
  if (f === undefined) {
    f = new Intl.DateTimeFormat("en-US", {
      timeZone: tz, hourCycle: "h23", timeZoneName: "longOffset",
      year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit",
    });
    formatters.set(tz, f);
  }
  return f;
}

/**
 * Returns the canonical IANA name for `tz` or throws AX_E_TIMEZONE naming `field`.
 * Canonicalising ("asia/shanghai" → "Asia/Shanghai", "US/Eastern" → "America/New_York")
 * makes equal zones compare equal, so they share one cached cron expression.
 */
export function canonicalTimeZone(field: string, tz: unknown): string {
  if (typeof tz !== "string" || tz.trim() === "") {
    throw new InvalidInputError(field, tz, "time zone must be an IANA name such as UTC or Europe/Berlin", "AX_E_TIMEZONE");
  }
  let resolved: string;
  try {
    resolved = new Intl.DateTimeFormat("en-US", { timeZone: tz.trim() }).resolvedOptions().timeZone;
  } catch {
    throw new InvalidInputError(field, tz, `unknown time zone "${tz}"; use an IANA name such as UTC or America/New_York`, "AX_E_TIMEZONE");
  }
  // Newer ICU versions accept raw offsets ("+08:00"); an offset has no DST rules and is not a
  // zone, and older nodes in the cluster would reject it, so refuse it everywhere.
  if (/^[+-]/.test(resolved)) {
    throw new InvalidInputError(field, tz, "a UTC offset is not a time zone; use an IANA name such as Etc/GMT-8 or Asia/Shanghai", "AX_E_TIMEZONE");
  }
  return resolved;
}

interface WallParts { year: string; month: string; day: string; hour: string; minute: string; second: string; offsetMin: number }

function wallParts(ms: number, tz: string): WallParts {
  const out: Record<string, string> = {};
  for (const p of formatter(tz).formatToParts(ms)) out[p.type] = p.value;
  // longOffset renders as "GMT", "GMT+08:00" or "GMT-05:30".
  const m = /^GMT(?:([+-])(\d{2}):(\d{2}))?$/.exec(out.timeZoneName ?? "");
  const offsetMin = m && m[1] ? (m[1] === "-" ? -1 : 1) * (Number(m[2]) * 60 + Number(m[3])) : 0;
  return {
    year: out.year ?? "", month: out.month ?? "", day: out.day ?? "",
    hour: out.hour ?? "", minute: out.minute ?? "", second: out.second ?? "", offsetMin,
  };
}

/** `ms` as local ISO-8601 with the zone's offset, e.g. "2026-03-08T01:00:00-05:00" ("Z" at offset 0). */
export function formatInZone(ms: number, tz: string): string {
  const p = wallParts(ms, tz);
  const millis = ((ms % 1000) + 1000) % 1000;
  const frac = millis === 0 ? "" : `.${String(millis).padStart(3, "0")}`;
  let off = "Z";
  if (p.offsetMin !== 0) {
    const a = Math.abs(p.offsetMin);
    off = `${p.offsetMin < 0 ? "-" : "+"}${String(Math.floor(a / 60)).padStart(2, "0")}:${String(a % 60).padStart(2, "0")}`;
  }
  return `${p.year}-${p.month}-${p.day}T${p.hour}:${p.minute}:${p.second}${frac}${off}`;
}

/* ------------------------------------------------------------------------------------------ */
/*  Exact offsets: the transitions of a zone, found by bisection over Intl and cached per year.  */

const SECOND_MS = 1000;
const DAY_MS = 86_400_000;
/** No zone's offset is outside ±18 h (ISO-8601's limit; the real range is -12..+14 h). */
export const MAX_OFFSET_MS = 18 * 3_600_000;
// Intl is only asked about this range; beyond it a zone keeps the offset it has at the edge.
// Nobody schedules in year 9000, and it keeps Intl away from era/negative-year formatting.
const INTL_MIN_MS = Date.UTC(1000, 0, 1);
const INTL_MAX_MS = Date.UTC(9000, 0, 1);

const wallFormatters = new Map<string, Intl.DateTimeFormat>();
const WALL_RE = /^(\d+)\/(\d+)\/(\d+), (\d+):(\d+):(\d+)$/;

/**
 * The offset of `tz` at `ms`, in milliseconds (whole seconds: LMT offsets such as Monrovia's
 * -0:44:30 until 1972 keep their seconds), read from Intl's wall-clock fields. This is the only
 * place that asks Intl; everything else reads the cached transition table.
 */
function intlOffsetMs(tz: string, ms: number): number {
  let f = wallFormatters.get(tz);
  if (f === undefined) {
    f = new Intl.DateTimeFormat("en-US", {
      timeZone: tz, hourCycle: "h23", year: "numeric", month: "numeric", day: "numeric", hour: "numeric", minute: "numeric", second: "numeric",
    });
    wallFormatters.set(tz, f);
  }
  const at = Math.min(INTL_MAX_MS, Math.max(INTL_MIN_MS, ms));
  const m = WALL_RE.exec(f.format(at));
  if (!m) throw new Error(`unexpected Intl wall-clock format for ${tz}: ${f.format(at)}`);
  const wall = Date.UTC(Number(m[3]), Number(m[1]) - 1, Number(m[2]), Number(m[4]), Number(m[5]), Number(m[6]));
  return wall - (at - (((at % SECOND_MS) + SECOND_MS) % SECOND_MS));
}

/** One UTC year of a zone: offsets[i] holds from starts[i] to starts[i+1] (or the year's end). */
interface YearTable { readonly starts: number[]; readonly offsets: number[]; readonly end: number }

const tables = new Map<string, Map<number, YearTable>>();
let intlCalls = 0;

/**
 * Every 3 days: two transitions closer than that which return to the same offset would be
 * missed. The closest pair in tzdata since 1970 is 6.96 days apart (Brazil, October 2000);
 * the zone sweep (AX_SWEEP=1) compares every zone's table with the system's TZif files.
 */
const SAMPLE_MS = 3 * DAY_MS;

/**
 * A year is sampled every SAMPLE_MS and every change is bisected to the second.
 * Cost: about 190 Intl calls per zone and year, once.
 */
function buildYear(tz: string, year: number): YearTable {
  const start = yearStart(year);
  const end = yearStart(year + 1);
  const off = (ms: number): number => { intlCalls++; return intlOffsetMs(tz, ms); };
  const first = off(start);
  const starts = [start];
  const offsets = [first];
  if (end <= INTL_MIN_MS || start >= INTL_MAX_MS) return { starts, offsets, end };
  // Finds every change in (a, b] given the offsets at both ends, to the second.
  const bisect = (a: number, oa: number, b: number, ob: number): void => {
    while (oa !== ob) {
      let lo = a; let hi = b;
      while (hi - lo > SECOND_MS) {
        const mid = lo + Math.floor((hi - lo) / 2 / SECOND_MS) * SECOND_MS;
        if (off(mid) === oa) lo = mid; else hi = mid;
      }
      const oh = off(hi);
      starts.push(hi); offsets.push(oh);
      a = hi; oa = oh;
    }
  };
  let prev = start; let prevOff = first;
  for (let t = start + SAMPLE_MS; t <= end; t = Math.min(end, t + SAMPLE_MS)) {
    const o = t === end ? off(end - SECOND_MS) : off(t);
    const at = t === end ? end - SECOND_MS : t;
    if (o !== prevOff) bisect(prev, prevOff, at, o);
    prev = at; prevOff = o;
    if (t === end) break;
  }
  return { starts, offsets, end };
}

/** Date.UTC maps years 0-99 to 1900-1999; setUTCFullYear does not. */
export function yearStart(year: number): number {
  const d = new Date(Date.UTC(2000, 0, 1));
  d.setUTCFullYear(year);
  return d.getTime();
}

function yearTable(tz: string, year: number): YearTable {
  let byYear = tables.get(tz);
  if (byYear === undefined) { byYear = new Map(); tables.set(tz, byYear); }
  let t = byYear.get(year);
  if (t === undefined) { t = buildYear(tz, year); byYear.set(year, t); }
  return t;
}

/**
 * A stretch of time with one offset: [start, end), wall time = instant + offset. Pieces also
 * end at UTC year boundaries (with the same offset on both sides), which keeps every walk over
 * pieces in steps of at most a year.
 */
export interface Piece { readonly start: number; readonly end: number; readonly offset: number }

/** The piece containing instant `ms` of canonical zone `tz`. */
export function pieceAt(tz: string, ms: number): Piece {
  const year = new Date(ms).getUTCFullYear();
  const t = yearTable(tz, year);
  const { starts, offsets } = t;
  let lo = 0; let hi = starts.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (starts[mid]! <= ms) lo = mid; else hi = mid - 1;
  }
  return { start: starts[lo]!, end: lo + 1 < starts.length ? starts[lo + 1]! : t.end, offset: offsets[lo]! };
}

/** Exact offset of `tz` at `ms` in milliseconds, from the cached table. */
export function offsetMsAt(tz: string, ms: number): number {
  return pieceAt(tz, ms).offset;
}

/** The instants at which the wall time `wall` (a naive time written as UTC ms) happens in `tz`, ascending. */
export function instantsOfWall(tz: string, wall: number): number[] {
  const out: number[] = [];
  // An instant with that wall time is within ±MAX_OFFSET_MS of it.
  for (let x = wall - MAX_OFFSET_MS; x <= wall + MAX_OFFSET_MS;) {
    const p = pieceAt(tz, x);
    const s = wall - p.offset;
    if (s >= p.start && s < p.end && (out.length === 0 || out[out.length - 1] !== s)) out.push(s);
    x = p.end;
  }
  return out;
}

/** Transitions of `tz` (offset changes) in [fromMs, toMs): the instant and the offsets on each side, in ms. */
export function transitionsBetween(tz: string, fromMs: number, toMs: number): Array<{ at: number; before: number; after: number }> {
  const out: Array<{ at: number; before: number; after: number }> = [];
  let x = fromMs;
  let prev = offsetMsAt(tz, x - SECOND_MS);
  while (x < toMs) {
    const p = pieceAt(tz, x);
    if (p.offset !== prev && p.start >= fromMs) out.push({ at: p.start, before: prev, after: p.offset });
    prev = p.offset;
    x = p.end;
  }
  return out;
}

/** For tests: how many times Intl was asked for an offset, and how many zone-years are cached. */
export function zoneTableStats(): { intlCalls: number; years: number } {
  let years = 0;
  for (const m of tables.values()) years += m.size;
  return { intlCalls, years };
}

export { isoUtc } from "./civil.ts";
