import { describe, expect, it } from "vitest";
import { replayParts } from "../../actors/index.ts";
import { rng } from "./cron-reference.ts";


describe("re-publishing a recorded dispatch message", () => {
  it("property: every unstarted run goes out in exactly one part; the part under the message's id is exactly what a partial release sent (seeded)", () => {
    for (let seed = 1; seed <= 500; seed++) {
      const rand = rng(seed);
      const shards = 1 + Math.floor(rand() * 6);
      const runs = Array.from({ length: Math.floor(rand() * 12) }, (_, i) => ({ id: `r${i}`, shard: Math.floor(rand() * shards) }));
      const released = rand() < 0.3 ? null : [...new Set(Array.from({ length: Math.floor(rand() * shards) }, () => Math.floor(rand() * shards)))];
      const parts = replayParts("d:x", released, runs);
      const ids = parts.flatMap((p) => p.runs.map((r) => r.id));
      expect(ids.sort(), `seed ${seed}`).toEqual(runs.map((r) => r.id).sort());
      expect(new Set(parts.map((p) => p.id)).size).toBe(parts.length);
      for (const p of parts) expect(p.runs.length).toBeGreaterThan(0);
      const underId = parts.find((p) => p.id === "d:x")?.runs ?? [];
      if (released === null) expect(underId).toEqual(runs);
      else expect(underId).toEqual(runs.filter((r) => released.includes(r.shard)));
    }
  });
});
