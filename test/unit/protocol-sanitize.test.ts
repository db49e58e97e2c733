import { describe, expect, it } from "vitest";
import { DependencyTriggerSchema, EventBatchSchema, OutcomeBatchSchema, decode, encode } from "../../protocol/index.ts";

describe("protocol decode sanitises free text (attack: a U+0000 in an executor's error text or a trigger poisoned the shard's batch write)", () => {
  it("strips U+0000 from an executor's error message and type and cuts it at 4096 characters", () => {
    const d = decode(EventBatchSchema, encode({ v: 1, executor: "e", instance: "i", shard: 0,
      events: [{ type: "failed", runId: "r1", taskId: 1, at: 1, error: { message: `bo\u0000om${"x".repeat(10_000)}`, type: "E\u0000rr" } }] }));
    expect(d.ok).toBe(true);
    if (!d.ok) return;
    const err = d.value.events[0]!.error!;
    expect(err.message.startsWith("boom")).toBe(true);
    expect(err.message).not.toContain("\u0000");
    expect(err.message.length).toBe(4096);
    expect(err.type).toBe("Err");
  });
  it("strips U+0000 from trigger and outcome reasons; a run id with a NUL or control character is refused", () => {
    const t = decode(DependencyTriggerSchema, encode({ v: 1, kind: "due", taskId: 1, key: "k\u0000", upstreamRuns: ["r1"], reason: "up\u0000stream", at: 1 }));
    expect(t.ok && t.value.reason === "upstream" && t.value.key === "k").toBe(true);
    const o = decode(OutcomeBatchSchema, encode({ v: 1, outcomes: [{ taskId: 1, runId: "r1", outcome: "failed", at: 1, reason: "a\u0000" }] }));
    expect(o.ok && o.value.outcomes[0]!.reason === "a").toBe(true);
    expect(decode(EventBatchSchema, encode({ v: 1, executor: "e", instance: "i", shard: 0, events: [{ type: "completed", runId: "r\u00001", taskId: 1, at: 1 }] })).ok).toBe(false);
    expect(decode(DependencyTriggerSchema, encode({ v: 1, kind: "due", taskId: 1, key: "k", upstreamRuns: ["r\n1"], reason: "", at: 1 })).ok).toBe(false);
  });
});
