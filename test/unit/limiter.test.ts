import { describe, expect, it } from "vitest";
import { InFlightLimiter } from "../../actors/index.ts";
import { rng } from "./cron-reference.ts";


describe("in-flight limiter", () => {
  it("a full executor queues waiters and hands freed places out earliest due first", () => {
    const l = new InFlightLimiter(2);
    expect(l.tryAcquire("x")).toBe(true);
    expect(l.tryAcquire("x")).toBe(true);
    expect(l.tryAcquire("x")).toBe(false);
    const woken: number[] = [];
    for (const due of [30, 10, 20]) l.wait("x", { dueMs: due, wake: () => { woken.push(due); return true; } });
    expect(woken).toEqual([]);
    expect(l.waiting("x")).toBe(3);
    l.release("x");
    l.release("x");
    expect(woken).toEqual([10, 20]);
    expect(l.inFlight("x")).toBe(2);
    // A newcomer does not jump the queue while someone due earlier waits.
    l.release("x");
    expect(woken).toEqual([10, 20, 30]);
    expect(l.tryAcquire("x")).toBe(false);
  });

  it("a stale waiter passes its place on; stale entries never block a free executor", () => {
    const l = new InFlightLimiter(1);
    expect(l.tryAcquire("x")).toBe(true);
    const woken: string[] = [];
    l.wait("x", { dueMs: 1, wake: () => false });
    l.wait("x", { dueMs: 2, wake: () => { woken.push("live"); return true; } });
    l.release("x");
    expect(woken).toEqual(["live"]);
    expect(l.inFlight("x")).toBe(1);
    l.release("x");
    // Only stale waiters left and nothing in flight: the next acquire drops them and succeeds.
    l.wait("x", { dueMs: 3, wake: () => false });
    expect(l.tryAcquire("x")).toBe(true);
    expect(l.waiting("x")).toBe(0);
  });

  it("raising an executor's limit wakes waiters at once", () => {
    const l = new InFlightLimiter(10);
    l.setLimit("x", 1);
    expect(l.tryAcquire("x")).toBe(true);
    let woke = 0;
    l.wait("x", { dueMs: 5, wake: () => { woke++; return true; } });
    l.setLimit("x", 3);
    expect(woke).toBe(1);
    expect(l.inFlight("x")).toBe(2);
  });

  it("an executor without a limit of its own (null) has the node's, never above it; clearing its own wakes waiters", () => {
    const l = new InFlightLimiter(4);
    expect(l.limitOf("x")).toBe(4);
    l.setLimit("x", 2);
    expect(l.limitsByExecutor()).toEqual({ x: 2 });
    expect(l.tryAcquire("x")).toBe(true);
    expect(l.tryAcquire("x")).toBe(true);
    let woke = 0;
    l.wait("x", { dueMs: 5, wake: () => { woke++; return true; } });
    l.setLimit("x", null);
    expect(l.limitOf("x")).toBe(4);
    expect(woke).toBe(1);
    l.setLimit("x", 50); // an executor's own limit above the node's: the node's
    expect(l.limitsByExecutor()).toEqual({ x: 4 });
  });

  it("property: never over the limit, live waiters served earliest due first, none left waiting while a place is free (seeded)", () => {
    for (let seed = 1; seed <= 100; seed++) {
      const rand = rng(seed);
      const limit = 1 + Math.floor(rand() * 4);
      const l = new InFlightLimiter(limit);
      let held = 0; // places held by runs (acquired, or given by a wake)
      let served = 0;
      const pending = new Map<number, { wants: boolean; dueMs: number }>();
      let nextId = 0;
      for (let step = 0; step < 200; step++) {
        const op = rand();
        if (op < 0.45) {
          if (l.tryAcquire("x")) held++;
          else {
            const id = nextId++;
            const dueMs = Math.floor(rand() * 1000);
            pending.set(id, { wants: true, dueMs });
            l.wait("x", {
              dueMs,
              wake: () => {
                const w = pending.get(id)!;
                pending.delete(id);
                if (!w.wants) return false;
                for (const o of pending.values()) if (o.wants) expect(o.dueMs, `seed ${seed}: served due ${dueMs} before ${o.dueMs}`).toBeGreaterThanOrEqual(dueMs);
                held++; served++;
                return true;
              },
            });
          }
        } else if (op < 0.85) {
          if (held > 0) { held--; l.release("x"); }
        } else {
          // A waiter goes stale (its shard stopped, its task was paused).
          const ids = [...pending.keys()];
          if (ids.length) pending.get(ids[Math.floor(rand() * ids.length)]!)!.wants = false;
        }
        expect(l.inFlight("x"), `seed ${seed} step ${step}`).toBe(held);
        expect(held).toBeLessThanOrEqual(limit);
        if ([...pending.values()].some((w) => w.wants)) expect(held, `seed ${seed} step ${step}: a live waiter waits while a place is free`).toBe(limit);
      }
      expect(served, `seed ${seed} exercised the queue`).toBeGreaterThan(0);
    }
  });

  it("places ahead: only at an executor that holds, only while nobody waits, at most maxAhead, outside the limit", () => {
    const holding = new Set<string>();
    const l = new InFlightLimiter(1, { max: 2, holds: (e) => holding.has(e) });
    expect(l.tryAcquireAhead("x")).toBe(false); // not known to hold runs
    holding.add("x");
    expect(l.tryAcquire("x")).toBe(true); // the one place under the limit is taken
    expect(l.tryAcquireAhead("x")).toBe(true);
    expect(l.tryAcquireAhead("x")).toBe(true);
    expect(l.mayGoAhead("x")).toBe(false); // maxAhead reached
    expect(l.tryAcquireAhead("x")).toBe(false);
    expect([l.inFlight("x"), l.ahead("x"), l.byExecutor().get("x")]).toEqual([1, 2, 3]);
    // A place ahead given back frees no place under the limit (and wakes nobody).
    let woke = 0;
    l.wait("x", { dueMs: 1, wake: () => { woke++; return true; } });
    l.release("x", true);
    expect([woke, l.ahead("x"), l.inFlight("x")]).toEqual([0, 1, 1]);
    // Somebody waits: no place ahead even with room, so a run due now never waits behind a later one.
    expect(l.mayGoAhead("x")).toBe(false);
    l.release("x");
    expect(woke).toBe(1);
    expect(l.mayGoAhead("x")).toBe(true);
    holding.delete("x");
    expect(l.mayGoAhead("x")).toBe(false);
    expect(new InFlightLimiter(1).mayGoAhead("y")).toBe(false); // maxAhead 0 by default
  });

  it("property: places ahead never pass maxAhead, never go to a non-holding executor or past a waiter, and the counts come back to zero (seeded)", () => {
    for (let seed = 1; seed <= 60; seed++) {
      const rand = rng(seed);
      const maxAhead = Math.floor(rand() * 5);
      const limit = 1 + Math.floor(rand() * 3);
      const holds = rand() < 0.7;
      const l = new InFlightLimiter(limit, { max: maxAhead, holds: (e) => holds && e === "x" });
      const placed: boolean[] = []; // true: ahead, false: under the limit
      let waiters = 0;
      for (let step = 0; step < 200; step++) {
        const r = rand();
        if (r < 0.35) {
          const before = { waiting: l.waiting("x"), ahead: l.ahead("x") };
          const ok = l.tryAcquireAhead("x");
          if (ok) {
            expect(holds).toBe(true);
            expect(before.waiting).toBe(0);
            expect(before.ahead).toBeLessThan(maxAhead);
            placed.push(true);
          }
        } else if (r < 0.6) {
          if (l.tryAcquire("x")) placed.push(false);
          else { waiters++; l.wait("x", { dueMs: step, wake: () => { placed.push(false); return true; } }); }
        } else if (placed.length) {
          const i = Math.floor(rand() * placed.length);
          const ahead = placed.splice(i, 1)[0]!;
          l.release("x", ahead);
        }
        expect(l.ahead("x")).toBe(placed.filter((a) => a).length);
        expect(l.ahead("x")).toBeLessThanOrEqual(maxAhead);
        expect(l.inFlight("x") + l.ahead("x")).toBe(l.byExecutor().get("x") ?? 0);
      }
      while (placed.length) l.release("x", placed.pop()!);
      expect([l.ahead("x"), l.inFlight("x"), l.waiting("x")], `seed ${seed} (${waiters} waited)`).toEqual([0, 0, 0]);
    }
  });
});
