import { describe, expect, it } from "vitest";
import { RateWindow } from "../../common/index.ts";

describe("RateWindow", () => {
  it("counts events of the last span per second and forgets older ones", () => {
    const w = new RateWindow(5000, 100);
    for (let t = 0; t < 5000; t += 10) w.add(t); // 100 events/s for 5 s
    expect(w.perSecond(4999)).toBeCloseTo(100, 5);
    expect(w.perSecond(7550)).toBeCloseTo(100 * 2.4 / 5, 5); // only 2.5-5.0 s still counts (buckets 2600..4900)
    expect(w.perSecond(20_000)).toBe(0);
  });

  it("reuses a bucket slot for a new period instead of adding to the old count", () => {
    const w = new RateWindow(1000, 100);
    w.add(50, 7);
    w.add(1050, 3); // the same slot, one revolution later
    expect(w.perSecond(1060)).toBe(3);
  });
});
