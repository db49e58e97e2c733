import { describe, expect, it } from "vitest";
import { fullRecord, storedRecord } from "../../actors/store/recordCodec.ts";
import { applyEvent, initialRecord, type TaskEvent, type TaskRecord } from "../../actors/machine/index.ts";

describe("the task record as a row stores it", () => {
  it("every record a run's life produces reads back equal from its stored form and the row's columns", () => {
    // A walk through the machine: fire, fail, retry, fire again, pause a running task, force, complete.
    const events: TaskEvent[] = [
      { type: "FIRE", runId: "r1", source: "rate" }, { type: "FAILED", runId: "r1", error: "boom" },
      { type: "FIRE", runId: "r2", source: "retry" }, { type: "PAUSE" }, { type: "SUCCEEDED", runId: "r2" },
      { type: "FIRE", runId: "r3", source: "manual", force: true }, { type: "SUCCEEDED", runId: "r3" }, { type: "RESUME" },
      { type: "FIRE", runId: "r4", source: "rate" }, { type: "CANCEL" },
    ];
    for (const overlap of ["forbid", "allow"] as const) {
      let rec: TaskRecord = initialRecord({ maxAttempts: 3, overlap });
      const seen: TaskRecord[] = [rec];
      for (const ev of events) {
        const res = applyEvent(rec, ev);
        if (res.ok) { rec = res.record; seen.push(rec); }
      }
      expect(seen.length).toBeGreaterThan(6);
      for (const r of seen) {
        const stored = JSON.parse(JSON.stringify(storedRecord(r))) as unknown;
        expect(fullRecord(stored, r.value, overlap, 3)).toEqual(r);
      }
    }
  });

  it("an idle task stores {}, a running one its run ids; the older full form is read as it is", () => {
    const fresh = initialRecord({ maxAttempts: 1, overlap: "forbid" });
    expect(storedRecord(fresh)).toEqual({});
    expect(JSON.stringify(storedRecord(fresh)).length).toBeLessThan(JSON.stringify(fresh).length / 10);
    const running = { ...fresh, value: "running" as const, context: { ...fresh.context, attempt: 1, inFlight: ["r9"], lastRunId: "r9" } };
    expect(storedRecord(running)).toEqual({ a: 1, f: ["r9"], r: "r9" });
    expect(fullRecord(running, "ignored", "allow", 7)).toBe(running);
    expect(storedRecord(null)).toEqual({});
  });
});
