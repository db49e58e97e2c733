import { createHmac } from "node:crypto";
import { describe, expect, it } from "vitest";
import { derivedRunId, newRunId, runToken, tokenMatches } from "../../protocol/index.ts";

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

  it("tokens are HMAC-SHA256 of the run id (RFC 4231 case 2, and the library's HMAC over raw bytes for seeded secrets and ids)", () => {
    // RFC 4231, test case 2: key "Jefe", data "what do ya want for nothing?".
    const rfc = Buffer.from("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", "hex").toString("base64url").slice(0, 22);
    expect(runToken(new TextEncoder().encode("Jefe"), "what do ya want for nothing?")).toBe(rfc);
    let seed = 7;
    const rnd = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return seed / 2 ** 32; };
    for (let n = 0; n < 200; n++) {
      const secret = Uint8Array.from({ length: 1 + Math.floor(rnd() * 80) }, () => Math.floor(rnd() * 256));
      for (let k = 0; k < 3; k++) { // the same secret again: its key is made once and reused
        const id = newRunId(Date.UTC(2026, 11, 7) + n * 3 + k);
        expect(runToken(secret, id)).toBe(createHmac("sha256", Buffer.from(secret)).update(id).digest("base64url").slice(0, 22));
      }
    }
  });

  it("tokens: a presented token matches exactly when it equals the expected one (every position, lengths, non-strings; seeded)", () => {
    const secret = new Uint8Array(32).fill(7);
    let seed = 42;
    const rnd = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return seed / 2 ** 32; };
    for (let n = 0; n < 300; n++) {
      const expected = runToken(secret, newRunId(Date.UTC(2026, 11, 3) + n));
      expect(expected).toHaveLength(22);
      expect(tokenMatches(expected, expected)).toBe(true);
      expect(tokenMatches(expected.split("").join(""), expected)).toBe(true); // equal, not the same string object
      const at = Math.floor(rnd() * expected.length);
      const other = String.fromCharCode(expected.charCodeAt(at) ^ (1 + Math.floor(rnd() * 30)));
      expect(tokenMatches(expected.slice(0, at) + other + expected.slice(at + 1), expected)).toBe(false);
      expect(tokenMatches(expected.slice(0, -1), expected)).toBe(false);
      expect(tokenMatches(expected + "A", expected)).toBe(false);
    }
    const t = runToken(secret, "r1");
    expect(tokenMatches(undefined, t)).toBe(false);
    expect(tokenMatches(123 as unknown as string, t)).toBe(false);
    expect(tokenMatches("", "")).toBe(true);
    expect(runToken(secret, "r1")).toBe(t);
    expect(runToken(new Uint8Array(32).fill(8), "r1")).not.toBe(t);
  });
});

