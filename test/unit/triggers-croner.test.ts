import { Cron } from "croner";
import { describe, expect, it } from "vitest";
import { cachedCron, cronIncludes, cronNext, slotNote, type CachedCron } from "../../actors/triggers/cron.ts";
import { instantsOfWall, offsetMsAt, pieceAt, transitionsBetween } from "../../actors/triggers/zone.ts";
import { genCron, rng } from "./cron-reference.ts";

/**
 * Differential test against croner, an independent cron library (dev dependency only).
 * Away from DST transitions the two must agree exactly. At transitions they differ by policy,
 * and only in these ways (also listed in docs/TRIGGERS.md):
 *
 * - REPEAT_SECOND_COPY: a wall time that happens twice (fall back) in an expression whose hour
 *   field is not every hour: croner fires both copies, ax only the first (`dst-repeat first`,
 *   the documented default for such expressions; "both" is the default only for every-hour ones).
 * - GAP_SHIFTED: a wall time the clock jumps over (spring forward): ax fires it read with the
 *   offset from before the jump (`dst-gap shift`, e.g. 02:30 → 03:30 in New York); croner skips it.
 * - GAP_AT_TRANSITION: for some such wall times croner fires at the first instant after the jump
 *   (e.g. 7 2 * * * in America/Indiana/Tell_City on 2025-03-09 at 03:00 CDT, minute 0, which the
 *   expression does not name); ax fires 03:07 CDT (shift).
 *
 * croner also refuses `a/s` (a step from a number, "5/15"), which ax reads as `a-max/s` as Vixie
 * cron does; the test hands croner the `a-max/s` spelling.
 */

const SWEEP = process.env.AX_SWEEP === "1";
/** Slots per chain: croner takes ~50 µs a call, so dense expressions are cut (both chains alike). */
const CAP = SWEEP ? 20_000 : 600;
const H = 3_600_000;
const MAX = [59, 59, 23, 31, 12, 7];
const forCroner = (text: string): string => {
  const fields = text.split(" ");
  const shift = fields.length === 5 ? 1 : 0;
  return fields.map((f, i) => f.split(",").map((it) => (/^\d+\/\d+$/.test(it) ? it.replace("/", `-${MAX[i + shift]}/`) : it)).join(",")).join(" ");
};

type Kind = "REPEAT_SECOND_COPY" | "GAP_SHIFTED" | "GAP_AT_TRANSITION" | "UNEXPECTED";

function classifyOursOnly(cc: CachedCron, a: number): Kind {
  const n = slotNote(cc, a);
  return n.kind === "gap-shift" ? "GAP_SHIFTED" : "UNEXPECTED";
}
function classifyCronerOnly(cc: CachedCron, b: number): Kind {
  if (cronIncludes(cc, b)) {
    const copies = instantsOfWall(cc.tz, b + offsetMsAt(cc.tz, b));
    return copies.length > 1 && cc.repeat === "first" && copies.indexOf(b) > 0 ? "REPEAT_SECOND_COPY" : "UNEXPECTED";
  }
  const p = pieceAt(cc.tz, b);
  return p.start === b && offsetMsAt(cc.tz, b - 1) < p.offset ? "GAP_AT_TRANSITION" : "UNEXPECTED";
}

function chain(next: (t: number) => number | null, from: number, to: number): number[] {
  const out: number[] = [];
  for (let t = from; out.length < CAP;) {
    const s = next(t);
    if (s === null || s > to) break;
    expect(s).toBeGreaterThan(t);
    out.push(s); t = s;
  }
  return out;
}

function compare(text: string, tz: string, from: number, to: number, counts: Map<string, number>, examples: string[]): number {
  let cc: CachedCron;
  try { cc = cachedCron(text, tz); } catch { return 0; }
  const six = text.split(" ").length === 6;
  const cr = new Cron(forCroner(text), { timezone: tz, paused: true, mode: six ? "6-part" : "5-part" });
  const ours = chain((t) => cronNext(cc, t), from, to);
  const theirs = chain((t) => cr.nextRun(new Date(t))?.getTime() ?? null, from, to);
  // Compare up to where both chains reach (a cut chain stops early).
  const end = Math.min(ours.length === CAP ? ours[CAP - 1]! : to, theirs.length === CAP ? theirs[CAP - 1]! : to);
  const a = new Set(ours.filter((s) => s <= end)); const b = new Set(theirs.filter((s) => s <= end));
  const note = (k: Kind, at: number): void => {
    counts.set(k, (counts.get(k) ?? 0) + 1);
    if (k === "UNEXPECTED" || examples.length < 3) examples.push(`${k}: "${text}" in ${tz} at ${new Date(at).toISOString()} (ax ${a.has(at)}, croner ${b.has(at)})`);
  };
  for (const s of a) if (!b.has(s)) note(classifyOursOnly(cc, s), s);
  for (const s of b) if (!a.has(s)) note(classifyCronerOnly(cc, s), s);
  return a.size;
}

const ZONES = Intl.supportedValuesOf("timeZone");

describe("differential: ax against croner", () => {
  it("agree exactly away from DST transitions (random expressions, zones and instants)", () => {
    const r = rng(4242);
    const counts = new Map<string, number>(); const examples: string[] = [];
    let slots = 0;
    for (let i = 0; i < (SWEEP ? 4000 : 80); i++) {
      const tz = ZONES[Math.floor(r() * ZONES.length)]!;
      const c = genCron(r, { hours: [9, 12], minutes: [0, 30], month: 6 });
      let from = Date.UTC(2024, 0, 1) + Math.floor(r() * 3 * 365) * 86_400_000;
      // Keep clear of transitions: start after one and stop before the next.
      const trs = transitionsBetween(tz, from - 3 * 86_400_000, from + 10 * 86_400_000);
      if (trs.length > 0) from = trs[0]!.at + 2 * 86_400_000;
      const until = transitionsBetween(tz, from, from + 10 * 86_400_000)[0]?.at ?? from + 10 * 86_400_000;
      slots += compare(c.text, tz, from, Math.min(from + 3 * 86_400_000, until - 2 * 86_400_000), counts, examples);
    }
    expect(slots).toBeGreaterThan(1000);
    console.log(`croner away from transitions: ${slots} ax slots, all equal`);
    expect([...counts.entries()], examples.join("\n")).toEqual([]);
  }, SWEEP ? 3_600_000 : 60_000);

  it("differ at transitions only in the documented ways", () => {
    const r = rng(1313);
    const counts = new Map<string, number>(); const examples: string[] = [];
    // The documented examples, then random ones.
    let slots = compare("30 1 * * *", "America/New_York", Date.UTC(2026, 9, 31), Date.UTC(2026, 10, 3), counts, examples)
      + compare("30 2 * * *", "America/New_York", Date.UTC(2026, 2, 7), Date.UTC(2026, 2, 10), counts, examples);
    let cases = 2;
    const zones = SWEEP ? ZONES : ZONES.filter(() => r() < 0.2);
    for (const tz of zones) {
      const trs = transitionsBetween(tz, Date.UTC(2015, 0, 1), Date.UTC(2027, 0, 1));
      if (trs.length === 0) continue;
      for (let j = 0; j < (SWEEP ? 6 : 1); j++) {
        const tr = trs[Math.floor(r() * trs.length)]!;
        const w = new Date(tr.at + tr.before);
        const c = genCron(r, { hours: [w.getUTCHours(), (w.getUTCHours() + 1) % 24, (w.getUTCHours() + 23) % 24], minutes: [0, 30, w.getUTCMinutes()], month: w.getUTCMonth() + 1 });
        slots += compare(c.text, tz, tr.at - 30 * H, tr.at + 30 * H, counts, examples);
        cases++;
      }
    }
    // The known differences do occur (otherwise this test would not be looking at transitions).
    expect(counts.get("UNEXPECTED") ?? 0, examples.filter((e) => e.startsWith("UNEXPECTED")).slice(0, 10).join("\n")).toBe(0);
    expect(counts.get("REPEAT_SECOND_COPY") ?? 0).toBeGreaterThan(0);
    expect(counts.get("GAP_SHIFTED") ?? 0).toBeGreaterThan(0);
    console.log(`croner at transitions: ${cases} cases in ${zones.length} zones, ${slots} ax slots; differences: ${JSON.stringify(Object.fromEntries(counts))}`);
  }, SWEEP ? 3_600_000 : 60_000);
});
