import { describe, expect, it } from "vitest";
import { RecentPublishes } from "../../protocol/republish.ts";

const bytes = (n: number) => new Uint8Array(n);

describe("RecentPublishes", () => {
  it("hands back the publishes of the window before the disconnect, oldest first, once", () => {
    let now = 0;
    const r = new RecentPublishes({ windowMs: 1000, now: () => now });
    for (let i = 0; i < 30; i++) { now = i * 100; r.note("s", bytes(10), `m${i}`); }
    // now = 2900: the window reaches back to 1900
    const taken = r.takeRecent();
    expect(taken.map((p) => p.msgID)).toEqual(["m19", "m20", "m21", "m22", "m23", "m24", "m25", "m26", "m27", "m28", "m29"]);
    expect(taken[0]!.subject).toBe("s");
    expect(r.takeRecent()).toEqual([]);
    expect(r.size).toBe(0);
  });

  it("keeps at most maxBytes, dropping the oldest", () => {
    const r = new RecentPublishes({ windowMs: 60_000, maxBytes: 100, now: () => 0 });
    for (let i = 0; i < 10; i++) r.note("s", bytes(30), `m${i}`);
    expect(r.takeRecent().map((p) => p.msgID)).toEqual(["m7", "m8", "m9"]);
  });

  it("stays correct across its internal compaction (many publishes)", () => {
    let now = 0;
    const r = new RecentPublishes({ windowMs: 50, now: () => now });
    for (let i = 0; i < 5000; i++) { now = i; r.note("s", bytes(1), `m${i}`); }
    expect(r.size).toBe(51);
    expect(r.takeRecent().map((p) => p.msgID)[0]).toBe("m4949");
  });
});
