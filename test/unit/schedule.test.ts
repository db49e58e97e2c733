import { describe, expect, it } from "vitest";
import { TriggerStuckError, backoffMs, compileTrigger, isTriggerStuck, nextPointer, type CompiledTrigger, type TaskRow, type TriggerRow, type TriggerSpec } from "../../actors/index.ts";

type T = Pick<TaskRow, "triggers" | "triggerSlots" | "misfire" | "createdMs">;
const rate = (everyMs: number, anchorMs: number, misfire: T["misfire"] = "once", slots: Record<string, number> = {}): T => ({
  triggers: [{ id: 1, kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs, anchorMs }, enabled: true }], triggerSlots: slots, misfire, createdMs: anchorMs,
});

describe("next pointer", () => {
  it("follows the scheduled slot, not now", () => {
    const p = nextPointer(rate(1000, 0, "once", { "1": 5000 }), 5400)!;
    expect(p).toMatchObject({ dueMs: 6000, slotMs: 6000, source: "rate", triggerId: 1 });
  });
  it("after downtime, misfire=once fires one catch-up standing for every slot up to now", () => {
    const p = nextPointer(rate(1000, 0, "once", { "1": 5000 }), 20_500)!;
    expect(p).toMatchObject({ dueMs: 20_500, slotMs: 20_000, source: "misfire" });
    expect(p.reason).toMatch(/catch-up/);
    // after it fired, the cadence resumes strictly after now
    expect(nextPointer(rate(1000, 0, "once", { "1": 20_000 }), 20_510)).toMatchObject({ dueMs: 21_000, source: "rate" });
  });
  it("misfire=skip resumes the cadence without a run", () => {
    const p = nextPointer(rate(1000, 0, "skip", { "1": 5000 }), 20_500)!;
    expect(p.source).toBe("rate");
    expect(p.dueMs).toBeGreaterThan(20_500 - 1000);
    expect(p.reason).toMatch(/missed/);
  });
  it("misfire=all fires the missed slots one at a time", () => {
    const p = nextPointer(rate(1000, 0, "all", { "1": 5000 }), 9_500)!;
    expect(p).toMatchObject({ source: "misfire", slotMs: 6000 });
  });
  it("fixed delay counts from completion and waits while running", () => {
    const t: T = { triggers: [{ id: 2, kind: "fixed_delay", spec: { kind: "fixed_delay", delayMs: 500 }, enabled: true }], triggerSlots: {}, misfire: "once", createdMs: 1000 };
    expect(nextPointer(t, 1000)).toMatchObject({ dueMs: 1500, source: "delay" });
    expect(nextPointer({ ...t, triggerSlots: { "2": 1500 } }, 1600)).toBeNull();
    expect(nextPointer({ ...t, triggerSlots: { "2": 1500 } }, 4000, { completedMs: 3900 })).toMatchObject({ dueMs: 4400 });
  });
  it("picks the earliest of several triggers and ignores disabled ones", () => {
    const t: T = { ...rate(1000, 0), triggers: [...rate(1000, 0).triggers, { id: 3, kind: "once", spec: { kind: "once", atMs: 300 }, enabled: true }, { id: 4, kind: "once", spec: { kind: "once", atMs: 100 }, enabled: false }] };
    expect(nextPointer(t, 0)).toMatchObject({ dueMs: 300, triggerId: 3, source: "once" });
  });
});

describe("one-shot triggers", () => {
  const once = (atMs: number, slots: Record<string, number>): T => ({ triggers: [{ id: 7, kind: "once", spec: { kind: "once", atMs }, enabled: true }], triggerSlots: slots, misfire: "once", createdMs: 0 });
  const broken = (): CompiledTrigger => { throw new Error("compiled"); };

  it("a fired one-shot has no next pointer, answered without compiling it", () => {
    expect(nextPointer(once(5000, { "7": 5000 }), 6000, { compile: broken })).toBeNull();
    expect(nextPointer(once(5000, { "7": 5000 }), 1000, { compile: broken })).toBeNull();
  });

  it("300 random one-shots: the answer is the full computation's (seed 3)", () => {
    let x = 3;
    const rnd = () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x / 2 ** 32; };
    for (let i = 0; i < 300; i++) {
      const atMs = 10_000 + Math.floor(rnd() * 10_000);
      const now = Math.floor(rnd() * 30_000);
      const slot = [undefined, atMs, atMs - 1 - Math.floor(rnd() * 5000), atMs + 1 + Math.floor(rnd() * 5000)][Math.floor(rnd() * 4)];
      const slots: Record<string, number> = slot === undefined ? {} : { "7": slot };
      let compiled = 0;
      const counting = (tr: TriggerRow): CompiledTrigger => { compiled++; return compileTrigger(tr.spec as TriggerSpec); };
      const got = nextPointer(once(atMs, slots), now, { compile: counting });
      if (slot !== undefined && slot >= atMs) { expect(got).toBeNull(); expect(compiled).toBe(0); continue; }
      // Not fired yet: planned as before (its own slot, or a catch-up for it once it has passed).
      expect(compiled).toBe(1);
      expect(got).not.toBeNull();
      expect(got!.slotMs).toBe(atMs);
    }
  });
});

describe("a trigger that does not advance never hangs nextPointer", () => {
  const cronTask = (slots: Record<string, number> = {}, misfire: T["misfire"] = "once"): T & { id: number } => ({
    id: 42, triggers: [{ id: 7, kind: "cron", spec: { kind: "cron", expr: "*/15 * * * *", tz: "Pacific/Chatham" }, enabled: true }],
    triggerSlots: slots, misfire, createdMs: Date.parse("2026-04-04T12:00:00Z"),
  });
  /** The bug of issue 13: from 13:00Z the next slot came back as 12:15Z. */
  const backwards = (real: CompiledTrigger): CompiledTrigger => ({
    spec: real.spec, describe: () => real.describe(), explain: (a, s) => real.explain(a, s),
    next: (after) => (after >= Date.parse("2026-04-04T13:00:00Z") ? Date.parse("2026-04-04T12:15:00Z") : real.next(after)),
  });
  const stuckOf = (fn: () => unknown): TriggerStuckError => {
    try { fn(); } catch (e) { expect(isTriggerStuck(e)).toBe(true); return e as TriggerStuckError; }
    throw new Error("expected a TriggerStuckError");
  };
  const compileWith = (wrap: (t: CompiledTrigger) => CompiledTrigger) => ({ compile: (tr: { spec: unknown }) => wrap(compileTrigger(tr.spec as never)) });

  it("a slot earlier than asked: typed failure naming the task, the trigger and the instants", () => {
    const now = Date.parse("2026-04-04T13:00:00.500Z");
    for (const misfire of ["once", "skip", "all"] as const) {
      const e = stuckOf(() => nextPointer(cronTask({ "7": Date.parse("2026-04-04T13:00:00Z") }, misfire), now, compileWith(backwards)));
      expect(e.code).toBe("AX_E_TRIGGER_STUCK");
      expect([e.taskId, e.triggerId, e.afterMs, e.returned]).toEqual([42, 7, Date.parse("2026-04-04T13:00:00Z"), Date.parse("2026-04-04T12:15:00Z")]);
      expect(e.message).toContain("task 42: trigger 7");
      expect(e.message).toContain("did not advance: next(2026-04-04T13:00:00.000Z) returned 2026-04-04T12:15:00.000Z");
      expect(e.toJSON()).toMatchObject({ code: "AX_E_TRIGGER_STUCK", field: "trigger", value: { taskId: 42, triggerId: 7 } });
    }
  });

  it("inside the misfire=once catch-up walk (the loop that used to spin forever)", () => {
    // Down from 12:00Z to 13:00:00.5Z: the catch-up is the 12:45Z slot and the walk to now asks next(13:00Z).
    const e = stuckOf(() => nextPointer(cronTask({ "7": Date.parse("2026-04-04T12:00:00Z") }), Date.parse("2026-04-04T13:00:00.500Z"), compileWith(backwards)));
    expect(e.afterMs).toBe(Date.parse("2026-04-04T13:00:00Z"));
  });

  it("a slot equal to its argument, NaN, or a thrown error", () => {
    const now = Date.parse("2026-04-04T13:00:00.500Z");
    const task = cronTask({ "7": Date.parse("2026-04-04T12:45:00Z") });
    const same = stuckOf(() => nextPointer(task, now, compileWith((t) => ({ ...t, spec: t.spec, describe: () => t.describe(), explain: t.explain, next: (a) => a }))));
    expect(same.returned).toBe(Date.parse("2026-04-04T12:45:00Z"));
    const nan = stuckOf(() => nextPointer(task, now, compileWith((t) => ({ spec: t.spec, describe: () => t.describe(), explain: t.explain, next: () => Number.NaN }))));
    expect(nan.message).toContain("returned NaN");
    const boom = stuckOf(() => nextPointer(task, now, compileWith((t) => ({ spec: t.spec, describe: () => t.describe(), explain: t.explain, next: () => { throw new Error("boom"); } }))));
    expect(boom.message).toContain("failed: boom");
    expect((boom.cause as Error).message).toBe("boom");
  });

  it("a stored spec that no longer compiles is the same typed failure", () => {
    const task: T & { id: number } = { ...cronTask(), triggers: [{ id: 9, kind: "cron", spec: { kind: "cron", expr: "61 * * * *", tz: "UTC" }, enabled: true }] };
    const e = stuckOf(() => nextPointer(task, Date.parse("2026-04-04T13:00:00Z")));
    expect([e.taskId, e.triggerId]).toEqual([42, 9]);
    expect(e.message).toContain("minute field");
  });

  it("with the real arithmetic the Chatham task of issue 13 just moves on", () => {
    const p = nextPointer(cronTask({ "7": Date.parse("2026-04-04T13:00:00Z") }), Date.parse("2026-04-04T13:00:00.500Z"))!;
    expect(p).toMatchObject({ dueMs: Date.parse("2026-04-04T13:15:00Z"), source: "cron", triggerId: 7 });
  });
});

describe("backoff", () => {
  it("doubles per attempt, is capped, and jitters within [d/2, d]", () => {
    expect(backoffMs(1, 1000, 60_000, () => 0)).toBe(500);
    expect(backoffMs(1, 1000, 60_000, () => 1)).toBe(1000);
    expect(backoffMs(3, 1000, 60_000, () => 1)).toBe(4000);
    expect(backoffMs(20, 1000, 60_000, () => 1)).toBe(60_000);
    expect(backoffMs(5, 0, 60_000)).toBe(0);
  });
});
