import { describe, expect, it } from "vitest";
import { SimulatedClock, InvalidInputError, type Clock, type TimerHandle } from "../../common/index.ts";
import { HashedWheel, type WheelRef } from "../../actors/wheel/index.ts";

interface Fire<T> { item: T; dueMs: number; firedWall: number; firedMono: number; tick: number; lateMs: number }

function setup<T = number>(opts: { tickMs?: number; size?: number; clock?: Clock; sim?: SimulatedClock } = {}) {
  const sim = opts.sim ?? new SimulatedClock();
  const clock = opts.clock ?? sim;
  const fires: Fire<T>[] = [];
  const calls: Array<{ count: number; tick: number; lateMs: number }> = [];
  const wheel = new HashedWheel<T>({
    tickMs: opts.tickMs ?? 10,
    size: opts.size ?? 16,
    clock,
    onExpire: (items, info) => {
      calls.push({ count: items.length, ...info });
      for (const e of items) fires.push({ ...e, firedWall: clock.now(), firedMono: clock.monotonic(), ...info });
    },
  });
  return { sim, clock, wheel, fires, calls };
}

/** Fails on any item fired more than once; returns how many times each fired. */
function countsOf<T>(fires: Fire<T>[]): Map<T, number> {
  const m = new Map<T, number>();
  for (const f of fires) m.set(f.item, (m.get(f.item) ?? 0) + 1);
  for (const [item, n] of m) expect(n, `item ${String(item)} fired ${n} times`).toBe(1);
  return m;
}

function expectNeverEarly<T>(fires: Fire<T>[]): void {
  for (const f of fires) expect(f.firedWall, `item ${String(f.item)} fired before due`).toBeGreaterThanOrEqual(f.dueMs);
}

/** A clock whose timers fire at a distorted delay, to exercise early and late callbacks. */
class DistortedTimers implements Clock {
  calls = 0;
  constructor(private readonly inner: SimulatedClock, private readonly distort: (ms: number, call: number) => number) {}
  now(): number { return this.inner.now(); }
  monotonic(): number { return this.inner.monotonic(); }
  setTimeout(fn: () => void, ms: number): TimerHandle { return this.inner.setTimeout(fn, this.distort(ms, this.calls++)); }
  clearTimeout(h: TimerHandle): void { this.inner.clearTimeout(h); }
}

describe("HashedWheel: firing", () => {
  it("fires at or after due and within one tick", () => {
    const { sim, wheel, fires } = setup({ tickMs: 10, size: 16 });
    const t0 = sim.now();
    const offsets = [1, 9, 10, 11, 25, 99, 100, 101, 155];
    offsets.forEach((o, i) => wheel.add(t0 + o, i));
    expect(wheel.size).toBe(offsets.length);
    wheel.start();
    sim.advance(200);
    countsOf(fires);
    expect(fires).toHaveLength(offsets.length);
    for (const f of fires) {
      expect(f.firedWall).toBeGreaterThanOrEqual(f.dueMs);
      expect(f.firedWall - f.dueMs).toBeLessThan(10);
    }
    expect(wheel.size).toBe(0);
    wheel.stop();
  });

  it("never fires before due across many random due times", () => {
    const { sim, wheel, fires } = setup({ tickMs: 7, size: 13 });
    const t0 = sim.now();
    let seed = 12345;
    const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
    for (let i = 0; i < 2000; i++) wheel.add(t0 + rnd() * 5000, i);
    wheel.start();
    sim.advance(5100);
    expect(fires).toHaveLength(2000);
    countsOf(fires);
    expectNeverEarly(fires);
    for (const f of fires) expect(f.firedWall - f.dueMs).toBeLessThan(7);
    wheel.stop();
  });

  it("entries already due at add() fire on the next tick", () => {
    const { sim, wheel, fires, calls } = setup<string>({ tickMs: 10 });
    sim.advance(3);
    wheel.start();
    wheel.add(sim.now() - 60_000, "past");
    wheel.add(sim.now(), "now");
    sim.advance(6);
    expect(fires).toHaveLength(0);
    sim.advance(1); // monotonic 10: the next tick
    expect(fires.map((f) => f.item).sort()).toEqual(["now", "past"]);
    expect(calls).toHaveLength(1);
    wheel.stop();
  });

  it("uses rounds for due times several revolutions away", () => {
    // One revolution is 8 * 10 = 80 ms; 1005 ms is 12+ revolutions, so the slot comes up 12
    // times before the entry may fire.
    const { sim, wheel, fires } = setup<string>({ tickMs: 10, size: 8 });
    const t0 = sim.now();
    wheel.add(t0 + 1005, "far");
    wheel.add(t0 + 5, "near-same-slot"); // tick 1, slot 1 -- and 1005 ms is tick 101, slot 5
    wheel.add(t0 + 85, "one-rev");
    wheel.start();
    sim.advance(1000);
    expect(fires.map((f) => f.item)).toEqual(["near-same-slot", "one-rev"]);
    sim.advance(20);
    expect(fires.map((f) => f.item)).toEqual(["near-same-slot", "one-rev", "far"]);
    const far = fires[2]!;
    expect(far.firedWall).toBe(t0 + 1010);
    expect(far.tick).toBe(101);
    wheel.stop();
  });

  it("delivers many entries of the same slot in one call", () => {
    const { sim, wheel, fires, calls } = setup({ tickMs: 10, size: 4 });
    const t0 = sim.now();
    for (let i = 0; i < 10_000; i++) wheel.add(t0 + 51 + (i % 10) / 10, i); // all tick 6 (due 51..51.9)
    const later: WheelRef[] = [];
    for (let i = 0; i < 100; i++) later.push(wheel.add(t0 + 51 + 4 * 10 * (1 + (i % 3)), 10_000 + i)); // same slot, later rounds
    wheel.start();
    sim.advance(60);
    expect(calls).toHaveLength(1);
    expect(calls[0]).toMatchObject({ count: 10_000, tick: 6, lateMs: 0 });
    expect(wheel.size).toBe(100);
    // Cancelling out of a slot whose entries were just reshuffled by removals must still hit
    // exactly the intended entries.
    for (let i = 0; i < 100; i += 3) expect(wheel.cancel(later[i]!)).toBe(true);
    sim.advance(200);
    expect(fires).toHaveLength(10_000 + 66);
    const m = countsOf(fires);
    for (let i = 0; i < 100; i++) expect(m.has(10_000 + i)).toBe(i % 3 !== 0);
    expectNeverEarly(fires);
    wheel.stop();
  });
});

describe("HashedWheel: cancel", () => {
  it("cancels before fire; returns false after fire or a second time", () => {
    const { sim, wheel, fires } = setup<string>({ tickMs: 10, size: 16 });
    const t0 = sim.now();
    const a = wheel.add(t0 + 30, "a");
    const b = wheel.add(t0 + 30, "b");
    const c = wheel.add(t0 + 500, "c");
    expect(wheel.cancel(a)).toBe(true);
    expect(wheel.cancel(a)).toBe(false);
    expect(wheel.size).toBe(2);
    wheel.start();
    sim.advance(40);
    expect(fires.map((f) => f.item)).toEqual(["b"]);
    expect(wheel.cancel(b)).toBe(false);
    expect(wheel.cancel(c)).toBe(true);
    expect(wheel.size).toBe(0);
    sim.advance(1000);
    expect(fires.map((f) => f.item)).toEqual(["b"]);
    wheel.stop();
  });

  it("cancels the first, middle and last entries of one slot", () => {
    const { sim, wheel, fires } = setup({ tickMs: 10, size: 4 });
    const t0 = sim.now();
    const refs: WheelRef[] = [];
    for (let i = 0; i < 5; i++) refs.push(wheel.add(t0 + 20, i));
    expect(wheel.cancel(refs[0]!)).toBe(true);
    expect(wheel.cancel(refs[2]!)).toBe(true);
    expect(wheel.cancel(refs[4]!)).toBe(true);
    wheel.start();
    sim.advance(30);
    expect(fires.map((f) => f.item).sort()).toEqual([1, 3]);
    wheel.stop();
  });

  it("a stale ref does not cancel the entry that reuses its storage", () => {
    const { sim, wheel, fires } = setup<string>({ tickMs: 10 });
    const t0 = sim.now();
    const old = wheel.add(t0 + 10, "old");
    expect(wheel.cancel(old)).toBe(true);
    wheel.add(t0 + 10, "new"); // reuses the freed index
    expect(wheel.cancel(old)).toBe(false);
    expect(wheel.cancel({} as WheelRef)).toBe(false);
    expect(wheel.cancel(123456789 as unknown as WheelRef)).toBe(false);
    wheel.start();
    sim.advance(20);
    expect(fires.map((f) => f.item)).toEqual(["new"]);
    wheel.stop();
  });

  it("onExpire may add and cancel", () => {
    const sim = new SimulatedClock();
    const seen: string[] = [];
    // Assigned after the wheel exists (its callback refers to it).
    // eslint-disable-next-line prefer-const
    let laterRef: WheelRef | undefined;
    const wheel: HashedWheel<string> = new HashedWheel<string>({
      tickMs: 10,
      size: 8,
      clock: sim,
      onExpire: (items) => {
        for (const { item } of items) {
          seen.push(item);
          if (item === "first") {
            wheel.add(sim.now() + 25, "chained");
            expect(wheel.cancel(laterRef!)).toBe(true);
          }
        }
      },
    });
    wheel.add(sim.now() + 10, "first");
    laterRef = wheel.add(sim.now() + 30, "later");
    wheel.start();
    sim.advance(100);
    expect(seen).toEqual(["first", "chained"]);
    wheel.stop();
  });
});

describe("HashedWheel: monotonic ticking", () => {
  it("a late tick catches up every elapsed slot in one call and reports lateMs", () => {
    const sim = new SimulatedClock();
    const late = new DistortedTimers(sim, (ms) => ms + 25);
    const { wheel, fires, calls } = setup<string>({ tickMs: 10, size: 16, sim, clock: late });
    const t0 = sim.now();
    wheel.add(t0 + 10, "t1");
    wheel.add(t0 + 20, "t2");
    wheel.add(t0 + 30, "t3");
    wheel.add(t0 + 45, "t5");
    wheel.start();
    sim.advance(35); // first callback 25 ms after tick 1
    expect(calls).toEqual([{ count: 3, tick: 3, lateMs: 25 }]);
    sim.advance(30); // next armed for tick 4 (40) + 25 = 65
    expect(calls[1]).toEqual({ count: 1, tick: 6, lateMs: 25 });
    countsOf(fires);
    expectNeverEarly(fires);
    wheel.stop();
  });

  it("a manual tickNow after a stall catches up and reports lateMs", () => {
    const { sim, wheel, calls } = setup<string>({ tickMs: 10, size: 16 });
    wheel.add(sim.now() + 15, "x");
    sim.advance(75);
    wheel.tickNow();
    expect(calls).toEqual([{ count: 1, tick: 7, lateMs: 65 }]);
  });

  it("tickNow never runs ahead of the monotonic clock", () => {
    const { sim, wheel, fires } = setup<string>({ tickMs: 10, size: 16 });
    wheel.add(sim.now() + 10, "x");
    for (let i = 0; i < 50; i++) wheel.tickNow();
    expect(fires).toHaveLength(0);
    sim.advance(10);
    wheel.tickNow();
    expect(fires).toHaveLength(1);
  });

  it("an early timer callback re-arms without advancing", () => {
    const sim = new SimulatedClock();
    // Every other timer fires at half its delay.
    const early = new DistortedTimers(sim, (ms, call) => (call % 2 === 0 ? ms / 2 : ms));
    const { wheel, fires, calls } = setup<string>({ tickMs: 10, size: 16, sim, clock: early });
    const t0 = sim.now();
    wheel.add(t0 + 10, "a");
    wheel.add(t0 + 20, "b");
    wheel.start();
    sim.advance(5); // early callback at 5
    expect(early.calls).toBe(2);
    expect(fires).toHaveLength(0);
    sim.advance(5);
    expect(calls).toEqual([{ count: 1, tick: 1, lateMs: 0 }]);
    sim.advance(10);
    expect(calls[1]).toEqual({ count: 1, tick: 2, lateMs: 0 });
    expectNeverEarly(fires);
    wheel.stop();
  });

  it("a stall longer than a revolution catches up in one resync", () => {
    const { sim, wheel, fires, calls } = setup({ tickMs: 10, size: 8 });
    const t0 = sim.now();
    for (let i = 0; i < 100; i++) wheel.add(t0 + i * 10 + 1, i); // 0..991 ms
    sim.advance(500); // not started: nothing ticks
    wheel.start();
    sim.advance(0); // the overdue tick runs at once
    expect(calls).toHaveLength(1);
    expect(calls[0]!.count).toBe(50);
    expect(calls[0]!.lateMs).toBe(490);
    sim.advance(600);
    expect(fires).toHaveLength(100);
    countsOf(fires);
    expectNeverEarly(fires);
    for (const f of fires.filter((x) => x.dueMs > t0 + 500)) expect(f.firedWall - f.dueMs).toBeLessThan(10);
    wheel.stop();
  });
});

describe("HashedWheel: wall clock steps", () => {
  it("wall step back 1 s then forward: nothing fires twice, nothing before due", () => {
    const { sim, wheel, fires } = setup({ tickMs: 10, size: 32 });
    const t0 = sim.now();
    for (let i = 0; i < 300; i++) wheel.add(t0 + i * 10 + 5, i); // 5..2995 ms
    wheel.start();
    sim.advance(500);
    const beforeStep = fires.length;
    sim.stepWall(-1000);
    // Added while the wall is behind: converted with the stepped-back wall.
    for (let i = 300; i < 320; i++) wheel.add(sim.now() + (i - 300) * 50 + 5, i);
    sim.advance(700);
    // The wall is back at t0+200: only entries added during the step-back have come due.
    const duringBack = fires.slice(beforeStep).map((f) => f.item);
    expect(duringBack).toEqual([...Array(14).keys()].map((k) => 300 + k));
    expectNeverEarly(fires);
    sim.stepWall(+1000);
    sim.advance(4000);
    expect(fires).toHaveLength(320);
    countsOf(fires);
    expectNeverEarly(fires);
    expect(wheel.size).toBe(0);
    wheel.stop();
  });

  it("wall step forward 10 minutes fires everything that became due exactly once", () => {
    const { sim, wheel, fires, calls } = setup({ tickMs: 20, size: 64 });
    const t0 = sim.now();
    const tenMin = 10 * 60_000;
    for (let i = 0; i < 1000; i++) wheel.add(t0 + 100 + i * 1000, i); // 100 ms .. ~16.7 min
    wheel.start();
    sim.advance(1000);
    expect(fires).toHaveLength(1);
    sim.stepWall(tenMin);
    sim.advance(20); // next tick notices the jump
    const due = [...Array(1000).keys()].filter((i) => t0 + 100 + i * 1000 <= sim.now());
    expect(fires.map((f) => f.item).sort((a, b) => a - b)).toEqual(due);
    expect(calls).toHaveLength(2);
    // The rest were re-placed from their wall due times, so they are not ten minutes late.
    sim.advance(7 * 60_000);
    expect(fires).toHaveLength(1000);
    countsOf(fires);
    expectNeverEarly(fires);
    for (const f of fires.filter((x) => x.dueMs > t0 + tenMin + 1020)) expect(f.firedWall - f.dueMs).toBeLessThan(20);
    wheel.stop();
  });
});

describe("HashedWheel: randomized", () => {
  it("random adds, cancels and wall steps: at most once, never early, nothing lost", () => {
    const { sim, wheel, fires } = setup({ tickMs: 5, size: 16 });
    let seed = 7;
    const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
    const live = new Map<number, WheelRef>();
    const cancelled = new Set<number>();
    let id = 0;
    wheel.start();
    for (let step = 0; step < 3000; step++) {
      const roll = rnd();
      if (roll < 0.5) {
        const n = id++;
        live.set(n, wheel.add(sim.now() + (rnd() - 0.1) * 2000, n));
      } else if (roll < 0.65 && live.size > 0) {
        const keys = [...live.keys()];
        const n = keys[Math.floor(rnd() * keys.length)]!;
        const ok = wheel.cancel(live.get(n)!);
        live.delete(n);
        if (ok) cancelled.add(n);
      } else if (roll < 0.67) {
        sim.stepWall(Math.round((rnd() - 0.5) * 3000));
      }
      sim.advance(Math.floor(rnd() * 12));
    }
    sim.advance(10_000);
    const counts = countsOf(fires);
    expectNeverEarly(fires);
    for (const n of cancelled) expect(counts.has(n)).toBe(false);
    expect(counts.size + cancelled.size).toBe(id);
    expect(wheel.size).toBe(0);
    wheel.stop();
  });
});

describe("HashedWheel: lifecycle", () => {
  it("stop() leaves no pending timers in the clock; start is idempotent and resumes", () => {
    const { sim, wheel, fires } = setup<string>({ tickMs: 10, size: 16 });
    wheel.add(sim.now() + 50, "x");
    wheel.start();
    wheel.start();
    expect(sim.pendingTimers()).toBe(1);
    sim.advance(20);
    expect(sim.pendingTimers()).toBe(1);
    wheel.stop();
    expect(sim.pendingTimers()).toBe(0);
    sim.advance(100);
    expect(fires).toHaveLength(0);
    expect(wheel.size).toBe(1);
    wheel.start();
    sim.advance(0);
    expect(fires.map((f) => f.item)).toEqual(["x"]);
    wheel.stop();
    expect(sim.pendingTimers()).toBe(0);
  });

  it("an empty running wheel arms no timer; an add wakes it and the entry fires on time", () => {
    const { sim, wheel, fires } = setup<string>({ tickMs: 10, size: 16 });
    wheel.start();
    expect(sim.pendingTimers()).toBe(0);
    sim.advance(12_345); // asleep for many revolutions
    expect(sim.pendingTimers()).toBe(0);
    const due = sim.now() + 35;
    wheel.add(due, "a");
    expect(sim.pendingTimers()).toBe(1);
    sim.advance(100);
    expect(fires.map((f) => f.item)).toEqual(["a"]);
    expect(fires[0]!.firedWall).toBeGreaterThanOrEqual(due);
    expect(fires[0]!.firedWall - due).toBeLessThanOrEqual(10);
    expect(fires[0]!.lateMs).toBeLessThanOrEqual(10); // the skipped empty ticks are not lateness
    expect(sim.pendingTimers()).toBe(0); // asleep again once empty
    // Entries already due at add() still fire on the next tick.
    wheel.add(sim.now() - 5, "b");
    sim.advance(10);
    expect(fires.map((f) => f.item)).toEqual(["a", "b"]);
    wheel.stop();
  });

  it("wall steps while asleep: nothing fires early, nothing is late by the step", () => {
    const { sim, wheel, fires } = setup<number>({ tickMs: 10, size: 16 });
    wheel.start();
    sim.advance(500);
    sim.stepWall(-1000); // back while asleep
    let due = sim.now() + 40;
    wheel.add(due, 1);
    sim.advance(60);
    expect(fires.at(-1)!.item).toBe(1);
    expect(fires.at(-1)!.firedWall - due).toBeGreaterThanOrEqual(0);
    expect(fires.at(-1)!.firedWall - due).toBeLessThanOrEqual(10);
    sim.advance(300);
    sim.stepWall(60_000); // forward while asleep
    due = sim.now() + 40;
    wheel.add(due, 2);
    sim.advance(60);
    expect(fires.at(-1)!.item).toBe(2);
    expect(fires.at(-1)!.firedWall - due).toBeGreaterThanOrEqual(0);
    expect(fires.at(-1)!.firedWall - due).toBeLessThanOrEqual(10);
    countsOf(fires);
    wheel.stop();
  });

  it("stop() from inside onExpire leaves no pending timers", () => {
    const sim = new SimulatedClock();
    const wheel = new HashedWheel<number>({ tickMs: 10, size: 8, clock: sim, onExpire: () => wheel.stop() });
    wheel.add(sim.now() + 10, 1);
    wheel.start();
    sim.advance(100);
    expect(sim.pendingTimers()).toBe(0);
  });

  it("rejects bad options and due times", () => {
    const clock = new SimulatedClock();
    const onExpire = () => {};
    expect(() => new HashedWheel({ tickMs: 0, size: 8, clock, onExpire })).toThrow(InvalidInputError);
    expect(() => new HashedWheel({ tickMs: 10, size: 0, clock, onExpire })).toThrow(InvalidInputError);
    expect(() => new HashedWheel({ tickMs: 10, size: 1.5, clock, onExpire })).toThrow(InvalidInputError);
    const wheel = new HashedWheel({ tickMs: 10, size: 8, clock, onExpire });
    expect(() => wheel.add(Number.NaN, 1)).toThrow(InvalidInputError);
    expect(() => wheel.add(Infinity, 1)).toThrow(InvalidInputError);
    expect(wheel.size).toBe(0);
  });
});
