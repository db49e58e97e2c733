import { describe, expect, it } from "vitest";
import { SimulatedClock, silentLogger } from "../../common/index.ts";
import { Horizon, type DueIndexChanges, type WheelItem } from "../../actors/shard/horizon.ts";

/**
 * The shard's horizon without the actor: which due times go on the wheel and which to Redis,
 * what a refill does with the two copies of a reschedule, and when entries come up. The due
 * index here is a sorted list in memory standing in for Redis' sorted set: these tests are
 * about the horizon's bookkeeping, the real index has its own (test/integration).
 */
function setup(opts: { horizonMs?: number; leadMs?: number; decideStepMs?: number; perStep?: number; builtAfterRebuild?: boolean; inMemory?: () => Array<{ id: number; dueMs: number }> } = {}) {
  const clock = new SimulatedClock();
  const index = new Map<number, number>(); // task → due, the "Redis" side
  const pgDue: Array<{ id: number; dueMs: number }> = []; // what a rebuild reads from PostgreSQL
  const came: Array<{ dueMs: number; item: WheelItem; at: number }> = [];
  const refilled: Array<{ id: number; dueMs: number }> = [];
  const takes: number[] = []; // when each takeDue came (the clock's time)
  let active = true;
  const built = { now: true, rebuilds: 0 };
  const h = new Horizon({
    shard: 0, tickMs: 10, wheelSize: 512, clock, log: silentLogger,
    horizonMs: opts.horizonMs ?? 2000, leadMs: opts.leadMs ?? 100, random: () => 0,
    ...(opts.decideStepMs !== undefined ? { decideStepMs: opts.decideStepMs } : {}),
    ...(opts.perStep !== undefined ? { perStep: opts.perStep } : {}),
    due: {
      rebuildFrom: async (_s: number, from: { memory?: () => ReadonlyArray<{ id: number; dueMs: number }>; stored: () => Promise<ReadonlyArray<{ id: number; dueMs: number }>> }) => {
        built.rebuilds++;
        index.clear();
        // (as DueIndex.rebuildFrom: neither overwrites an entry already there, memory first)
        for (const e of from.memory?.() ?? []) if (!index.has(e.id)) index.set(e.id, e.dueMs);
        for (const e of await from.stored()) if (!index.has(e.id)) index.set(e.id, e.dueMs);
        built.now = opts.builtAfterRebuild ?? true;
      },
      takeDue: async (_s: number, untilMs: number, limit: number) => {
        takes.push(clock.now());
        if (!built.now) return null;
        const out = [...index].filter(([, d]) => d <= untilMs).sort((a, b) => a[1] - b[1]).slice(0, limit).map(([id, dueMs]) => ({ id, dueMs }));
        for (const x of out) index.delete(x.id);
        const left = [...index.values()];
        return { items: out, nextDueMs: left.length ? Math.min(...left) : null };
      },
    },
    store: { dueOfShard: async () => [...pgDue] },
    onDue: (items) => { for (const i of items) came.push({ ...i, at: clock.now() }); },
    onRefilled: (items) => { refilled.push(...items); },
    active: () => active,
    ...(opts.inMemory ? { inMemory: opts.inMemory } : {}),
  });
  const changes = (): DueIndexChanges => ({ redisAdd: [], redisRemove: [] });
  return { clock, index, pgDue, built, came, refilled, takes, h, changes, stop: () => { active = false; h.halt(); } };
}

describe("shard horizon", () => {
  it.each([
    { name: "inside the horizon: on the wheel, leadMs ahead", inMs: 1500, onWheel: true },
    { name: "at the horizon's edge: on the wheel", inMs: 2000, onWheel: true },
    { name: "beyond the horizon: to the due index with the round", inMs: 2001, onWheel: false },
    { name: "already due: on the wheel, next tick", inMs: -50, onWheel: true },
  ])("schedule: $name", ({ inMs, onWheel }) => {
    const { clock, h, changes, came } = setup();
    const ch = changes();
    const due = clock.now() + inMs;
    h.schedule(ch, 7, due);
    expect(h.dueOf(7)).toBe(onWheel ? due : undefined);
    expect(ch.redisAdd).toEqual(onWheel ? [] : [{ id: 7, dueMs: due }]);
    if (!onWheel) return;
    const start = clock.now();
    h.start();
    clock.advance(Math.max(0, inMs) + 20);
    expect(came.map((c) => c.item)).toEqual([{ k: 0, id: 7, due }]);
    // Placed leadMs (100) ahead of its due time; one already due comes on the next tick.
    const expectedAt = Math.max(start, due - 100);
    expect(came[0]!.at).toBeGreaterThanOrEqual(expectedAt);
    expect(came[0]!.at).toBeLessThanOrEqual(expectedAt + 20);
  });

  it("the decision grid: 400 random due times each come up between lead and lead + step ahead, on a step boundary (seed 5)", () => {
    const { clock, h, changes, came } = setup({ decideStepMs: 100 });
    let x = 5;
    const rnd = () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x / 2 ** 32; };
    const start = clock.now();
    const dues = new Map<number, number>();
    for (let id = 1; id <= 400; id++) { const due = start + 150 + Math.floor(rnd() * 1800); dues.set(id, due); h.schedule(changes(), id, due); }
    h.start();
    clock.advance(2100);
    expect(came).toHaveLength(400);
    for (const c of came) {
      const it0 = c.item as { k: 0; id: number; due: number };
      expect(it0.due).toBe(dues.get(it0.id));
      const boundary = Math.floor((it0.due - 100) / 100) * 100;
      expect(h.decideAt(it0.due)).toBe(boundary);
      // Came up on the tick of its boundary (10 ms ticks), never later than lead ahead of its due time.
      expect(c.at).toBeGreaterThanOrEqual(boundary);
      expect(c.at).toBeLessThan(boundary + 10 + 1);
      expect(it0.due - c.at).toBeGreaterThan(100 - 10);
      expect(it0.due - c.at).toBeLessThanOrEqual(200);
    }
    // One instant per step: the runs due within a step are decided together.
    const instants = new Set(came.map((c) => Math.floor((c.item as { due: number }).due / 100)));
    const atTimes = new Set(came.map((c) => c.at));
    expect(atTimes.size).toBeLessThanOrEqual(instants.size + 1);
  });

  it("the decision grid is at most the lead; no lead, no grid", () => {
    expect(setup({ decideStepMs: 100, leadMs: 40 }).h.decideStepMs).toBe(40);
    const none = setup({ decideStepMs: 100, leadMs: 0 }).h;
    expect(none.decideStepMs).toBe(0);
    expect(none.decideAt(123_457)).toBe(123_457);
    expect(setup().h.decideAt(123_457)).toBe(123_357); // default: no grid, exactly lead ahead
  });

  it("unschedule: removes from Redis only what Redis may hold", () => {
    const { clock, h, changes } = setup();
    const ch = changes();
    h.schedule(ch, 1, clock.now() + 500);            // refill-taken copy: Redis holds nothing
    h.schedule(ch, 2, clock.now() + 500, true);      // the API's copy: Redis still holds it
    h.schedule(ch, 3, clock.now() + 500);
    expect(h.cameDue(3, clock.now() + 500)).toMatchObject({ inRedis: false }); // fired off the wheel, refill had taken it
    h.unschedule(ch, 1); h.unschedule(ch, 2); h.unschedule(ch, 3); h.unschedule(ch, 4);
    expect(ch.redisRemove).toEqual([2, 4]);
    expect(h.dueOf(1)).toBeUndefined();
    expect(h.dueOf(2)).toBeUndefined();
  });

  it("unschedule in a later round: nothing removed again until something is scheduled (a one-shot's completion after its fire)", () => {
    const { clock, h, changes } = setup();
    const due = clock.now() + 500;
    const fire = changes();
    h.schedule(fire, 1, due);                         // refill-taken copy
    h.schedule(fire, 2, due, true);                   // the API's copy
    h.cameDue(1, due); h.cameDue(2, due);
    h.unschedule(fire, 1); h.unschedule(fire, 2); h.unschedule(fire, 3); // the fire's round: no next slot
    expect(fire.redisRemove).toEqual([2, 3]);
    const done = changes();                           // the round that ends their runs
    for (const id of [1, 2, 3]) h.unschedule(done, id);
    expect(done.redisRemove).toEqual([]);
    // Scheduled again: beyond the horizon (into Redis) or back into the index, it may be there.
    const again = changes();
    h.schedule(again, 1, clock.now() + 60_000);
    h.backToIndex(again, 2, due);
    expect(again.redisAdd.map((a) => a.id)).toEqual([1, 2]);
    h.forget(3);                                      // its row left memory: nothing known any more
    const later = changes();
    for (const id of [1, 2, 3]) h.unschedule(later, id);
    expect(later.redisRemove).toEqual([1, 2, 3]);
  });

  it("cameDue: a superseded copy is ignored; holdUntilDue decides at the due time itself", () => {
    const { clock, h, changes, came } = setup();
    const ch = changes();
    const first = clock.now() + 500; const second = clock.now() + 800;
    h.schedule(ch, 9, first);
    h.takeOff(9);
    h.schedule(ch, 9, second);
    h.start();
    clock.advance(720); // the entry comes up leadMs (100) ahead of `second`; the cancelled one never
    expect(came.map((c) => c.item)).toEqual([{ k: 0, id: 9, due: second }]);
    expect(h.cameDue(9, first)).toBeUndefined();
    expect(h.cameDue(9, second)).toEqual(expect.objectContaining({ inRedis: false }));
    expect(h.dueOf(9)).toBeUndefined();
    // A run of the task is still in flight: decided at the due time itself, not leadMs ahead.
    h.holdUntilDue(9, second, false);
    expect(h.dueOf(9)).toBe(second);
    clock.advance(second - clock.now() - 30);
    expect(came.length).toBe(1);
    clock.advance(50);
    expect(came.map((c) => c.item)).toEqual([{ k: 0, id: 9, due: second }, { k: 0, id: 9, due: second }]);
    expect(came[1]!.at).toBeGreaterThanOrEqual(second);
  });

  it("refilled: the row's due time decides between the two copies of a reschedule", () => {
    const { clock, h, changes } = setup();
    const now = clock.now();
    const ch = changes();
    h.schedule(ch, 1, now + 300);
    h.schedule(ch, 2, now + 300);
    h.schedule(ch, 3, now + 300);
    const rows = new Map<number, number | null>([[1, now + 300], [2, now + 600], [3, null]]);
    h.refilled(ch, [{ id: 1, dueMs: now + 600 }, { id: 2, dueMs: now + 600 }, { id: 3, dueMs: now + 600 }, { id: 4, dueMs: now + 700 }], (id) => rows.get(id));
    expect(h.dueOf(1)).toBe(now + 300); // the wheel's copy is the row's
    expect(h.dueOf(2)).toBe(now + 600); // the refill's copy is the row's
    expect(h.dueOf(3)).toBe(now + 300); // no due time on the row: onDue skips it
    expect(h.dueOf(4)).toBe(now + 700); // new to the wheel
    expect(ch.redisAdd).toEqual([]);
  });

  it("timeouts share the wheel and can be cancelled", () => {
    const { clock, h, came } = setup();
    const a = h.addTimeout(clock.now() + 100, "r1");
    h.addTimeout(clock.now() + 100, "r2");
    h.cancel(a);
    h.start();
    clock.advance(150);
    expect(came.map((c) => c.item)).toEqual([{ k: 1, runId: "r2" }]);
    expect(h.size).toBe(0);
  });

  it("refill: takes what the index holds up to the horizon, in batches, and keeps refilling until halted", async () => {
    const { clock, h, index, refilled, stop } = setup({ horizonMs: 2000 });
    const now = clock.now();
    for (let i = 0; i < 12_000; i++) index.set(i, now + (i % 2 === 0 ? 1000 : 5000));
    await h.refill();
    expect(refilled.length).toBe(6000); // the near half, in batches of at most 5,000
    expect(new Set(refilled.map((r) => r.id)).size).toBe(6000);
    expect(refilled.every((r) => r.dueMs === now + 1000)).toBe(true);
    clock.advance(3500); // the far half comes within the horizon; the next refills take it
    for (let i = 0; i < 3 && refilled.length < 12_000; i++) {
      await h.settled();
      await new Promise((r) => setImmediate(r));
      await h.settled();
      clock.advance(250); // the refill period
    }
    expect(refilled.length).toBe(12_000);
    stop();
    index.set(99_999, now);
    clock.advance(1000);
    await h.settled();
    expect(refilled.some((r) => r.id === 99_999)).toBe(false);
  });

  it("refill: backs off while it finds nothing (250, 500, 1000 ms, no further), is back at its period once it takes something, and refillSoon takes at once", async () => {
    const { clock, h, index, refilled, takes, stop } = setup({ horizonMs: 2000 });
    const pump = async () => { await h.settled(); await new Promise((r) => setImmediate(r)); await h.settled(); };
    const run = async (ms: number) => { for (let t = 0; t < ms; t += 10) { clock.advance(10); await pump(); } };
    const t0 = clock.now();
    await h.refill();
    await run(6000);
    // (A wait counts from the end of the refill before it, which this test sees up to one 10 ms step late.)
    const gaps = takes.slice(1).map((t, i) => t - takes[i]!);
    expect(Math.max(...gaps)).toBeLessThanOrEqual(1010);
    for (const g of gaps.slice(-3)) expect(g).toBeGreaterThanOrEqual(1000);
    // Something due within the horizon that no hand-over announced: taken within the longest wait.
    index.set(1, clock.now() + 1500);
    const put = clock.now();
    await run(1000);
    expect(refilled.map((r) => r.id)).toEqual([1]);
    expect(takes.at(-1)! - put).toBeLessThanOrEqual(1010);
    // Having taken something, the next refill comes at the period again, then backs off anew.
    await run(3000);
    const k = takes.findIndex((t) => t >= put); // the refill that took it
    const next = [1, 2, 3, 4].map((j) => takes[k + j]! - takes[k + j - 1]!);
    for (const [i, want] of [250, 500, 1000, 1000].entries()) {
      expect(next[i]).toBeGreaterThanOrEqual(want);
      expect(next[i]).toBeLessThanOrEqual(want + 10);
    }
    // Idle again, then a hand-over: refillSoon takes at once, not at the backed-off time.
    await run(3000);
    index.set(2, clock.now() + 300);
    const before = takes.length;
    h.refillSoon();
    await pump();
    expect(takes.length).toBe(before + 1);
    expect(takes.at(-1)).toBe(clock.now());
    expect(refilled.map((r) => r.id)).toEqual([1, 2]);
    // refillSoon during a refill in flight: one more refill right after it, not lost.
    await run(3000); // backed off again
    const inFlight = h.refill(); // its take has been made: what comes now is not in it
    index.set(3, clock.now() + 300);
    h.refillSoon();
    await inFlight; await pump();
    expect(refilled.map((r) => r.id)).toEqual([1, 2, 3]);
    expect(clock.now() - t0).toBeGreaterThan(0);
    stop();
  });

  it("refill: a backed-off shard still takes an entry the moment it comes within the horizon (the take says what is left)", async () => {
    const { clock, h, index, refilled, takes, stop } = setup({ horizonMs: 2000 });
    const pump = async () => { await h.settled(); await new Promise((r) => setImmediate(r)); await h.settled(); };
    const run = async (ms: number) => { for (let t = 0; t < ms; t += 10) { clock.advance(10); await pump(); } };
    await h.refill();
    await run(4000); // backed off to 1 s
    // Written by someone else (no hand-over), due 2.6 s ahead: within the horizon 600 ms from now.
    const due = clock.now() + 2600;
    index.set(1, due);
    await run(1100); // the next refill (≤ 1 s) sees it left in the index; the one after comes when it enters
    expect(refilled.map((r) => r.id)).toEqual([1]);
    const took = takes.find((t) => t >= due - 2000)!;
    expect(took - (due - 2000)).toBeGreaterThanOrEqual(0);
    expect(took - (due - 2000)).toBeLessThanOrEqual(260); // not the 1 s back-off; at worst the base period after the take that saw it
    // Known far ahead: the back-off holds (1 s), the take at entry is on time.
    await run(3000);
    const far = clock.now() + 6000;
    index.set(2, far);
    await run(6000);
    expect(refilled.map((r) => r.id)).toEqual([1, 2]);
    const tookFar = takes.find((t) => t >= far - 2000)!;
    expect(tookFar - (far - 2000)).toBeLessThanOrEqual(10);
    const gaps = takes.filter((t) => t > far - 6000 && t < far - 2000).map((t, i, a) => (i ? t - a[i - 1]! : 1000));
    for (const g of gaps) expect(g).toBeGreaterThanOrEqual(990); // the index's next entry is far: no extra takes
    stop();
  });

  it("refill: an index that is not built (lost, or on a new server) is rebuilt from PostgreSQL once, then taken", async () => {
    const { clock, h, index, pgDue, built, refilled, stop } = setup({ horizonMs: 2000 });
    const now = clock.now();
    index.set(1, now + 500);                          // what a lost index still seemed to hold
    built.now = false;
    pgDue.push({ id: 2, dueMs: now + 500 }, { id: 3, dueMs: now + 9000 });
    await h.refill();
    expect(built.rebuilds).toBe(1);
    expect(refilled).toEqual([{ id: 2, dueMs: now + 500 }]);
    expect([...index]).toEqual([[3, now + 9000]]);    // beyond the horizon: stays in the index
    // Still not built right after the rebuild (the server changed again): no loop, the next refill tries.
    const again = setup({ horizonMs: 2000, builtAfterRebuild: false });
    again.built.now = false;
    await again.h.refill();
    expect(again.built.rebuilds).toBe(1);
    expect(again.refilled).toEqual([]);
    stop(); again.stop();
  });

  it("refill: a rebuild takes the due times the shard holds in memory over the rows PostgreSQL may still hold stale", async () => {
    // Task 5 fired at `now - 100` with its row's write deferred to the run's end: PostgreSQL
    // still names that slot; its next due time (beyond the horizon) was in the writes the
    // failover lost. Rebuilt from PostgreSQL alone, the stale entry came due, was superseded,
    // and the task was stranded.
    const memory = [{ id: 5, dueMs: 0 }];
    const { clock, h, index, pgDue, built, refilled, stop } = setup({ horizonMs: 2000, inMemory: () => memory });
    const now = clock.now();
    memory[0]!.dueMs = now + 6000;
    built.now = false;
    pgDue.push({ id: 5, dueMs: now - 100 }, { id: 6, dueMs: now + 7000 });
    await h.refill();
    expect(built.rebuilds).toBe(1);
    expect(refilled).toEqual([]);
    expect([...index].sort((a, b) => a[0] - b[0])).toEqual([[5, now + 6000], [6, now + 7000]]);
    stop();
  });

  /**
   * The slow reference for spreading: every due time walks down from its unspread step, one step
   * at a time, to the first with fewer than `cap` entries, not below the current step.
   */
  function referencePlacement(dues: Array<{ due: number; now: number }>, lead: number, step: number, cap: number): number[] {
    const load = new Map<number, number>();
    return dues.map(({ due, now }) => {
      const at = Math.floor((due - lead) / step) * step;
      const current = Math.floor(now / step) * step;
      if (at <= current) return at;
      let to = at;
      while (to > current && (load.get(to) ?? 0) >= cap) to -= step;
      to = Math.max(to, current);
      load.set(to, (load.get(to) ?? 0) + 1);
      return to;
    });
  }

  it("spreading a burst: at most perStep due times per step, each as late as the reference places it, never after its unspread step nor before now (seeded, against a slow reference)", () => {
    for (let seed = 1; seed <= 40; seed++) {
      let x = seed;
      const rnd = () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x / 2 ** 32; };
      const cap = 1 + Math.floor(rnd() * 6);
      const { clock, h, changes, came } = setup({ decideStepMs: 100, perStep: cap, horizonMs: 3000 });
      const start = clock.now();
      // A few bursts at single instants and some scattered due times, scheduled in batches as
      // time moves (as refills and the API schedule them), in due order or not.
      const instants = Array.from({ length: 1 + Math.floor(rnd() * 3) }, () => start + 300 + Math.floor(rnd() * 2500));
      const planned: Array<{ id: number; due: number; now: number }> = [];
      let id = 0;
      h.start();
      for (let batch = 0; batch < 4; batch++) {
        const now = clock.now();
        const dues: number[] = [];
        for (let i = 0; i < 5 + Math.floor(rnd() * 40); i++) dues.push(rnd() < 0.7 ? instants[Math.floor(rnd() * instants.length)]! : now + 150 + Math.floor(rnd() * 2500));
        if (rnd() < 0.5) dues.sort((a, b) => a - b);
        for (const due of dues) { if (due <= now + 3000) { planned.push({ id: ++id, due, now }); h.schedule(changes(), id, due); } }
        clock.advance(Math.floor(rnd() * 150));
      }
      clock.advance(4000);
      const expected = referencePlacement(planned, 100, 100, cap);
      const at = new Map(came.map((c) => [(c.item as { id: number }).id, c.at]));
      expect(came, `seed ${seed}`).toHaveLength(planned.length);
      planned.forEach((p, i) => {
        const placed = expected[i]!;
        const got = at.get(p.id)!;
        // It came up on the tick of its step (10 ms ticks), or at the next tick if that step was already past.
        expect(got, `seed ${seed} id ${p.id}`).toBeGreaterThanOrEqual(Math.max(placed, p.now));
        expect(got, `seed ${seed} id ${p.id}`).toBeLessThanOrEqual(Math.max(placed, p.now) + 10);
        expect(placed).toBeLessThanOrEqual(h.decideAt(p.due)); // never later than unspread
        expect(got).toBeLessThan(p.due);                       // always decided ahead of its due time
      });
      // No future step holds more than cap entries placed there by spreading.
      const perStep = new Map<number, number>();
      planned.forEach((p, i) => { if (expected[i]! > Math.floor(p.now / 100) * 100) perStep.set(expected[i]!, (perStep.get(expected[i]!) ?? 0) + 1); });
      for (const n of perStep.values()) expect(n).toBeLessThanOrEqual(cap);
    }
  });

  it("spreading: 1,000 due at one instant go on the 100 steps before it, 10 a step, the last ones in the lead", () => {
    const { clock, h, changes, came } = setup({ decideStepMs: 100, perStep: 10, horizonMs: 10_000 });
    const due = Math.floor(clock.now() / 100) * 100 + 10_000;
    for (let id = 1; id <= 1000; id++) h.schedule(changes(), id, due);
    h.start();
    clock.advance(10_100);
    const steps = new Map<number, number>();
    for (const c of came) { const s0 = Math.floor(c.at / 100) * 100; steps.set(s0, (steps.get(s0) ?? 0) + 1); }
    expect(came).toHaveLength(1000);
    expect(Math.max(...steps.values())).toBe(10);
    expect(Math.max(...came.map((c) => c.at))).toBeLessThanOrEqual(due - 100);
    expect(Math.min(...came.map((c) => c.at))).toBeGreaterThanOrEqual(due - 10_000);
  });

  it("deferToLead: an entry spread ahead goes back to its unspread step", () => {
    const { clock, h, came } = setup({ decideStepMs: 100, perStep: 1 });
    const due = Math.floor(clock.now() / 100) * 100 + 1500;
    h.start();
    h.deferToLead(9, due, false);
    clock.advance(1500);
    expect(came.map((c) => [c.item, c.at])).toEqual([[{ k: 0, id: 9, due }, h.decideAt(due)]]);
  });

  it("nextStepDelayMs is the tick that hands over the next step's due times, whatever the wall clock's offset (seeded)", () => {
    let seed = 7;
    const rnd = () => { seed = (seed * 1103515245 + 12345) % 2 ** 31; return seed / 2 ** 31; };
    for (let i = 0; i < 300; i++) {
      const { clock, h, changes, came } = setup({ leadMs: 500, decideStepMs: 100 });
      // Wall and monotonic readings apart by any amount, fractions of a ms included.
      clock.stepWall(rnd() * 1000);
      clock.advance(rnd() * 250);
      h.start();
      const delay = h.nextStepDelayMs();
      const nextStep = (Math.floor(clock.now() / 100) + 1) * 100;
      // Due within the step decided at nextStep (leadMs ahead): its entry comes up with that step.
      const due = nextStep + 500 + Math.floor(rnd() * 100);
      h.schedule(changes(), 1, due);
      const mono0 = clock.monotonic();
      clock.advance(delay - 1e-6);
      expect(came, `case ${i}: not before the delay`).toEqual([]);
      clock.advance(2e-6);
      expect(came.map((c) => c.item), `case ${i}: at the delay (${delay} ms after ${mono0})`).toEqual([{ k: 0, id: 1, due }]);
      expect(delay).toBeGreaterThan(0);
      expect(delay).toBeLessThanOrEqual(100 + 10);
    }
  });
});
