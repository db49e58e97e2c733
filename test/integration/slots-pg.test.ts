import pg from "pg";
import { afterAll, describe, expect, it } from "vitest";
import { slotsFromText } from "../../actors/store/index.ts";
import { testConfig, testNamespace } from "../helpers.ts";
import { rng } from "../unit/cron-reference.ts";

// The shard actors read tasks.trigger_slots as PostgreSQL prints it (::text) with a reader of
// their own (actors/store/slots.ts). Checked here against what this server really prints.
const pool = new pg.Pool({ connectionString: testConfig(testNamespace("slots")).pgUrl, max: 1 });
afterAll(async () => { await pool.end(); });

describe("trigger slots read from PostgreSQL's own jsonb output", () => {
  it("2,000 random slot objects read back equal to the JSON they were written as (seed 11)", async () => {
    const r = rng(11);
    const keys = (id: number) => [String(id), `w:${id}`, `n:${id}`, "w:paused", "__proto__", "a\"b", "c\\d", "é ☃", ""];
    const written: string[] = [];
    for (let i = 0; i < 2000; i++) {
      const o: Record<string, number> = {};
      const n = Math.floor(r() * 5);
      for (let j = 0; j < n; j++) {
        const ks = keys(Math.floor(r() * 1e9));
        o[ks[Math.floor(r() * ks.length)]!] = [Math.floor(r() * 2e12), -7, 0, r() * 1000, 1.5e-9][Math.floor(r() * 5)]!;
      }
      written.push(JSON.stringify(o));
    }
    const res = await pool.query<{ t: string }>("select x::jsonb::text as t from unnest($1::text[]) with ordinality u(x, i) order by i", [written]);
    expect(res.rows).toHaveLength(written.length);
    let fast = 0;
    res.rows.forEach(({ t }, i) => {
      const got = slotsFromText(t);
      const want = JSON.parse(written[i]!) as Record<string, number>;
      expect(Object.keys(got).sort()).toEqual(Object.keys(want).sort());
      for (const k of Object.keys(want)) expect(got[k]).toBe(want[k]);
      if (!t.includes("\\")) fast++;
    });
    // Most rows (no escaped key) take the direct reader, not JSON.parse.
    expect(fast).toBeGreaterThan(1000);
  });
});
