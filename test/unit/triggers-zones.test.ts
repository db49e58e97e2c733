import { describe, expect, it } from "vitest";
import { compileTrigger, preview } from "../../actors/triggers/index.ts";
import { cachedCron, cronNext, cronPrev, cronStepStats, type CachedCron } from "../../actors/triggers/cron.ts";
import { transitionsBetween } from "../../actors/triggers/zone.ts";
import { genCron, refOffset, refSlots, rng, type Gap, type GenCron, type Repeat } from "./cron-reference.ts";

/**
 * Cron slots in every zone of the tz database that has transitions, against the brute-force
 * reference of docs/TRIGGERS.md in cron-reference.ts. Fixed seeds; AX_SWEEP=1 runs every
 * transition of every zone from 1973 to 2037 instead of a sample (about 20,000 cases: an hour
 * or more of CPU), AX_SWEEP_ZONES=<regex> restricts the zones.
 */

const SWEEP = process.env.AX_SWEEP === "1";
const T = (iso: string): number => Date.parse(iso);
const iso = (ms: number | null): string | null => (ms === null ? null : new Date(ms).toISOString());
const HOUR = 3_600_000;
const FROM_1973 = Date.UTC(1973, 0, 1); // Monrovia's -0:44:30 ended 1972; the reference assumes whole-minute offsets
const TO_2038 = Date.UTC(2038, 0, 1);

/** AX_SWEEP_ZONES=<regex> narrows the zones (for a sweep of a few zones). */
const ZONE_FILTER = process.env.AX_SWEEP_ZONES ? new RegExp(process.env.AX_SWEEP_ZONES) : null;
const ZONES = Intl.supportedValuesOf("timeZone").filter((z) => ZONE_FILTER === null || ZONE_FILTER.test(z));
type Tr = { at: number; before: number; after: number };

/**
 * The sweep takes every transition from the zone table (about 20 s to build for all zones).
 * The quick run finds the years in which a zone's offset changed by sampling Intl every 30
 * days (a DST period shorter than that can be missed here, not in the sweep), and builds the
 * table only for the years it picks.
 */
function yearsWithChanges(tz: string): number[] {
  const years = new Set<number>();
  let prev = refOffset(tz, FROM_1973);
  for (let t = FROM_1973 + 30 * 86_400_000; t < TO_2038; t += 30 * 86_400_000) {
    const o = refOffset(tz, t);
    if (o !== prev) { years.add(new Date(t).getUTCFullYear()); years.add(new Date(t - 30 * 86_400_000).getUTCFullYear()); }
    prev = o;
  }
  return [...years].sort((a, b) => a - b);
}
const changedYears = new Map(ZONES.map((z) => [z, SWEEP ? [] : yearsWithChanges(z)] as const));
const allTransitions = new Map<string, Tr[]>();
function transitionsOf(tz: string): Tr[] {
  let t = allTransitions.get(tz);
  if (!t) { t = transitionsBetween(tz, FROM_1973, TO_2038); allTransitions.set(tz, t); }
  return t;
}
/** Transitions of one year in which the zone's offset changed, chosen by `r`. */
function someTransitions(tz: string, r: () => number): Tr[] {
  if (SWEEP) return transitionsOf(tz);
  const years = changedYears.get(tz)!;
  const start = Math.floor(r() * years.length);
  for (let i = 0; i < years.length; i++) {
    const y = years[(start + i) % years.length]!;
    const trs = transitionsBetween(tz, Math.max(FROM_1973, Date.UTC(y, 0, 1)), Date.UTC(y + 1, 0, 1));
    if (trs.length > 0) return trs;
  }
  return [];
}
const ZONES_WITH_TRANSITIONS = ZONES.filter((z) => (SWEEP ? transitionsOf(z).length > 0 : changedYears.get(z)!.length > 0));

const CHAIN = SWEEP ? 400 : 160;

/** Largest steps (pieces walked) any single next()/prev() took in these tests. */
const STEP_BOUND = 12;

/** `explicit`: the policy is passed; otherwise the compiled default must equal it. */
interface Case { tz: string; at: number; c: GenCron; gap: Gap; repeat: Repeat; seed: number; explicit?: boolean }

function hintAt(tz: string, at: number): { hours: number[]; minutes: number[]; month: number } {
  const hours = new Set<number>(); const minutes = new Set<number>([0]);
  for (const s of [at - 1000, at, at + HOUR]) {
    const w = new Date(s + refOffset(tz, s));
    hours.add(w.getUTCHours()); minutes.add(w.getUTCMinutes());
    hours.add((w.getUTCHours() + 23) % 24);
  }
  return { hours: [...hours], minutes: [...minutes], month: new Date(at).getUTCMonth() + 1 };
}

function compiled(cs: Case): CachedCron | null {
  try {
    return cachedCron(cs.c.text, cs.tz, cs.explicit ? { gap: cs.gap, repeat: cs.repeat } : {});
  } catch {
    return null; // a generated day-of-month that no generated month has: refused, as it should be
  }
}

/** Checks next() and prev() around one instant against the reference; returns slots compared. */
function check(cs: Case): number {
  const cc = compiled(cs);
  if (cc === null) return 0;
  const where = `${cs.c.text} in ${cs.tz} near ${iso(cs.at)} gap=${cs.gap} repeat=${cs.repeat} seed=${cs.seed}`;
  const { slots, lo, hi } = refSlots(cs.c, cs.tz, cs.at, cs.gap, cs.repeat);
  let compared = 0;
  // Forward chain from lo: every reference slot, in order, nothing else (at most CHAIN).
  let s = cronNext(cc, lo - 1);
  expect(cronStepStats().last, where).toBeLessThanOrEqual(STEP_BOUND);
  for (let i = 0; i < Math.min(slots.length, CHAIN); i++) {
    expect(iso(s), `${where}: slot ${i}`).toBe(iso(slots[i]!));
    const n = cronNext(cc, s!);
    expect(cronStepStats().last, where).toBeLessThanOrEqual(STEP_BOUND);
    expect(n === null || n > s!, `${where}: strictly after`).toBe(true);
    s = n; compared++;
  }
  if (slots.length <= CHAIN) expect(s === null || s > hi, `${where}: nothing after the last slot ${iso(slots[slots.length - 1] ?? null)} before ${iso(hi)}, got ${iso(s)}`).toBe(true);
  // Backward chain from hi.
  let p = cronPrev(cc, hi + 1);
  for (let i = slots.length - 1; i >= Math.max(0, slots.length - CHAIN / 4); i--) {
    expect(iso(p), `${where}: prev slot ${i}`).toBe(iso(slots[i]!));
    p = cronPrev(cc, p!);
    expect(cronStepStats().last, where).toBeLessThanOrEqual(STEP_BOUND);
    compared++;
  }
  // Probes at and around the transition and at random instants, with and without milliseconds.
  const r = rng(cs.seed ^ 0x5eed);
  const probes = [cs.at - 1000, cs.at - 1, cs.at, cs.at + 1, cs.at + 1000];
  for (let i = 0; i < 12; i++) probes.push(lo + Math.floor(r() * (hi - lo)));
  for (const slot of slots.slice(0, 5)) probes.push(slot, slot - 1, slot + 999);
  for (const t of probes) {
    if (t < lo || t > hi) continue;
    const want = slots.find((x) => x > t);
    const got = cronNext(cc, t);
    if (want !== undefined) expect(iso(got), `${where}: next(${iso(t)})`).toBe(iso(want));
    else expect(got === null || got > hi, `${where}: next(${iso(t)}) = ${iso(got)}`).toBe(true);
    const wantPrev = [...slots].reverse().find((x) => x < t);
    const gotPrev = cronPrev(cc, t);
    if (wantPrev !== undefined) expect(iso(gotPrev), `${where}: prev(${iso(t)})`).toBe(iso(wantPrev));
    compared += 2;
  }
  return compared;
}

const POLICIES: Array<[Gap, Repeat]> = [["shift", "first"], ["skip", "second"], ["transition", "both"], ["shift", "both"], ["skip", "first"], ["transition", "second"]];

/** Default policy as documented: shift; both when the hour field is every hour, else first. */
const defaultRepeat = (c: GenCron): Repeat => (c.hours.length === 24 ? "both" : "first");

function casesFor(tz: string, seed: number, perZone: number, all: boolean): Case[] {
  const r = rng(seed);
  const trs = someTransitions(tz, r);
  if (trs.length === 0) return [];
  const picked = all ? trs : Array.from({ length: perZone }, () => trs[Math.floor(r() * trs.length)]!);
  return picked.map((tr, i) => {
    const c = genCron(r, hintAt(tz, tr.at));
    const usePolicy = r() < 0.3;
    const [gap, repeat] = usePolicy ? POLICIES[Math.floor(r() * POLICIES.length)]! : ["shift" as Gap, defaultRepeat(c)];
    return { tz, at: tr.at, c, gap, repeat, seed: seed * 1000 + i, explicit: usePolicy };
  });
}

describe("known failures (issue 13), now right", () => {
  const next = (expr: string, tz: string, after: string): string | null => iso(compileTrigger({ kind: "cron", expr, tz }).next(T(after)));

  it("Pacific/Chatham */15: strictly after, through the 03:45 → 02:45 fall-back (+13:45 → +12:45)", () => {
    expect(next("*/15 * * * *", "Pacific/Chatham", "2026-04-04T13:00:00Z")).toBe("2026-04-04T13:15:00.000Z");
    // The repeated 02:45-03:44 fires in both copies (every hour is in the hour field).
    const slots = preview(compileTrigger({ kind: "cron", expr: "*/15 * * * *", tz: "Pacific/Chatham" }), T("2026-04-04T13:30:00Z"), 6).map(iso);
    expect(slots).toEqual(["2026-04-04T13:45:00.000Z", "2026-04-04T14:00:00.000Z", "2026-04-04T14:15:00.000Z",
      "2026-04-04T14:30:00.000Z", "2026-04-04T14:45:00.000Z", "2026-04-04T15:00:00.000Z"]);
  });

  it("Australia/Lord_Howe (30-minute shift) 0 12 * * * no longer throws", () => {
    expect(next("0 12 * * *", "Australia/Lord_Howe", "2026-04-04T01:00:00Z")).toBe("2026-04-05T01:30:00.000Z"); // 12:00 +10:30
    // Spring forward 2026-10-04 02:00 → 02:30: 02:15 is read with +10:30, i.e. 02:45 +11 (15:45Z the day before).
    expect(next("15 2 * * *", "Australia/Lord_Howe", "2026-10-03T00:00:00Z")).toBe("2026-10-03T15:45:00.000Z");
    // Fall back 2026-04-05 02:00 → 01:30: 01:45 happens twice; a fixed-hour expression fires the first.
    expect(next("45 1 * * *", "Australia/Lord_Howe", "2026-04-04T12:00:00Z")).toBe("2026-04-04T14:45:00.000Z");
    expect(next("45 1 * * *", "Australia/Lord_Howe", "2026-04-04T14:45:00Z")).toBe("2026-04-05T15:15:00.000Z");
  });

  it("America/Santiago: transitions at midnight", () => {
    // 2026-09-06 00:00 -04 → 01:00 -03: midnight does not exist; shift reads it with -04 (04:00Z = 01:00 -03).
    const midnight = preview(compileTrigger({ kind: "cron", expr: "0 0 * * *", tz: "America/Santiago" }), T("2026-09-04T12:00:00Z"), 3).map(iso);
    expect(midnight).toEqual(["2026-09-05T04:00:00.000Z", "2026-09-06T04:00:00.000Z", "2026-09-07T03:00:00.000Z"]);
    // 2026-04-05 00:00 -03 → 2026-04-04 23:00 -04: 23:30 on the 4th happens twice; first copy only.
    expect(next("30 23 * * *", "America/Santiago", "2026-04-04T12:00:00Z")).toBe("2026-04-05T02:30:00.000Z");
    expect(next("30 23 * * *", "America/Santiago", "2026-04-05T02:30:00Z")).toBe("2026-04-06T03:30:00.000Z");
    // Every hour: both copies.
    expect(preview(compileTrigger({ kind: "cron", expr: "30 * * * *", tz: "America/Santiago" }), T("2026-04-05T02:00:00Z"), 3).map(iso))
      .toEqual(["2026-04-05T02:30:00.000Z", "2026-04-05T03:30:00.000Z", "2026-04-05T04:30:00.000Z"]);
  });

  it("Pacific/Chatham +12:45: 09:00 local is 20:15Z, and the 02:45 → 03:45 gap shifts by an hour", () => {
    expect(next("0 9 * * *", "Pacific/Chatham", "2026-06-01T00:00:00Z")).toBe("2026-06-01T20:15:00.000Z");
    // 2026-09-27 02:45 +12:45 → 03:45 +13:45; 03:00 is read with +12:45 = 14:15Z (04:00 +13:45).
    expect(next("0 3 * * *", "Pacific/Chatham", "2026-09-26T00:00:00Z")).toBe("2026-09-26T14:15:00.000Z");
  });

  it("the whole-day skip of Pacific/Apia (2011-12-30 did not exist)", () => {
    // 2011-12-29 23:59:59 -10 was followed by 2011-12-31 00:00 +14. The 30th's 09:00 is read with -10.
    const slots = preview(compileTrigger({ kind: "cron", expr: "0 9 * * *", tz: "Pacific/Apia" }), T("2011-12-29T00:00:00Z"), 3).map(iso);
    expect(slots).toEqual(["2011-12-29T19:00:00.000Z", "2011-12-30T19:00:00.000Z", "2011-12-31T19:00:00.000Z"]);
  });

  it("an expression that fires once in decades still answers in a few steps", () => {
    const t = compileTrigger({ kind: "cron", expr: "0 0 * 2 5#5", tz: "Europe/Berlin" });
    expect(preview(t, T("2026-01-01T00:00:00Z"), 2).map(iso)).toEqual(["2036-02-28T23:00:00.000Z", "2064-02-28T23:00:00.000Z"]);
    expect(cronStepStats().last).toBeLessThanOrEqual(STEP_BOUND);
  });
});

describe(`every zone with transitions (${ZONES_WITH_TRANSITIONS.length} of ${ZONES.length}), random expressions against the brute-force reference`, () => {
  it(SWEEP ? "every transition 1973-2037 of every zone" : "one random transition per zone, fixed seed", () => {
    let cases = 0; let compared = 0;
    ZONES_WITH_TRANSITIONS.forEach((tz, zi) => {
      for (const cs of casesFor(tz, 1300 + zi, 1, SWEEP)) { compared += check(cs); cases++; }
    });
    expect(cases).toBeGreaterThanOrEqual(ZONES_WITH_TRANSITIONS.length);
    expect(compared).toBeGreaterThan(cases * 10);
    console.log(`zones: ${ZONES_WITH_TRANSITIONS.length}, cases: ${cases}, slots/probes compared: ${compared}, max steps per call: ${cronStepStats().max}`);
  }, SWEEP ? 3_600_000 : 120_000);

  it("zones with the odd transitions, many expressions each", () => {
    const odd = ["Pacific/Chatham", "Australia/Lord_Howe", "America/Santiago", "America/Havana", "Asia/Tehran", "Pacific/Apia",
      "America/St_Johns", "Africa/Casablanca", "Asia/Gaza", "Europe/Dublin", "Antarctica/Troll", "Pacific/Kiritimati"];
    let n = 0;
    odd.filter((z) => ZONES.includes(z)).forEach((tz, zi) => {
      if (!ZONES_WITH_TRANSITIONS.includes(tz)) return;
      for (const cs of casesFor(tz, 9000 + zi, SWEEP ? 200 : 6, false)) { check(cs); n++; }
    });
    expect(n).toBeGreaterThan(ZONE_FILTER ? 0 : 50);
  }, SWEEP ? 3_600_000 : 120_000);

  it("random instants away from transitions agree too (a transition the table missed would show here)", () => {
    const r = rng(77);
    const zones = SWEEP ? ZONES : ZONES.filter(() => r() < 0.05);
    let n = 0;
    for (const tz of zones) {
      const at = FROM_1973 + 100 * 86_400_000 + Math.floor(r() * (TO_2038 - FROM_1973 - 200 * 86_400_000));
      const c = genCron(r, hintAt(tz, at));
      n += check({ tz, at, c, gap: "shift", repeat: defaultRepeat(c), seed: n });
    }
    expect(n).toBeGreaterThan(0);
  }, SWEEP ? 3_600_000 : 120_000);
});
