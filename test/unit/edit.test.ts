import { describe, expect, it } from "vitest";
import { initialRecord, type TaskRow } from "../../actors/index.ts";
import { applyDefinitionChange } from "../../actors/shard/update.ts";
import { canonicalJson, declaredTask, nextTimes, sameTrigger } from "../../ops/taskSpec.ts";
import { topoOrder } from "../../ops/taskEditor.ts";
import { parseTaskSpec } from "../../ops/api.ts";

const NOW = Date.parse("2026-06-01T10:00:00Z");

function row(over: Partial<TaskRow> = {}): TaskRow {
  return {
    id: 7, name: "t", executor: "ex", payload: { b: 1, a: [1, { z: 1, y: 2 }] }, timeoutMs: 90_000, maxAttempts: 3, backoffMs: 1000, backoffMaxMs: 60_000,
    misfire: "once", overlap: "forbid", state: "pending", record: initialRecord({ maxAttempts: 3, overlap: "forbid" }), upstreams: [],
    nextDueMs: null, nextSlotMs: null, nextSource: null, nextReason: null, shard: 0, triggerSlots: { 1: NOW - 60_000 }, nextTriggerId: 1, nextCausedBy: null,
    createdMs: NOW - 86_400_000, updatedMs: NOW, triggers: [{ id: 1, kind: "cron", spec: { kind: "cron", expr: "*/5 * * * *", tz: "Europe/Paris", dstGap: "skip" }, enabled: true }],
    hasDownstreams: false, generation: 0, applySet: null, ...over,
  };
}

describe("declared tasks (export form)", () => {
  it("parse(declared(task)) gives back the same definition, for every trigger kind", () => {
    const specs = [
      { kind: "cron", expr: "*/5 * * * *", tz: "Europe/Paris", dstGap: "skip" },
      { kind: "fixed_rate", everyMs: 1500, anchorMs: NOW - 5000 },
      { kind: "fixed_delay", delayMs: 3_600_000 },
      { kind: "once", atMs: NOW + 60_000 },
    ];
    for (const spec of specs) {
      const r = row({ triggers: [{ id: 1, kind: spec.kind as "cron", spec, enabled: true }] });
      const d = declaredTask(r, ["up-b", "up-a"]);
      expect(d.after).toEqual(["up-a", "up-b"]);
      const p = parseTaskSpec(d as unknown as Record<string, unknown>, NOW);
      expect(sameTrigger(p.task.triggers[0]!.spec, spec), JSON.stringify(spec)).toBe(true);
      expect(p.task).toMatchObject({ executor: "ex", timeoutMs: 90_000, maxAttempts: 3, backoffMs: 1000, backoffMaxMs: 60_000, misfire: "once", overlap: "forbid" });
      expect(canonicalJson(p.task.payload)).toBe(canonicalJson(r.payload));
    }
  });

  it("canonical JSON ignores key order, not array order", () => {
    expect(canonicalJson({ b: 1, a: { d: [2, 1], c: null } })).toBe(canonicalJson({ a: { c: null, d: [2, 1] }, b: 1 }));
    expect(canonicalJson([1, 2])).not.toBe(canonicalJson([2, 1]));
  });

  it("next times: the next five of the trigger set after now", () => {
    const t = nextTimes([{ spec: { kind: "cron", expr: "0 2 * * *", tz: "UTC" } }], NOW, 5);
    expect(t).toEqual(["2026-06-02", "2026-06-03", "2026-06-04", "2026-06-05", "2026-06-06"].map((d) => `${d}T02:00:00.000Z`));
  });
});

describe("applyDefinitionChange", () => {
  it("a new trigger set forgets the old slots and counts cron and fixed-rate triggers from the update", () => {
    const r = row();
    const { unlinked } = applyDefinitionChange(r, {
      expectGeneration: 0, who: "t", summary: {},
      fields: { triggers: [{ id: 9, kind: "fixed_rate", spec: { kind: "fixed_rate", everyMs: 1000, anchorMs: NOW }, enabled: true }], timeoutMs: 5000, maxAttempts: 1, overlap: "allow", payload: null },
    }, NOW);
    expect(unlinked).toEqual([1]);
    expect(r.triggerSlots).toEqual({ 9: NOW });
    expect(r.triggers.map((t) => t.id)).toEqual([9]);
    expect(r).toMatchObject({ timeoutMs: 5000, maxAttempts: 1, overlap: "allow", payload: null, generation: 1, executor: "ex" });
    expect((r.record as { context: { maxAttempts: number; overlap: string } }).context).toMatchObject({ maxAttempts: 1, overlap: "allow" });
  });

  it("without triggers the schedule state is untouched", () => {
    const r = row();
    applyDefinitionChange(r, { expectGeneration: 0, who: "t", summary: {}, fields: { executor: "other" } }, NOW);
    expect(r.triggerSlots).toEqual({ 1: NOW - 60_000 });
    expect(r.payload).toEqual({ b: 1, a: [1, { z: 1, y: 2 }] });
    expect(r).toMatchObject({ executor: "other", generation: 1 });
  });
});

describe("topoOrder", () => {
  it("puts upstreams first and keeps the file's order otherwise", () => {
    const tasks = [{ name: "report", after: ["transform", "extract"] }, { name: "extract" }, { name: "transform", after: ["extract"] }, { name: "alone" }, { name: "x", after: ["outside"] }];
    expect(topoOrder(tasks).map((i) => tasks[i]!.name)).toEqual(["extract", "transform", "report", "alone", "x"]);
  });
});
