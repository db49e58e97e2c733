import { randomBytes } from "node:crypto";
import type { RunInsert } from "../actors/index.ts";
import { loadConfig, type AxConfig } from "../common/index.ts";

/** A fresh namespace per test file: its own PG schema, Redis keys, NATS streams and KV. */
export function testNamespace(prefix = "t"): string {
  return `${prefix}_${randomBytes(5).toString("hex")}`;
}

export function testConfig(namespace: string, overrides: Partial<Record<string, string>> = {}): AxConfig {
  return loadConfig(process.env, { AX_NAMESPACE: namespace, ...overrides });
}

/** Polls `fn` until it returns a truthy value (returned) or the timeout passes (throws with the last value). */
export async function waitFor<T>(fn: () => T | Promise<T>, timeoutMs = 10_000, what = "condition", intervalMs = 50): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: T | undefined;
  let lastErr: unknown;
  for (;;) {
    try {
      last = await fn();
      if (last) return last as NonNullable<T>;
    } catch (e) { lastErr = e; }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs}ms waiting for ${what}; last value ${JSON.stringify(last)}${lastErr ? `; last error ${String(lastErr)}` : ""}`);
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A run row as a shard's round inserts it when it fires (store tests write these directly). */
export function runningRun(id: string, taskId: number, shard: number, epoch: number, o: Partial<RunInsert> = {}): RunInsert {
  return {
    id, taskId, taskName: "t", triggerId: null, source: "once", dueMs: 5000, slotMs: 5000, dueReason: "r", firedMs: 5001,
    node: "n1", shard, epoch, attempt: 1, executor: "ex", state: "running", error: null, causedBy: null, upstreamRuns: null, createdMs: 5001, ...o,
  };
}
