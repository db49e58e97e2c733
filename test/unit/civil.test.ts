import { describe, expect, it } from "vitest";
import { isoUtc } from "../../actors/triggers/zone.ts";
import { parseIsoInstant, parseIsoInstantSlow } from "../../actors/triggers/parse.ts";
import { rng } from "./cron-reference.ts";

const YEAR_10000_MS = 253_402_300_800_000;
const YEAR_0_MS = -62_167_219_200_000;

/** What a call returned or threw, comparable with toEqual. */
function outcome(f: () => unknown): unknown {
  try { return { ok: f() }; } catch (e) { return { threw: e instanceof Error ? `${e.constructor.name}: ${e.message}` : String(e) }; }
}

describe("isoUtc", () => {
  it("writes what Date#toISOString writes, for 200k instants across and beyond its fast range", () => {
    const r = rng(20261206);
    const edges = [0, 1, 999, 1000, 86_399_999, 86_400_000, YEAR_10000_MS - 1, YEAR_10000_MS, YEAR_10000_MS + 1, -1, -86_400_001, YEAR_0_MS,
      Date.UTC(2000, 1, 29), Date.UTC(2100, 2, 1) - 1, Date.UTC(2400, 1, 29, 23, 59, 59, 999), 1.5, -0.5, 8.64e15, NaN, Infinity];
    const values = [...edges];
    for (let i = 0; i < 200_000; i++) {
      const span = i % 4 === 0 ? 2 * YEAR_10000_MS : YEAR_10000_MS; // a quarter beyond the fast range (negative, six-digit years)
      values.push(Math.floor(r() * span) - (i % 4 === 0 ? YEAR_10000_MS / 2 : 0));
    }
    for (const ms of values) expect(outcome(() => isoUtc(ms)), String(ms)).toEqual(outcome(() => new Date(ms).toISOString()));
  });
});

describe("parseIsoInstant", () => {
  const r = rng(4242);
  /** A time string near the canonical form: mostly toISOString's, with one part out of range or mangled in many. */
  function candidate(): string {
    const ms = YEAR_0_MS + Math.floor(r() * (YEAR_10000_MS - YEAR_0_MS));
    let s = new Date(ms).toISOString();
    if (r() < 0.3) s = s.slice(0, 19) + "Z";
    const k = r();
    if (k < 0.35) return s;
    const at = (i: number, t: string) => s.slice(0, i) + t + s.slice(i + t.length);
    const two = () => String(Math.floor(r() * 100)).padStart(2, "0");
    if (k < 0.45) return at(8, ["29", "30", "31", "00", two()][Math.floor(r() * 5)]!); // day against its month
    if (k < 0.5) return at(5, ["00", "02", "13", two()][Math.floor(r() * 4)]!);
    if (k < 0.55) return at(11, ["23", "24", two()][Math.floor(r() * 3)]!);
    if (k < 0.6) return at(14 + 3 * Math.floor(r() * 2), ["59", "60", two()][Math.floor(r() * 3)]!);
    if (k < 0.65) return s.toLowerCase();
    if (k < 0.7) return ` ${s} `;
    if (k < 0.75) return s.replace("Z", ["+08:00", "-0530", "+18:00", "+18:01", ""][Math.floor(r() * 5)]!);
    if (k < 0.8) return s.replace(/\.\d+/, ["", ".5", ".12", ".123456", ",250"][Math.floor(r() * 5)]!);
    const i = Math.floor(r() * s.length); // one character replaced by anything
    return s.slice(0, i) + "0123456789-:TZ.x /+"[Math.floor(r() * 19)] + s.slice(i + 1);
  }

  it("answers as the regular-expression path does on 300k fuzzed strings (seeded), refusals included", () => {
    let fast = 0;
    for (let i = 0; i < 300_000; i++) {
      const s = candidate();
      const got = outcome(() => parseIsoInstant("at", s));
      expect(got, s).toEqual(outcome(() => parseIsoInstantSlow("at", s)));
      if (/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z$/.test(s) && "ok" in (got as object)) fast++;
    }
    expect(fast).toBeGreaterThan(100_000); // the fast form was exercised, not only the fallback
  });

  it("agrees with Date.parse (ECMAScript's own reading of this form) on valid canonical strings", () => {
    for (let i = 0; i < 100_000; i++) {
      const ms = YEAR_0_MS + Math.floor(r() * (YEAR_10000_MS - YEAR_0_MS));
      const s = new Date(ms).toISOString();
      expect(parseIsoInstant("at", s), s).toBe(Date.parse(s));
      expect(parseIsoInstant("at", `${s.slice(0, 19)}Z`)).toBe(Date.parse(`${s.slice(0, 19)}Z`));
    }
  });

  it("still names the field and the reason when it refuses", () => {
    expect(() => parseIsoInstant("at", "2026-02-29T00:00:00Z")).toThrow(/day 29 does not exist in 2026-02/);
    expect(() => parseIsoInstant("at", "2026-03-08T24:00:00.000Z")).toThrow(/hour 24/);
    expect(() => parseIsoInstant("at", "2026-03-08T09:00:00")).toThrow(/needs a time-zone offset/);
    expect(() => parseIsoInstant("at", 5)).toThrow(/must be an ISO-8601 time/);
    expect(parseIsoInstant("at", "2024-02-29T23:59:59.999Z")).toBe(Date.UTC(2024, 1, 29, 23, 59, 59, 999));
  });
});
