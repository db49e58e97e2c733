/**
 * Proleptic Gregorian calendar arithmetic on whole days since 1970-01-01 (H. Hinnant's
 * days_from_civil / civil_from_days), for the two instant conversions every created task goes
 * through: its `at` read from ISO-8601 and its first reason written with the slot in ISO-8601.
 * Through Date they took 0.6–0.7 µs each, a tenth of a task's parse.
 */

const DAY_MS = 86_400_000;
/** 10000-01-01T00:00:00Z: from here on toISOString writes a six-digit year. */
const YEAR_10000_MS = 253_402_300_800_000;

/** Days since 1970-01-01 of year-month-day (month 1–12; the day is not checked against the month). */
export function daysFromCivil(year: number, month: number, day: number): number {
  const y = month <= 2 ? year - 1 : year;
  const era = Math.floor(y / 400);
  const yoe = y - era * 400;
  const doy = Math.floor((153 * (month > 2 ? month - 3 : month + 9) + 2) / 5) + day - 1;
  const doe = yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy;
  return era * 146_097 + doe - 719_468;
}

const pad2 = (n: number) => (n < 10 ? `0${n}` : `${n}`);
const pad3 = (n: number) => (n < 10 ? `00${n}` : n < 100 ? `0${n}` : `${n}`);

/** `new Date(ms).toISOString()`, written by hand for the years 1970–9999 (and by Date otherwise). */
export function isoUtc(ms: number): string {
  if (!(ms >= 0 && ms < YEAR_10000_MS) || !Number.isInteger(ms)) return new Date(ms).toISOString();
  const days = Math.floor(ms / DAY_MS);
  let rest = ms - days * DAY_MS;
  const z = days + 719_468;
  const era = Math.floor(z / 146_097);
  const doe = z - era * 146_097;
  const yoe = Math.floor((doe - Math.floor(doe / 1460) + Math.floor(doe / 36_524) - Math.floor(doe / 146_096)) / 365);
  const doy = doe - (365 * yoe + Math.floor(yoe / 4) - Math.floor(yoe / 100));
  const mp = Math.floor((5 * doy + 2) / 153);
  const day = doy - Math.floor((153 * mp + 2) / 5) + 1;
  const month = mp < 10 ? mp + 3 : mp - 9;
  const year = yoe + era * 400 + (month <= 2 ? 1 : 0);
  const hour = Math.floor(rest / 3_600_000); rest -= hour * 3_600_000;
  const minute = Math.floor(rest / 60_000); rest -= minute * 60_000;
  const second = Math.floor(rest / 1000);
  const milli = rest - second * 1000;
  const y = year < 1000 ? `000${year}`.slice(-4) : `${year}`;
  return `${y}-${pad2(month)}-${pad2(day)}T${pad2(hour)}:${pad2(minute)}:${pad2(second)}.${pad3(milli)}Z`;
}
