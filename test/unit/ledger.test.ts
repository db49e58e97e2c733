import { describe, expect, it } from "vitest";
import { compiledOf, nextPointer, type TaskRow } from "../../actors/index.ts";
import type { LedgerInsert, TriggerRow } from "../../actors/store/index.ts";
import * as ledger from "../../actors/shard/ledger.ts";
import { rng as mulberry32 } from "./cron-reference.ts";

/**
 * Property tests of the pure ledger module (fixed seeds): a random sequence of decisions, as the
 * shard actor makes them, against a slow reference that walks every slot of the trigger one by
 * one. Every slot up to the watermark must be a run or in exactly one stored interval.
 */


const T0 = Date.UTC(2026, 0, 5, 0, 0, 0);

function taskWith(tr: TriggerRow, misfire: TaskRow["misfire"]): TaskRow {
  return {
    id: 1, name: "t", shard: 0, executor: "e", payload: null, timeoutMs: 1000, maxAttempts: 1, backoffMs: 0, backoffMaxMs: 0, misfire, overlap: "forbid",
    state: "pending", record: {}, upstreams: [], nextDueMs: null, nextSlotMs: null, nextSource: null, nextReason: null, triggerSlots: {},
    nextTriggerId: null, nextCausedBy: null, createdMs: T0, updatedMs: T0, triggers: [tr], hasDownstreams: false, generation: 0, applySet: null,
  };
}

/** The database's upsert, in memory: an insert whose afterMs ends a stored row of the same cause extends it. */
function store(rows: LedgerInsert[], write: LedgerInsert[]): void {
  for (const iv of write) {
    const hit = rows.find((r) => r.taskId === iv.taskId && r.triggerId === iv.triggerId && r.reason === iv.reason && r.mergeKey === iv.mergeKey && iv.afterMs !== null && r.toMs === iv.afterMs);
    if (hit) { hit.toMs = iv.toMs; hit.count += iv.count; } else rows.push({ ...iv });
  }
}

/** Slow reference: every slot of the trigger from its first through `untilMs`, one next() at a time. */
function referenceSlots(tr: TriggerRow, untilMs: number): number[] {
  const t = compiledOf(tr);
  const out: number[] = [];
  for (let s = ledger.firstSlot(t, T0); s !== null && s <= untilMs; s = t.next(s)) out.push(s);
  return out;
}

function expand(tr: TriggerRow, iv: LedgerInsert): number[] {
  const t = compiledOf(tr);
  const out: number[] = [];
  for (let s: number | null = iv.fromMs; s !== null && s <= iv.toMs; s = t.next(s)) out.push(s);
  return out;
}

const TRIGGERS: Array<() => TriggerRow> = [
  () => ({ id: 7, kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs: 1000, anchorMs: T0 }, enabled: true }),
  () => ({ id: 7, kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs: 250, anchorMs: T0 + 17 }, enabled: true }),
  () => ({ id: 7, kind: "cron", spec: { kind: "cron", expr: "*/5 * * * * *", tz: "UTC" }, enabled: true }),
  () => ({ id: 7, kind: "cron", spec: { kind: "cron", expr: "0 * * * *", tz: "Asia/Shanghai" }, enabled: true }),
  () => ({ id: 7, kind: "cron", spec: { kind: "cron", expr: "*/3 * * * * *", tz: "Europe/Berlin" }, enabled: true }),
];

function simulate(seed: number) {
  const rnd = mulberry32(seed);
  const tr = TRIGGERS[Math.floor(rnd() * TRIGGERS.length)]!();
  const misfire = (["once", "skip", "all"] as const)[Math.floor(rnd() * 3)]!;
  const task = taskWith(tr, misfire);
  const t = compiledOf(tr);
  const rows: LedgerInsert[] = [];
  const runs: number[] = [];
  let now = T0;
  const ctx = () => ({ node: "n1", shard: 0, epoch: 1, now });
  const key = String(tr.id);
  let withdrawn = false;
  for (let step = 0; step < 60; step++) {
    const write: LedgerInsert[] = [];
    // The slot the shard's pointer names next (schedule.ts), not the one after the watermark.
    const next = nextPointer(task, now)?.slotMs ?? null;
    if (next === null) break;
    const r = rnd();
    if (r < 0.55 && !withdrawn) {
      // On time: the shard fires (or skips, or is refused) the next slot.
      now = Math.max(now, next);
      const q = rnd();
      const fate: ledger.SlotFate = q < 0.6 ? { outcome: "run", runId: `r${step}` }
        : q < 0.8 ? { outcome: "overlap", runId: `s${step}`, runningRunId: "r-long" }
        : q < 0.95 ? { outcome: "refused", runId: `x${step}`, executor: "e", inFlight: 5, limit: 5, retryInMs: 100 }
        : { outcome: "upstream", state: "cancelled", why: "no" };
      if (fate.outcome === "run" && rnd() < 0.15) {
        // Recorded ahead, then withdrawn by a pause before its due time: the slot is given back.
        const saved = ledger.saveWatermark(task.triggerSlots, tr.id);
        ledger.recordSlot([], task, tr.id, next, fate, ctx());
        ledger.restoreWatermark(task, saved);
        withdrawn = true; // the task was paused: the next decision is its resume
      } else {
        expect(ledger.recordSlot(write, task, tr.id, next, fate, ctx())).toBe(true);
        if (fate.outcome === "run") runs.push(next);
        task.triggerSlots = { ...task.triggerSlots, [key]: next };
      }
    } else {
      // A gap: paused, the shard unowned, or the node behind; then the misfire policy acts.
      const span = (t.next(next) ?? next) - next;
      now = Math.max(now, next) + Math.floor(rnd() * 12 * Math.max(span, 1000)) + 1;
      withdrawn = false;
      const c = rnd();
      const cause: ledger.GapCause = c < 0.4 || withdrawn ? { kind: "paused", pausedAtMs: next - 1, resumedAtMs: now }
        : c < 0.7 ? { kind: "outage", acquiredMs: now, node: "n2", epoch: 2, lastOwner: "n1", lastEpoch: 1, lastOwnerSinceMs: T0 }
        : { kind: "behind" };
      ledger.recordMisfireGap(write, task, cause, ctx());
      // What the shard does next: catch-ups fire (source misfire), or the pointer skips ahead.
      for (let i = 0; i < 200; i++) {
        const p = nextPointer(task, now);
        if (!p || p.source !== "misfire" || p.slotMs === null) break;
        ledger.recordSlot(write, task, tr.id, p.slotMs, { outcome: "catch-up", runId: `c${step}.${i}` }, ctx());
        if (p.slotMs > (task.triggerSlots[key] ?? -Infinity)) task.triggerSlots = { ...task.triggerSlots, [key]: p.slotMs };
      }
    }
    store(rows, write);
  }
  return { tr, task, rows, runs, misfire };
}

describe("ledger module: completeness against a slow reference", () => {
  for (const seed of [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181, 6765, 10946]) {
    it(`seed ${seed}: every slot up to the watermark is a run or in exactly one interval`, () => {
      const { tr, task, rows, runs } = simulate(seed);
      const w = ledger.watermark(task.triggerSlots, tr.id);
      if (w === null) return;
      const all = referenceSlots(tr, w);
      const seen = new Map<number, string>();
      const mark = (s: number, what: string) => {
        expect(seen.has(s), `slot ${new Date(s).toISOString()} accounted twice: ${seen.get(s)} and ${what}`).toBe(false);
        seen.set(s, what);
      };
      for (const s of runs) mark(s, "run");
      for (const iv of rows) {
        const slots = expand(tr, iv);
        expect(slots.length, `interval ${iv.reason} ${new Date(iv.fromMs).toISOString()}..${new Date(iv.toMs).toISOString()}`).toBe(iv.count);
        for (const s of slots) mark(s, iv.reason);
      }
      for (const s of all) expect(seen.has(s), `slot ${new Date(s).toISOString()} not accounted`).toBe(true);
      expect(seen.size).toBe(all.length);
    });
  }
});

describe("ledger module: intervals", () => {
  it("a 1-second task paused for a week is one row of 604,800 slots", () => {
    const tr: TriggerRow = { id: 3, kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs: 1000, anchorMs: T0 }, enabled: true };
    const task = taskWith(tr, "once");
    const out: LedgerInsert[] = [];
    const week = 7 * 86_400_000;
    ledger.recordMisfireGap(out, task, { kind: "paused", pausedAtMs: T0, resumedAtMs: T0 + week + 500 }, { node: "n", shard: 0, epoch: 1, now: T0 + week + 500 });
    expect(out).toHaveLength(1);
    // misfire=once: the catch-up stands for every slot up to now, the last one included.
    expect(out[0]).toMatchObject({ reason: "paused", fromMs: T0 + 1000, toMs: T0 + week, count: 604_800, details: { catchUpSlotMs: T0 + week } });
  });

  it("consecutive overlap skips while one run is in flight extend one row, across writes", () => {
    const tr: TriggerRow = { id: 3, kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs: 1000, anchorMs: T0 }, enabled: true };
    const task = taskWith(tr, "once");
    const rows: LedgerInsert[] = [];
    const ctx = { node: "n", shard: 0, epoch: 1, now: T0 };
    const w0: LedgerInsert[] = [];
    ledger.recordSlot(w0, task, 3, T0 + 1000, { outcome: "run", runId: "r1" }, ctx);
    store(rows, w0);
    for (let i = 2; i <= 6; i++) {
      const w: LedgerInsert[] = [];
      ledger.recordSlot(w, task, 3, T0 + i * 1000, { outcome: "overlap", runId: `s${i}`, runningRunId: "r1" }, ctx);
      store(rows, w);
    }
    const w: LedgerInsert[] = [];
    ledger.recordSlot(w, task, 3, T0 + 7000, { outcome: "overlap", runId: "s7", runningRunId: "r7" }, ctx);
    store(rows, w);
    expect(rows.map((r) => [r.reason, r.count, r.mergeKey])).toEqual([["overlap", 5, "r:r1"], ["overlap", 1, "r:r7"]]);
  });

  it("a slot at or before the watermark changes nothing (a catch-up for slots already recorded)", () => {
    const tr: TriggerRow = { id: 3, kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs: 1000, anchorMs: T0 }, enabled: true };
    const task = taskWith(tr, "once");
    const out: LedgerInsert[] = [];
    ledger.recordMisfireGap(out, task, { kind: "behind" }, { node: "n", shard: 0, epoch: 1, now: T0 + 10_500 });
    expect(out).toMatchObject([{ reason: "collapsed", count: 10 }]);
    expect(ledger.recordSlot(out, task, 3, T0 + 10_000, { outcome: "catch-up", runId: "c" }, { node: "n", shard: 0, epoch: 1, now: T0 + 10_500 })).toBe(false);
    expect(out).toHaveLength(1);
  });

  it("misfire=skip records the skipped slots and leaves the one the cadence resumes at", () => {
    const tr: TriggerRow = { id: 3, kind: "cron", spec: { kind: "cron", expr: "*/10 * * * * *", tz: "UTC" }, enabled: true };
    const task = taskWith(tr, "skip");
    const out: LedgerInsert[] = [];
    const now = T0 + 65_000;
    ledger.recordMisfireGap(out, task, { kind: "outage", acquiredMs: now, node: "n2", epoch: 4, lastOwner: "n1", lastEpoch: 3, lastOwnerSinceMs: T0 }, { node: "n2", shard: 0, epoch: 4, now });
    expect(out).toMatchObject([{ reason: "outage", fromMs: T0 + 10_000, toMs: T0 + 60_000, count: 6, details: { resumesAtMs: T0 + 70_000, lastOwner: "n1" } }]);
    expect(nextPointer(task, now)?.slotMs).toBe(T0 + 70_000);
  });
});

describe("ledger module: one-shot tasks", () => {
  const at = T0 + 5_000;
  const once = (): TriggerRow => ({ id: 4, kind: "once", spec: { kind: "once", atMs: at }, enabled: true });
  const causes: ledger.GapCause[] = [
    { kind: "behind" },
    { kind: "paused", pausedAtMs: T0, resumedAtMs: at + 60_000 },
    { kind: "outage", acquiredMs: at + 60_000, node: "n2", epoch: 2, lastOwner: "n1", lastEpoch: 1, lastOwnerSinceMs: T0 },
  ];

  it("a one-shot whose slot is accounted (run, or recorded as a non-run) records nothing more, whatever the cause, and keeps its watermark", () => {
    for (const cause of causes) {
      for (const fate of [{ outcome: "run", runId: "r" }, { outcome: "overlap", runId: "s", runningRunId: "r0" }] as const) {
        const task = taskWith(once(), "once");
        expect(ledger.recordSlot([], task, 4, at, fate, { node: "n", shard: 0, epoch: 1, now: at })).toBe(true);
        const slots = { ...task.triggerSlots };
        const out: LedgerInsert[] = [];
        ledger.recordMisfireGap(out, task, cause, { node: "n", shard: 0, epoch: 1, now: at + 60_000 });
        expect(out, `${cause.kind} after ${fate.outcome}`).toEqual([]);
        expect(task.triggerSlots).toEqual(slots);
      }
    }
  });

  it("a one-shot whose slot passed unaccounted (never decided, or a watermark before it) is recorded with the cause", () => {
    for (const cause of causes) {
      for (const w of [undefined, T0 + 1_000]) {
        const task = taskWith(once(), "skip");
        if (w !== undefined) task.triggerSlots = { "w:4": w };
        const out: LedgerInsert[] = [];
        ledger.recordMisfireGap(out, task, cause, { node: "n", shard: 0, epoch: 1, now: at + 60_000 });
        expect(out, `${cause.kind}, watermark ${w}`).toMatchObject([{ triggerId: 4, fromMs: at, toMs: at, count: 1 }]);
        expect(ledger.watermark(task.triggerSlots, 4)).toBe(at);
      }
    }
  });
});

describe("ledger module: the shortcut of recordMisfireGap against the full walk", () => {
  const kinds: Array<(r: () => number) => TriggerRow> = [
    ...TRIGGERS.map((f) => () => f()),
    (r) => ({ id: 7, kind: "once", spec: { kind: "once", atMs: T0 + Math.floor(r() * 60_000) }, enabled: true }),
    (r) => ({ id: 7, kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs: 1000 + Math.floor(r() * 9000), anchorMs: T0 + Math.floor(r() * 1000) }, enabled: true }),
  ];
  const causes: ledger.GapCause[] = [
    { kind: "behind" }, { kind: "paused", pausedAtMs: T0, resumedAtMs: T0 + 1 },
    { kind: "outage", acquiredMs: T0, node: "n2", epoch: 2, lastOwner: "n1", lastEpoch: 1, lastOwnerSinceMs: T0 },
  ];
  it("records the same intervals and moves the watermark the same way, on 3,000 random states (fixed seed)", () => {
    const rnd = mulberry32(4242);
    let shortcuts = 0;
    for (let i = 0; i < 3000; i++) {
      const tr = kinds[Math.floor(rnd() * kinds.length)]!(rnd);
      const task = taskWith(tr, (["once", "skip", "all"] as const)[Math.floor(rnd() * 3)]!);
      const now = T0 + Math.floor(rnd() * 120_000);
      // A watermark near now (either side), sometimes none; the last fired slot at or before it.
      if (rnd() < 0.85) {
        const w = now + Math.floor((rnd() - 0.7) * 20_000);
        task.triggerSlots = { "w:7": w, ...(rnd() < 0.7 ? { "7": w - Math.floor(rnd() * 3) * 1000 } : {}) };
      }
      const cause = causes[Math.floor(rnd() * causes.length)]!;
      const ctx = { node: "n", shard: 0, epoch: 1, now };
      const a = { ...task, triggerSlots: { ...task.triggerSlots } }; const b = { ...task, triggerSlots: { ...task.triggerSlots } };
      const outA: LedgerInsert[] = []; const outB: LedgerInsert[] = [];
      ledger.recordMisfireGap(outA, a, cause, ctx);
      ledger.recordMisfireGap(outB, b, cause, ctx, { alwaysWalk: true });
      expect(outA, `state ${i}: ${JSON.stringify({ spec: tr.spec, slots: task.triggerSlots, now, misfire: task.misfire })}`).toEqual(outB);
      expect(a.triggerSlots).toEqual(b.triggerSlots);
      if (!outB.length) shortcuts++;
    }
    // Both kinds of state were drawn: many with nothing to record, and many with an interval.
    expect(shortcuts).toBeGreaterThan(500);
    expect(shortcuts).toBeLessThan(2900);
  });
});

describe("deploy/prometheus/ax-ledger-rules.yml", () => {
  it("parses, uses ax_slots_total with every outcome the ledger knows, and never counts paused or excluded slots as failures", async () => {
    const { parse } = await import("yaml");
    const { readFileSync } = await import("node:fs");
    const doc = parse(readFileSync("deploy/prometheus/ax-ledger-rules.yml", "utf8")) as { groups: Array<{ rules: Array<{ alert?: string; record?: string; expr: string }> }> };
    const rules = doc.groups.flatMap((g) => g.rules);
    expect(rules.filter((r) => r.alert).map((r) => r.alert)).toContain("AxSlotsNotFiring");
    const failing = /outcome=~"([^"]+)"/;
    for (const r of rules) {
      expect(r.expr).toMatch(/ax_slots_total|ax:slots_not_fired/);
      for (const m of r.expr.matchAll(new RegExp(failing, "g"))) {
        const outcomes = m[1]!.split("|");
        expect(outcomes).not.toContain("paused");
        expect(outcomes).not.toContain("excluded");
        for (const o of outcomes) expect([...ledger.NON_RUN_REASONS, "run"]).toContain(o);
      }
    }
  });
});
