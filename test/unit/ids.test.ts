import { describe, expect, it } from "vitest";
import { derivedRunId, newRunId } from "../../protocol/index.ts";

describe("run ids", () => {
  it("are unique within one millisecond and sort by creation time", () => {
    const ms = Date.UTC(2026, 11, 3);
    const same = new Set(Array.from({ length: 200_000 }, () => newRunId(ms)));
    expect(same.size).toBe(200_000);
    const earlier = newRunId(ms); const later = newRunId(ms + 1);
    expect(earlier < later).toBe(true);
    expect(earlier).toMatch(/^r[0-9a-z]+$/);
  });

  it("derived ids are stable for one cause and differ between causes", () => {
    expect(derivedRunId("rd", "7:k1")).toBe(derivedRunId("rd", "7:k1"));
    expect(derivedRunId("rd", "7:k1")).not.toBe(derivedRunId("rd", "7:k2"));
  });
});
