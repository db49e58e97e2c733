import { describe, expect, it } from "vitest";
import { HoldClock, MAX_TRANSIT_CREDIT_MS } from "../../protocol/index.ts";

/** mulberry32: the same cases on every run. */
function rng(seed: number): () => number {
  let s = seed;
  return () => { s = (s + 0x6d2b79f5) | 0; let t = s; t = Math.imul(t ^ (t >>> 15), t | 1); t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
}

/**
 * A simulated node and executor on one timeline (the executor's monotonic clock): the node's wall
 * clock reads mono + skew(mono); a message sent at mono `t` arrives after a random transit and
 * carries runs due 0-300 ms after it was sent. Checked for each run: the node's clock at the
 * run's start against its due time.
 */
function simulate(seed: number, skewAt: (mono: number) => number, messages = 3000): { earliestMs: number; meanCreditMs: number; straddlingEarliestMs: number } {
  const rand = rng(seed);
  const hc = new HoldClock();
  let mono = 1_000_000;
  let earliest = Infinity; let credits = 0;
  // Runs held across a change of the node's clock, apart: their due time was set on the clock before it.
  let straddling = Infinity;
  for (let i = 0; i < messages; i++) {
    mono += rand() * 40; // up to 40 ms between messages
    // Date.now() reads whole milliseconds, rounded down.
    const sentAt = Math.floor(mono + skewAt(mono));
    // Mostly quick, sometimes a long transit (a busy server, a paused executor).
    const transit = rand() < 0.9 ? rand() * 3 : rand() * 200;
    const received = mono + transit;
    const credit = hc.creditFor("n1", sentAt, received);
    credits += credit;
    expect(credit).toBeGreaterThanOrEqual(0);
    expect(credit).toBeLessThanOrEqual(MAX_TRANSIT_CREDIT_MS);
    for (let r = 0; r < 3; r++) {
      const firedAt = sentAt + Math.round(rand() * 300);
      // Never before it arrived: a run already due starts at once.
      const start = Math.max(received, HoldClock.startAt(firedAt, sentAt, received, credit));
      const early = start + skewAt(start) - firedAt;
      if (skewAt(start) !== skewAt(mono) && Math.abs(skewAt(start) - skewAt(mono)) > 1) straddling = Math.min(straddling, early - (skewAt(start) - skewAt(mono)));
      else earliest = Math.min(earliest, early);
    }
  }
  return { earliestMs: earliest, meanCreditMs: credits / messages, straddlingEarliestMs: straddling };
}

describe("HoldClock: when a run sent ahead starts", () => {
  it("never before its due time on the node's clock, whatever the constant skew (seeded property)", () => {
    for (let seed = 1; seed <= 20; seed++) {
      const skew = (rng(seed * 7919)() - 0.5) * 3_600_000; // up to half an hour either way
      const { earliestMs, meanCreditMs } = simulate(seed, () => skew);
      expect(earliestMs, `seed ${seed}, skew ${skew}`).toBeGreaterThanOrEqual(-1e-6);
      // The long transits are credited back (otherwise it is the plain rule).
      expect(meanCreditMs).toBeGreaterThan(0);
    }
  });

  it("a node clock stepping forward never makes a run early; stepping back, at most MAX_TRANSIT_CREDIT_MS early", () => {
    for (let seed = 1; seed <= 10; seed++) {
      const forward = simulate(seed, (m) => (m > 1_030_000 ? 5_000 : 0));
      expect(forward.earliestMs).toBeGreaterThanOrEqual(-1e-6);
      const back = simulate(seed, (m) => (m > 1_030_000 ? -5_000 : 0));
      expect(back.earliestMs).toBeGreaterThanOrEqual(-MAX_TRANSIT_CREDIT_MS - 1e-6);
      // A run held while the step happened starts at its due time on the clock it was sent by
      // (README, Limits): before the step's own amount is taken off, never early.
      expect(back.straddlingEarliestMs).toBeGreaterThanOrEqual(-1e-6);
      // A drift of the node's clock (NTP slewing at 500 ppm) stays within the same bound.
      const drift = simulate(seed, (m) => Math.round(-(m - 1_000_000) * 0.0005));
      expect(drift.earliestMs).toBeGreaterThanOrEqual(-MAX_TRANSIT_CREDIT_MS - 1e-6);
    }
  });

  it("credits exactly the transit beyond the quickest one seen from that node lately", () => {
    const hc = new HoldClock();
    expect(hc.creditFor("a", 1000, 5002)).toBe(0); // first message: nothing to compare with
    expect(hc.creditFor("a", 1010, 5015)).toBe(3); // 5 ms against the quickest 2
    expect(hc.creditFor("a", 1020, 5050)).toBe(MAX_TRANSIT_CREDIT_MS); // 30 ms, capped
    expect(hc.creditFor("b", 1020, 9050)).toBe(0); // another node's clock: its own reference
    // The next window still compares with the last one's quickest (2 ms)...
    expect(hc.creditFor("a", 11_020, 15_050)).toBe(MAX_TRANSIT_CREDIT_MS);
    expect(hc.creditFor("a", 11_040, 15_045)).toBe(3);
    expect(hc.creditFor("a", 31_000, 35_045)).toBe(MAX_TRANSIT_CREDIT_MS); // against the previous window's 5
    // ...but after two windows without a message nothing of before is kept.
    expect(hc.creditFor("a", 60_000, 64_045)).toBe(0);
  });
});
