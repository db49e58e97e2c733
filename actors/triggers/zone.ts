import { InvalidInputError } from "../../common/index.ts";

/**
 * Time-zone helpers on top of Intl, so the trigger module needs no date library of its own
 * (cron-parser brings luxon, but that is its private dependency, not ours).
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

/** The UTC offset of `tz` at `ms`, in minutes (New York in winter: -300). */
export function offsetMinutes(ms: number, tz: string): number {
  return wallParts(ms, tz).offsetMin;
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

/**
 * True when the wall-clock time at `ms` already happened once earlier, with a larger offset:
 * the second copy of the hour repeated when DST ends. Used only to make explanations honest.
 */
export function isSecondOccurrence(ms: number, tz: string): boolean {
  const now = offsetMinutes(ms, tz);
  // Look a few hours back for a larger offset; every real fall-back is at most 2h.
  const before = offsetMinutes(ms - 3 * 3_600_000, tz);
  if (before <= now) return false;
  const earlier = ms - (before - now) * 60_000;
  return offsetMinutes(earlier, tz) === before;
}

export function isoUtc(ms: number): string {
  return new Date(ms).toISOString();
}
