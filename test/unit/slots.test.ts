import { describe, expect, it } from "vitest";
import { copySlots, editSlots, slotsFromText, withSlot } from "../../actors/store/index.ts";
import { rng } from "./cron-reference.ts";

/** A key of the kinds ax writes, or an arbitrary one (quotes, backslashes, unicode, "__proto__"). */
function randomKey(r: () => number): string {
  const id = Math.floor(r() * 1e9);
  switch (Math.floor(r() * 7)) {
    case 0: return String(id);
    case 1: return `w:${id}`;
    case 2: return `n:${id}`;
    case 3: return "w:paused";
    case 4: return "__proto__";
    case 5: return ["a\"b", "c\\d", "é ☃", "x, \"y\": 1", "", "}"][Math.floor(r() * 6)]!;
    default: return `k${id.toString(36)}`;
  }
}

function randomValue(r: () => number): number {
  switch (Math.floor(r() * 5)) {
    case 0: return Math.floor(r() * 2e12);
    case 1: return -Math.floor(r() * 1e6);
    case 2: return r() * 1e6;
    case 3: return 0;
    default: return Number((r() * 1e-7).toPrecision(3));
  }
}

/** PostgreSQL's jsonb output of a flat object: `{"k": v, "k2": v2}` (keys escaped as JSON). */
function jsonbStyle(o: Record<string, number>): string {
  const parts = Object.keys(o).map((k) => `${JSON.stringify(k)}: ${JSON.stringify(o[k])}`);
  return `{${parts.join(", ")}}`;
}

const plain = (o: Record<string, number>) => ({ ...o });

describe("trigger slots as dictionary-mode objects", () => {
  it("reads 5,000 random columns in jsonb's layout and in any other JSON layout as JSON.parse does (seed 7)", () => {
    const r = rng(7);
    for (let i = 0; i < 5000; i++) {
      const o: Record<string, number> = Object.create(null) as Record<string, number>;
      const n = Math.floor(r() * 6);
      for (let j = 0; j < n; j++) o[randomKey(r)] = randomValue(r);
      for (const text of [jsonbStyle(o), JSON.stringify(o), JSON.stringify(o, null, 2)]) {
        const got = slotsFromText(text);
        expect(Object.getPrototypeOf(got)).toBeNull();
        expect(Object.entries(got)).toEqual(Object.entries(JSON.parse(text) as object));
      }
    }
  });

  it("a key named __proto__ is an own key, never the object's prototype", () => {
    const s = slotsFromText('{"__proto__": 5, "w:1": 2}');
    expect(Object.getPrototypeOf(s)).toBeNull();
    expect(Object.keys(s)).toEqual(["__proto__", "w:1"]);
    expect(s["__proto__"]).toBe(5);
  });

  it("empty, null and malformed-looking input", () => {
    expect(Object.keys(slotsFromText("{}"))).toEqual([]);
    expect(Object.keys(slotsFromText(null))).toEqual([]);
    expect(Object.keys(slotsFromText(undefined))).toEqual([]);
    expect(() => slotsFromText('{"a": }')).toThrow(SyntaxError);
    expect(plain(slotsFromText('{"a": 0x10}'.replace("0x10", "16")))).toEqual({ a: 16 });
    expect(() => slotsFromText('{"a": 0x10}')).toThrow(SyntaxError);
  });

  it("withSlot and editSlots copy: the original is never changed (rounds compare slots by reference)", () => {
    const a = copySlots({ "1": 10, "w:1": 10 });
    const b = withSlot(a, "1", 20);
    const c = withSlot(b, "w:1", undefined);
    const d = editSlots(c, (s) => { s["n:1"] = 1; delete s["1"]; });
    expect(plain(a)).toEqual({ "1": 10, "w:1": 10 });
    expect(plain(b)).toEqual({ "1": 20, "w:1": 10 });
    expect(plain(c)).toEqual({ "1": 20 });
    expect(plain(d)).toEqual({ "n:1": 1 });
    for (const x of [a, b, c, d]) expect(Object.getPrototypeOf(x)).toBeNull();
    expect(JSON.stringify(d)).toBe('{"n:1":1}');
  });
});
