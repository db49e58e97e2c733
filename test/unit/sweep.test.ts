import { describe, expect, it } from "vitest";
import { RateSearch, nextSweepRate, runAgain, sweepWarmUp } from "../../bench/sweep.ts";

describe("max-rate sweep (shared by ax and the BullMQ peer)", () => {
  it("grows by 1.5x while passing, halves until a pass, then bisects to within 10 %", () => {
    expect(nextSweepRate(6000, 6000, Infinity)).toBe(9000);
    expect(nextSweepRate(6000, 0, 6000)).toBe(3000);
    expect(nextSweepRate(9000, 6000, 9000)).toBe(7500);
    expect(nextSweepRate(6300, 6000, 6500)).toBeNull();
  });

  it("warms up at half the start rate for half a window, at most 5 s", () => {
    expect(sweepWarmUp(6000, 10)).toEqual({ rate: 3000, tasks: 15_000 });
    expect(sweepWarmUp(4000, 3)).toEqual({ rate: 2000, tasks: 3000 });
    expect(sweepWarmUp(1, 10)).toEqual({ rate: 1, tasks: 5 });
  });

  it("a step that fails on lateness alone runs once more; a correctness failure or a second failure counts", () => {
    const retried = new Set<number>();
    expect(runAgain(6000, true, retried)).toBe(true);
    expect(runAgain(6000, true, retried)).toBe(false); // its second failure counts
    expect(runAgain(9000, false, retried)).toBe(false); // lost, doubled or early: never retried
    expect(runAgain(9000, true, retried)).toBe(true);
  });

  it("RateSearch walks the same steps as nextSweepRate and runAgain by hand (a fixed sequence of outcomes)", () => {
    const search = new RateSearch(6000);
    const seen: Array<number | "again" | null> = [];
    // pass, fail on lateness (run again), fail again, pass, fail on correctness (never run again)
    const outcomes: Array<[boolean, boolean]> = [[true, true], [false, true], [false, true], [true, true], [false, false], [true, true], [true, true]];
    for (const [pass, correct] of outcomes) { const n = search.next(pass, correct); seen.push(n); if (n === null) break; }
    // 6000 ✓ → 9000; 9000 ✗ lateness → again; 9000 ✗ → bisect 7500; 7500 ✓ → 8250; 8250 ✗ correctness
    // (not run again) → bracket 7500..8250 is within 10 %: done
    expect(seen).toEqual([9000, "again", 7500, 8250, null]);
  });
});
