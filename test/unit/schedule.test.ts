import { describe, expect, it } from "vitest";
import { backoffMs, nextPointer, type TaskRow } from "../../actors/index.ts";

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

describe("backoff", () => {
  it("doubles per attempt, is capped, and jitters within [d/2, d]", () => {
    expect(backoffMs(1, 1000, 60_000, () => 0)).toBe(500);
    expect(backoffMs(1, 1000, 60_000, () => 1)).toBe(1000);
    expect(backoffMs(3, 1000, 60_000, () => 1)).toBe(4000);
    expect(backoffMs(20, 1000, 60_000, () => 1)).toBe(60_000);
    expect(backoffMs(5, 0, 60_000)).toBe(0);
  });
});
