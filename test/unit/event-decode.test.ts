import { describe, expect, it } from "vitest";
import { EventBatchV1Schema, EventBatchV2Schema, decode, decodeEventBatchV1, decodeEventBatchV2 } from "../../protocol/index.ts";
import { rng } from "./cron-reference.ts";

// The event batches' hand check (protocol/messages.ts) against the zod schemas it stands in
// for: on every input the two decoders must agree, ok or not, and on the value.

type R = () => number;
const pick = <T>(r: R, xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;

function goodEvent(r: R, withShard: boolean): Record<string, unknown> {
  const type = pick(r, ["started", "progress", "completed", "failed", "stale"] as const);
  const e: Record<string, unknown> = { type, runId: `r${Math.floor(r() * 1e12).toString(36)}`, taskId: 1 + Math.floor(r() * 1e6), at: 1_765_000_000_000 + Math.floor(r() * 1e6) };
  if (r() < 0.7) e.token = "t".repeat(22);
  if ((type === "completed" || type === "failed") && r() < 0.5) e.startedAt = (e.at as number) - 3;
  if (type === "failed") e.error = { message: "boom", ...(r() < 0.5 ? { type: "Error" } : {}), ...(r() < 0.3 ? { nonRetryable: true } : {}) };
  if (type === "stale") e.reason = "expired";
  if (withShard) e.shard = Math.floor(r() * 64);
  return e;
}

/** One change that may or may not make the input invalid or need zod's transforms. */
function mutate(r: R, batch: Record<string, unknown>): void {
  const events = batch.events as Array<Record<string, unknown>>;
  if (!events.length) return;
  const e = pick(r, events);
  switch (Math.floor(r() * 22)) {
    case 0: e.extra = 1; break;                                  // unknown key: zod strips it
    case 1: batch.extra = "x"; break;
    case 2: e.taskId = 0; break;
    case 3: e.taskId = 1.5; break;
    case 4: e.at = -1; break;
    case 5: e.at = 2 ** 60; break;                               // not a safe integer
    case 6: e.runId = ""; break;
    case 7: e.runId = "r 1"; break;                              // space: not printable-ASCII-only
    case 8: e.runId = "r".repeat(129); break;
    case 9: e.type = "finished"; break;
    case 10: e.error = { message: "a\u0000b" }; break;         // NUL: zod cleans it
    case 11: e.error = { message: "m".repeat(5000) }; break;     // too long: zod cuts it
    case 12: e.error = { message: "x", type: "t".repeat(200) }; break;
    case 13: e.error = { message: "x", nonRetryable: "yes" }; break;
    case 14: e.error = null; break;
    case 15: e.result = { status: 200 }; break;                  // results are measured by zod
    case 16: e.startedAt = null; break;
    case 17: e.token = "t".repeat(65); break;
    case 18: delete e.shard; break;
    case 19: batch.events = []; break;
    case 20: batch.v = batch.v === 1 ? 2 : 1; break;
    default: e.reason = "why\u0000"; break;
  }
}

function batchOf(r: R, v: 1 | 2): Record<string, unknown> {
  const events = Array.from({ length: 1 + Math.floor(r() * 6) }, () => goodEvent(r, v === 2));
  return v === 1 ? { v: 1, executor: "demo", instance: "i-1", shard: Math.floor(r() * 64), events } : { v: 2, executor: "demo", instance: "i-1", node: "n1", events };
}

describe("event batches decoded by hand agree with their zod schemas", () => {
  it.each([1, 2] as const)("v%i: 6,000 fuzzed batches, intact and mutated (seed 21)", (v) => {
    const r = rng(21 + v);
    let fastOk = 0;
    let refused = 0;
    for (let i = 0; i < 6000; i++) {
      const b = batchOf(r, v);
      const n = i % 3 === 0 ? 0 : 1 + Math.floor(r() * 3);
      for (let k = 0; k < n; k++) mutate(r, b);
      const data = new TextEncoder().encode(JSON.stringify(b));
      const byHand = v === 1 ? decodeEventBatchV1(data) : decodeEventBatchV2(data);
      const byZod = v === 1 ? decode(EventBatchV1Schema, data) : decode(EventBatchV2Schema, data);
      expect(byHand.ok).toBe(byZod.ok);
      if (byHand.ok && byZod.ok) expect(byHand.value).toEqual(byZod.value); else if (!byHand.ok && !byZod.ok) { expect(byHand.reason).toBe(byZod.reason); refused++; }
      if (n === 0) fastOk++;
    }
    expect(fastOk).toBeGreaterThan(1500);
    expect(refused).toBeGreaterThan(500);
  });

  it("not JSON, or not an object: refused with zod's reasons", () => {
    for (const raw of ["{", "null", "[]", "7", '"x"']) {
      const a = decodeEventBatchV2(raw);
      const b = decode(EventBatchV2Schema, raw);
      expect(a).toEqual(b);
      expect(a.ok).toBe(false);
    }
  });
});
