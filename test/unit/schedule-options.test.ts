import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import {
  bucketize, compileTrigger, describeOptions, exclusionOf, forecastDues, jitterFor, parseCalendarDates, parseScheduleOptions, parseTrigger, planAfter, scheduleOptionsOf,
  slotsBetween, whatIfDown, windowed, withScheduleOptions, type Calendar, type ForecastTrigger, type MisfirePolicy, type ScheduleOptions, type TriggerSpec,
} from "../../actors/triggers/index.ts";
import { countTaken, endedReason, nextPointer } from "../../actors/shard/schedule.ts";
import type { TriggerRow } from "../../actors/store/index.ts";
import { genCron, refMatches, rng } from "./cron-reference.ts";

const T0 = Date.parse("2026-12-01T00:00:00Z");
const MIN = 60_000;
const HOUR = 3_600_000;

/** The documented jitter, written again here: SHA-256 of "name\0slot", first 48 bits, mod (J + 1). */
function refJitter(name: string, slotMs: number, jitterMs: number): number {
  const h = createHash("sha256").update(`${name}\u0000${slotMs}`).digest("hex").slice(0, 12);
  return Number(BigInt(`0x${h}`) % BigInt(jitterMs + 1));
}

/** Every slot of a UTC cron in [from, to], by checking each candidate second (slow, obviously right). */
function refCronSlots(c: ReturnType<typeof genCron>, from: number, to: number): number[] {
  const out: number[] = [];
  for (let m = Math.floor(from / MIN) * MIN; m <= to; m += MIN) {
    for (const s of c.seconds ?? [0]) {
      const t = m + s * 1000;
      if (t >= from && t <= to && refMatches(c, t)) out.push(t);
    }
  }
  return out.sort((a, b) => a - b);
}

const row = (id: number, spec: TriggerSpec & { sched?: ScheduleOptions }): TriggerRow => ({ id, kind: spec.kind, spec, enabled: true });

describe("jitter", () => {
  it("is deterministic per task and slot, within 0..J, equal to the documented formula (2,000 random cases, seed 13)", () => {
    const r = rng(13);
    for (let i = 0; i < 2000; i++) {
      const name = `task-${Math.floor(r() * 1e6)}`;
      const slot = T0 + Math.floor(r() * 400 * 86_400) * 1000;
      const J = 1 + Math.floor(r() * (r() < 0.5 ? 1000 : 3_600_000));
      const j = jitterFor(name, slot, J);
      expect(j).toBe(jitterFor(name, slot, J));
      expect(j).toBeGreaterThanOrEqual(0);
      expect(j).toBeLessThanOrEqual(J);
      expect(j).toBe(refJitter(name, slot, J));
    }
  });

  it("spreads: over 4,000 slots of one task the delays cover the range evenly (each quarter 20-30 %)", () => {
    const J = 60_000;
    const q = [0, 0, 0, 0];
    for (let i = 0; i < 4000; i++) q[Math.min(3, Math.floor(jitterFor("spread", T0 + i * MIN, J) / (J / 4)))]!++;
    for (const n of q) { expect(n).toBeGreaterThan(800); expect(n).toBeLessThan(1200); }
  });

  it("moves the due time, keeps the slot, and says so in the reason", () => {
    const spec = withScheduleOptions(parseTrigger({ cron: "0 * * * *" }, T0), { jitterMs: 10 * MIN });
    const p = nextPointer({ name: "hourly", triggers: [row(1, spec)], triggerSlots: {}, misfire: "once", createdMs: T0 }, T0)!;
    expect(p.slotMs).toBe(T0 + HOUR);
    expect(p.dueMs).toBe(T0 + HOUR + refJitter("hourly", T0 + HOUR, 10 * MIN));
    expect(p.reason).toMatch(/after the slot 2026-12-01T01:00:00.000Z \(--jitter 10m/);
  });

  it("is refused when not shorter than the trigger's shortest interval", () => {
    const every = parseTrigger({ every: "1m" }, T0);
    expect(() => parseScheduleOptions({ jitter: "1m" }, every, compileTrigger(every), T0)).toThrow(/shortest interval/);
    const cron = parseTrigger({ cron: "0,10 * * * *" }, T0);
    expect(() => parseScheduleOptions({ jitter: "10m" }, cron, compileTrigger(cron), T0)).toThrow(/shortest interval \(10m\)/);
    expect(parseScheduleOptions({ jitter: "9m" }, cron, compileTrigger(cron), T0)).toEqual({ jitterMs: 9 * MIN });
  });
});

describe("window and max runs", () => {
  it("windowed next() answers exactly the trigger's slots inside [start, end] (150 random crons and windows, seed 7)", () => {
    const r = rng(7);
    for (let i = 0; i < 150; i++) {
      const c = genCron(r, { hours: [Math.floor(r() * 24)], minutes: [Math.floor(r() * 60)], month: 12 });
      const t = compileTrigger({ kind: "cron", expr: c.text, tz: "UTC" });
      const start = T0 + Math.floor(r() * 10 * 86_400_000);
      const end = start + Math.floor(r() * 2 * 86_400_000);
      const w = windowed(t, { startMs: start, endMs: end });
      const got: number[] = [];
      for (let s = w.next(start - 5 * 86_400_000); s !== null && got.length < 5000; s = w.next(s)) got.push(s);
      const want = refCronSlots(c, start, end).slice(0, 5000);
      expect(got, `${c.text} [${new Date(start).toISOString()}, ${new Date(end).toISOString()}]`).toEqual(want);
      for (const s of got) { expect(s).toBeGreaterThanOrEqual(start); expect(s).toBeLessThanOrEqual(end); }
    }
  });

  it("a simulated shard fires at most N slots, all inside the window, then says the task completed (200 cases, seed 11)", () => {
    const r = rng(11);
    for (let i = 0; i < 200; i++) {
      const everyMs = (1 + Math.floor(r() * 60)) * 1000;
      const start = T0 + Math.floor(r() * HOUR);
      const end = start + Math.floor(r() * HOUR);
      const maxRuns = r() < 0.5 ? 1 + Math.floor(r() * 50) : undefined;
      const spec = withScheduleOptions({ kind: "fixed_rate", everyMs, anchorMs: T0 }, { startMs: start, endMs: end, ...(maxRuns ? { maxRuns } : {}) });
      const task = { name: `t${i}`, triggers: [row(5, spec)], triggerSlots: {} as Record<string, number>, misfire: "once" as MisfirePolicy, createdMs: T0 };
      const fired: number[] = [];
      let now = T0;
      for (let p = nextPointer(task, now); p; p = nextPointer(task, now)) {
        now = Math.max(now, p.dueMs);
        fired.push(p.slotMs!);
        task.triggerSlots = { ...countTaken(task, p.triggerId), [String(p.triggerId)]: p.slotMs! };
        expect(fired.length).toBeLessThan(5000);
      }
      const want: number[] = [];
      for (let s = T0 + everyMs; s <= end; s += everyMs) if (s >= start) want.push(s);
      expect(fired).toEqual(maxRuns ? want.slice(0, maxRuns) : want);
      expect(endedReason(task, now)).toMatch(/^completed: /);
    }
  });

  it("a window whose end passed during an outage: the misfire catch-up is for a slot inside the window, due now", () => {
    const spec = withScheduleOptions({ kind: "fixed_rate", everyMs: MIN, anchorMs: T0 }, { endMs: T0 + 30 * MIN });
    const p = nextPointer({ name: "w", triggers: [row(1, spec)], triggerSlots: { "1": T0 + 5 * MIN }, misfire: "once", createdMs: T0 }, T0 + 2 * HOUR)!;
    expect(p.source).toBe("misfire");
    expect(p.slotMs).toBe(T0 + 30 * MIN);
    expect(p.dueMs).toBe(T0 + 2 * HOUR);
  });

  it("options are validated with the field named", () => {
    const s = parseTrigger({ every: "1m" }, T0);
    const c = compileTrigger(s);
    expect(() => parseScheduleOptions({ start: "2026-12-02T00:00:00" }, s, c, T0)).toThrow(/^start: needs a time-zone offset/);
    expect(() => parseScheduleOptions({ start: "2026-12-03T00:00:00Z", end: "2026-12-02T00:00:00Z" }, s, c, T0)).toThrow(/^end: must be after start/);
    expect(() => parseScheduleOptions({ end: "2026-11-02T00:00:00Z" }, s, c, T0)).toThrow(/^end: is not in the future/);
    expect(() => parseScheduleOptions({ maxRuns: 0 }, s, c, T0)).toThrow(/^maxRuns: must be a whole number/);
    expect(() => parseScheduleOptions({ excludeCalendar: "a b" }, s, c, T0)).toThrow(/^excludeCalendar: must be a calendar name/);
    expect(scheduleOptionsOf(withScheduleOptions(s, parseScheduleOptions({ maxRuns: "3", excludeCalendar: "hol" }, s, c, T0)))).toEqual({ maxRuns: 3, calendar: "hol" });
    expect(parseScheduleOptions({}, s, c, T0)).toBeNull();
    expect(describeOptions({ jitterMs: 300_000, endMs: T0, maxRuns: 20, calendar: "hol" })).toBe("jitter 5m, until 2026-12-01T00:00:00.000Z, at most 20 run(s), excluding the dates of calendar hol");
  });
});

describe("calendars", () => {
  const cal = (dates: string[], tz: string | null = null): Calendar => ({ name: "hol", tz, dates: parseCalendarDates("dates", dates.join(",")) });

  it("reads the slot's date in the task's zone, or the calendar's own", () => {
    const slot = Date.parse("2026-12-24T23:30:00Z"); // 25 Dec 00:30 in Paris, 24 Dec in New York
    expect(exclusionOf(slot, "Europe/Paris", cal(["2026-12-25"]))).toBe("excluded: 2026-12-25 (Europe/Paris) is in calendar hol");
    expect(exclusionOf(slot, "UTC", cal(["2026-12-25"]))).toBeNull();
    expect(exclusionOf(slot, "America/New_York", cal(["2026-12-24"]))).toMatch(/2026-12-24 \(America\/New_York\)/);
    expect(exclusionOf(slot, "UTC", cal(["2026-12-25"], "Asia/Tokyo"))).toMatch(/2026-12-25 \(Asia\/Tokyo\)/);
    // Pacific/Chatham (+13:45 in December): 10:15Z is already the next day there.
    expect(exclusionOf(Date.parse("2026-12-31T10:15:00Z"), "Pacific/Chatham", cal(["2027-01-01"]))).not.toBeNull();
    expect(exclusionOf(Date.parse("2026-12-31T10:14:59Z"), "Pacific/Chatham", cal(["2027-01-01"]))).toBeNull();
  });

  it("matches a linear scan for 1,000 random dates and slots (seed 3)", () => {
    const r = rng(3);
    const dates = new Set<string>();
    for (let i = 0; i < 60; i++) dates.add(new Date(T0 + Math.floor(r() * 365) * 86_400_000).toISOString().slice(0, 10));
    const c = cal([...dates]);
    for (let i = 0; i < 1000; i++) {
      const slot = T0 + Math.floor(r() * 365 * 86_400) * 1000;
      expect(exclusionOf(slot, "UTC", c) !== null).toBe(dates.has(new Date(slot).toISOString().slice(0, 10)));
    }
  });

  it("dates are validated", () => {
    expect(parseCalendarDates("dates", "2027-01-01, 2026-12-25,2026-12-25")).toEqual(["2026-12-25", "2027-01-01"]);
    expect(() => parseCalendarDates("dates", "2026-02-30")).toThrow(/^dates: no such date/);
    expect(() => parseCalendarDates("dates", "25/12/2026")).toThrow(/^dates: not a date in the form YYYY-MM-DD/);
  });
});

describe("forecast and what-if", () => {
  const entry = (name: string, spec: TriggerSpec & { sched?: ScheduleOptions }, extra: Partial<ForecastTrigger> = {}): ForecastTrigger => ({
    task: name, triggerId: 1, spec, compiled: compileTrigger(spec), options: scheduleOptionsOf(spec), calendar: null, taken: 0, lastSlotMs: null, createdMs: T0 - HOUR, ...extra,
  });

  it("per-minute counts and peak equal a slow reference over random crons, rates, jitter and calendars (60 tasks, seed 21)", () => {
    const r = rng(21);
    const from = T0 + 3 * HOUR, to = from + 6 * HOUR;
    const holiday: Calendar = { name: "h", tz: null, dates: [new Date(from + 4 * HOUR).toISOString().slice(0, 10)] };
    const entries: ForecastTrigger[] = [];
    const ref = new Map<number, number>();
    const add = (due: number) => { if (due >= from && due < to) { const b = Math.floor(due / MIN) * MIN; ref.set(b, (ref.get(b) ?? 0) + 1); } };
    for (let i = 0; i < 60; i++) {
      const name = `f${i}`;
      const jitterMs = r() < 0.4 ? 1 + Math.floor(r() * 50_000) : 0;
      const cal = r() < 0.2 ? holiday : null;
      let slots: number[];
      let spec: TriggerSpec;
      if (r() < 0.5) {
        const c = genCron(r, { hours: [Math.floor(r() * 24)], minutes: [Math.floor(r() * 60)], month: 12 });
        spec = { kind: "cron", expr: c.text, tz: "UTC" };
        slots = refCronSlots(c, from - jitterMs - 1000, to);
      } else {
        const everyMs = (5 + Math.floor(r() * 600)) * 1000;
        spec = { kind: "fixed_rate", everyMs, anchorMs: T0 };
        slots = [];
        for (let s = T0 + everyMs; s < to; s += everyMs) slots.push(s);
      }
      const full = withScheduleOptions(spec, jitterMs ? { jitterMs } : null);
      entries.push(entry(name, full, { calendar: cal }));
      for (const s of slots) {
        if (cal && cal.dates.includes(new Date(s).toISOString().slice(0, 10))) continue;
        add(s + (jitterMs ? refJitter(name, s, jitterMs) : 0));
      }
    }
    const dues = entries.flatMap((e) => forecastDues(e, from, to, { left: 10_000_000 }));
    const b = bucketize(dues, "minute");
    expect(new Map(b.buckets.map((x) => [x.atMs, x.fires]))).toEqual(ref);
    const refPeak = Math.max(...ref.values());
    expect(b.peak!.fires).toBe(refPeak);
    expect(b.total).toBe([...ref.values()].reduce((a, n) => a + n, 0));
  });

  it("max-runs: only the runs left are forecast, counted from the last fired slot", () => {
    const spec = withScheduleOptions({ kind: "fixed_rate", everyMs: MIN, anchorMs: T0 }, { maxRuns: 10 });
    const dues = forecastDues(entry("m", spec, { taken: 7, lastSlotMs: T0 + 7 * MIN }), T0 + 9 * MIN, T0 + HOUR, { left: 1e6 });
    expect(dues).toEqual([T0 + 9 * MIN, T0 + 10 * MIN]); // slot 8 uses a run before the window
  });

  it("what-if equals planAfter from the last slot before the outage, per misfire policy (300 cases, seed 5)", () => {
    const r = rng(5);
    for (let i = 0; i < 300; i++) {
      const everyMs = (10 + Math.floor(r() * 3600)) * 1000;
      const spec: TriggerSpec = { kind: "fixed_rate", everyMs, anchorMs: T0 };
      const downFrom = T0 + Math.floor(r() * 6 * HOUR);
      const downTo = downFrom + Math.floor(r() * 12 * HOUR);
      const misfire = (["once", "skip", "all"] as const)[Math.floor(r() * 3)]!;
      const w = whatIfDown(entry("w", spec, { createdMs: T0 }), misfire, downFrom, downTo);
      // Reference: slots in (last slot <= downFrom, downTo - 1 s) were missed.
      let missed = 0; const missedSlots: number[] = [];
      for (let s = T0 + everyMs; s < downTo - 1000; s += everyMs) if (s > downFrom) { missed++; missedSlots.push(s); }
      expect(w.missed, `every ${everyMs} down ${downFrom}..${downTo}`).toBe(missed);
      const want = missed === 0 ? [] : misfire === "skip" ? [] : misfire === "once" ? [missedSlots[missed - 1]!] : missedSlots.slice(-100);
      expect(w.catchUp).toEqual(want);
      // And it is planAfter's answer, the function the shards use.
      const last = Math.floor((downFrom - T0) / everyMs) >= 1 ? T0 + Math.floor((downFrom - T0) / everyMs) * everyMs : null;
      expect(w.catchUp).toEqual(planAfter(compileTrigger(spec), last, downTo, misfire, { createdAtMs: T0 }).fire.map((f) => f.slotMs));
    }
  });

  it("slotsBetween refuses a window with too many slots", () => {
    expect(() => slotsBetween(compileTrigger({ kind: "fixed_rate", everyMs: 1000, anchorMs: T0 }), T0, T0 + HOUR, 100)).toThrow(/more than 100 slots/);
  });
});
