import { describe, expect, it } from "vitest";
import { InvalidInputError } from "../../common/index.ts";
import { parseTaskSpec } from "../../ops/api.ts";

const NOW = Date.parse("2026-03-01T00:00:00Z");
const refusal = (raw: Record<string, unknown>): InvalidInputError => {
  try { parseTaskSpec(raw, NOW); } catch (e) { expect(e).toBeInstanceOf(InvalidInputError); return e as InvalidInputError; }
  throw new Error("expected a refusal");
};

describe("task.create: the DST policy of a cron task", () => {
  it("is stored in the trigger spec and shapes the first due time", () => {
    const base = { name: "report", executor: "reports", cron: "30 2 8 3 *", tz: "America/New_York" };
    // 2026-03-08 02:30 does not exist in New York: shift fires 07:30Z, transition 07:00Z, skip a year later.
    expect(parseTaskSpec(base, NOW).task.nextDueMs).toBe(Date.parse("2026-03-08T07:30:00Z"));
    const tr = parseTaskSpec({ ...base, dstGap: "transition" }, NOW).task;
    expect(tr.triggers[0]!.spec).toEqual({ kind: "cron", expr: "30 2 8 3 *", tz: "America/New_York", dstGap: "transition" });
    expect(tr.nextDueMs).toBe(Date.parse("2026-03-08T07:00:00Z"));
    expect(parseTaskSpec({ ...base, dstGap: "skip", dstRepeat: "both" }, NOW).task.nextDueMs).toBe(Date.parse("2027-03-08T07:30:00Z"));
  });

  it("refusals name the field", () => {
    expect(refusal({ name: "a", executor: "e", cron: "0 2 * * *", dstGap: "later" }).field).toBe("dstGap");
    expect(refusal({ name: "a", executor: "e", cron: "0 2 * * *", dstRepeat: "twice" }).field).toBe("dstRepeat");
    expect(refusal({ name: "a", executor: "e", every: "1h", dstRepeat: "both" }).field).toBe("dstRepeat");
    expect(refusal({ name: "a", executor: "e", after: ["b"], dstGap: "skip" }).field).toBe("dstGap");
  });
});
