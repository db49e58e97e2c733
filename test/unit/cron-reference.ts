/**
 * Test-only reference for cron slots: random expressions generated together with the value
 * sets they mean, and a slow brute-force walk over UTC minutes that reads every offset from
 * Intl directly and applies the DST policy of docs/TRIGGERS.md literally. It shares no code
 * with actors/triggers (no parser, no matcher, no offset table).
 */

export type Gap = "shift" | "skip" | "transition";
export type Repeat = "first" | "second" | "both";

export interface GenCron {
  text: string;
  /** null for a 5-field expression (second 0). */
  seconds: number[] | null;
  minutes: number[];
  hours: number[];
  months: number[];
  dom: { values: number[]; last: boolean } | null;
  dow: { values: number[]; last: number[]; nth: { day: number; n: number } | null } | null;
}

/** mulberry32: small, fast, deterministic. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

interface FieldDef { min: number; max: number; starMax: number; names?: string[]; dow?: boolean }

/** One list item and the values it means (day-of-week values folded 7 → 0). */
function genItem(r: () => number, f: FieldDef, prefer: number[]): { text: string; values: number[] } {
  const pick = (lo: number, hi: number): number => lo + Math.floor(r() * (hi - lo + 1));
  const name = (v: number): string => (f.names && r() < 0.5 ? f.names[v - (f.dow ? 0 : 1)] ?? String(v) : String(v));
  const fold = (v: number): number => (f.dow ? v % 7 : v);
  const kind = r();
  if (kind < 0.3) {
    const v = prefer.length > 0 && r() < 0.6 ? prefer[Math.floor(r() * prefer.length)]! : pick(f.min, f.max);
    return { text: name(v), values: [fold(v)] };
  }
  if (kind < 0.5) {
    const a = pick(f.min, f.max - 1); const b = pick(a + 1, f.max);
    const vs: number[] = []; for (let v = a; v <= b; v++) vs.push(fold(v));
    return { text: `${name(a)}-${name(b)}`, values: vs };
  }
  if (kind < 0.7) {
    const span = f.starMax - f.min;
    const s = pick(1, Math.max(1, Math.min(span, 20)));
    const vs: number[] = []; for (let v = f.min; v <= f.starMax; v += s) vs.push(fold(v));
    return { text: `*/${s}`, values: vs };
  }
  if (kind < 0.85) {
    const a = pick(f.min, f.max - 2); const b = pick(a + 2, f.max);
    const s = pick(1, b - a);
    const vs: number[] = []; for (let v = a; v <= b; v += s) vs.push(fold(v));
    return { text: `${a}-${b}/${s}`, values: vs };
  }
  const a = pick(f.min, f.max - 1);
  const s = pick(1, f.max - a);
  const vs: number[] = []; for (let v = a; v <= f.max; v += s) vs.push(fold(v));
  return { text: `${a}/${s}`, values: vs };
}

function genField(r: () => number, f: FieldDef, starP: number, prefer: number[] = []): { text: string; values: number[] } {
  if (r() < starP) {
    const vs: number[] = []; for (let v = f.min; v <= f.starMax; v++) vs.push(v);
    return { text: "*", values: vs };
  }
  const n = r() < 0.6 ? 1 : r() < 0.7 ? 2 : 3;
  const texts: string[] = []; const set = new Set<number>();
  for (let i = 0; i < n; i++) { const it = genItem(r, f, prefer); texts.push(it.text); it.values.forEach((v) => set.add(v)); }
  return { text: texts.join(","), values: [...set].sort((a, b) => a - b) };
}

/**
 * A random expression. `hint` biases hours and minutes toward a transition's wall times, so
 * that gaps and repeats are actually exercised.
 */
export function genCron(r: () => number, hint: { hours: number[]; minutes: number[]; month: number }): GenCron {
  const six = r() < 0.25;
  let seconds: number[] | null = null; const parts: string[] = [];
  if (six) {
    const opts = [["0", [0]], ["30", [30]], ["*/20", [0, 20, 40]], ["15,45", [15, 45]], ["0-10/5", [0, 5, 10]], ["7,0,7", [0, 7]]] as const;
    const o = opts[Math.floor(r() * opts.length)]!;
    parts.push(o[0]); seconds = [...o[1]];
  }
  const minute = genField(r, { min: 0, max: 59, starMax: 59 }, six ? 0.15 : 0.1, hint.minutes);
  const hour = genField(r, { min: 0, max: 23, starMax: 23 }, 0.35, hint.hours);
  parts.push(minute.text, hour.text);
  let dom: GenCron["dom"] = null; let dow: GenCron["dow"] = null;
  const day = r();
  if (day < 0.55) parts.push("*");
  else if (day < 0.75) {
    if (r() < 0.25) { parts.push(r() < 0.5 ? "L" : "1,L"); dom = { values: parts[parts.length - 1] === "L" ? [] : [1], last: true }; }
    else {
      const f = genField(r, { min: 1, max: 31, starMax: 31 }, 0);
      parts.push(f.text); dom = { values: f.values, last: false };
    }
  } else parts.push("*");
  const month = r() < 0.8 ? { text: "*", values: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] }
    : genField(r, { min: 1, max: 12, starMax: 12, names: MONTHS }, 0, [hint.month]);
  parts.push(month.text);
  if (dom === null && day >= 0.75) {
    const k = r();
    if (k < 0.2) { const d = Math.floor(r() * 8); parts.push(`${d}L`); dow = { values: [], last: [d % 7], nth: null }; }
    else if (k < 0.4) {
      const d = Math.floor(r() * 7); const n = 1 + Math.floor(r() * 5);
      parts.push(`${r() < 0.5 ? DAYS[d] : d}#${n}`); dow = { values: [], last: [], nth: { day: d, n } };
    } else {
      const f = genField(r, { min: 0, max: 7, starMax: 6, names: DAYS, dow: true }, 0);
      parts.push(f.text); dow = { values: f.values, last: [], nth: null };
    }
  } else parts.push("*");
  return { text: parts.join(" "), seconds, minutes: minute.values, hours: hour.values, months: month.values, dom, dow };
}

/** Whether a naive wall time (the UTC fields of `wall`) matches. */
export function refMatches(c: GenCron, wall: number): boolean {
  const d = new Date(wall);
  const sec = d.getUTCSeconds();
  if (!(c.seconds ?? [0]).includes(sec) || d.getUTCMilliseconds() !== 0) return false;
  if (!c.minutes.includes(d.getUTCMinutes()) || !c.hours.includes(d.getUTCHours())) return false;
  const y = d.getUTCFullYear(); const mo = d.getUTCMonth(); const day = d.getUTCDate(); const wd = d.getUTCDay();
  if (!c.months.includes(mo + 1)) return false;
  const dim = new Date(Date.UTC(y, mo + 1, 0)).getUTCDate();
  if (c.dom && !(c.dom.values.includes(day) || (c.dom.last && day === dim))) return false;
  if (c.dow) {
    const ok = c.dow.values.includes(wd) || (c.dow.last.includes(wd) && day + 7 > dim)
      || (c.dow.nth !== null && c.dow.nth.day === wd && Math.floor((day - 1) / 7) + 1 === c.dow.nth.n);
    if (!ok) return false;
  }
  return true;
}

const fmts = new Map<string, Intl.DateTimeFormat>();
let intlCalls = 0;
/** Offset in ms straight from Intl (the reference does not use the transition table). */
export function refOffset(tz: string, ms: number): number {
  let f = fmts.get(tz);
  if (!f) {
    f = new Intl.DateTimeFormat("en-US", { timeZone: tz, hourCycle: "h23", year: "numeric", month: "numeric", day: "numeric", hour: "numeric", minute: "numeric", second: "numeric" });
    fmts.set(tz, f);
  }
  intlCalls++;
  // "12/31/2025, 19:00:00" (format() is three times cheaper than formatToParts()).
  const m = /^(\d+)\/(\d+)\/(\d+), (\d+):(\d+):(\d+)$/.exec(f.format(ms));
  if (!m) throw new Error(`unexpected Intl output ${f.format(ms)}`);
  const n = m.slice(1).map(Number) as [number, number, number, number, number, number];
  return Date.UTC(n[2], n[0] - 1, n[1], n[3], n[4], n[5]) - (ms - (((ms % 1000) + 1000) % 1000));
}
export const refIntlCalls = (): number => intlCalls;

const MIN = 60_000;
const HOUR = 3_600_000;

/**
 * Every slot of `c` in the zone within about 12 h of `at` (the slots in [lo, hi]), by brute
 * force: walk every UTC minute around `at`, read its wall time, and apply the policy:
 * - a matching wall time that occurs once fires there; one that occurs several times fires at
 *   the first, the last or every occurrence (`repeat`);
 * - a matching wall time the clock jumped over fires at that wall time read with the offset
 *   from before the jump (shift), at the first instant after the jump (transition), or not (skip).
 * Offsets are read from Intl every hour, and every minute of an hour whose two ends differ
 * (transitions since 1973 fall on whole minutes). The walk reaches past [lo, hi] by the
 * largest offset change nearby plus an hour: copies of a wall time, and a jump and the slots
 * it shifts, are never further apart than that.
 */
export function refSlots(c: GenCron, tz: string, at: number, gap: Gap, repeat: Repeat): { slots: number[]; lo: number; hi: number } {
  const center = Math.floor(at / HOUR) * HOUR;
  const far = [-40, -20, 0, 20, 40].map((h) => refOffset(tz, center + h * HOUR));
  let half = 14 * HOUR;
  let from = center - half; let to = center + half;
  const hourly = (): number[] => { const o: number[] = []; for (let h = from; h <= to; h += HOUR) o.push(refOffset(tz, h)); return o; };
  let hours = hourly();
  const spread = (): number => Math.max(...far, ...hours) - Math.min(...far, ...hours);
  let margin = Math.ceil((spread() + HOUR) / HOUR) * HOUR;
  if (margin + 12 * HOUR > half) {
    half = margin + 12 * HOUR; from = center - half; to = center + half;
    hours = hourly();
    margin = Math.ceil((spread() + HOUR) / HOUR) * HOUR;
  }
  const offs: number[] = [];
  for (let i = 0; i + 1 < hours.length; i++) {
    const h = from + i * HOUR;
    if (hours[i] === hours[i + 1]) for (let m = 0; m < 60; m++) offs.push(hours[i]!);
    else for (let m = 0; m < 60; m++) offs.push(m === 0 ? hours[i]! : refOffset(tz, h + m * MIN));
  }
  const seconds = c.seconds ?? [0];
  const byWall = new Map<number, number[]>();
  offs.forEach((o, i) => {
    const s = from + i * MIN; const w = s + o;
    const list = byWall.get(w); if (list) list.push(s); else byWall.set(w, [s]);
  });
  const out: number[] = [];
  for (const [w, instants] of byWall) {
    for (const k of seconds) {
      if (!refMatches(c, w + k * 1000)) continue;
      const chosen = instants.length === 1 || repeat === "both" ? instants : repeat === "first" ? [instants[0]!] : [instants[instants.length - 1]!];
      for (const s of chosen) out.push(s + k * 1000);
    }
  }
  for (let i = 0; i + 1 < offs.length; i++) {
    const s = from + i * MIN; const w0 = s + offs[i]!; const w1 = s + MIN + offs[i + 1]!;
    if (w1 - w0 <= MIN) continue;
    for (let w = w0 + MIN; w < w1; w += MIN) {
      if (byWall.has(w)) continue;
      for (const k of seconds) {
        if (!refMatches(c, w + k * 1000)) continue;
        if (gap === "shift") out.push(w + k * 1000 - offs[i]!);
        else if (gap === "transition") out.push(s + MIN);
      }
    }
  }
  const lo = from + margin; const hi = to - margin - MIN;
  const slots = [...new Set(out)].filter((s) => s >= lo && s <= hi).sort((a, b) => a - b);
  return { slots, lo, hi };
}
