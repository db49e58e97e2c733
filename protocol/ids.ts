import { createHmac, createSecretKey, randomBytes, type KeyObject } from "node:crypto";

let counter = 0;
const nodeSalt = randomBytes(3).toString("hex");

/**
 * Run ids sort by creation time (base-36 ms prefix) and are unique without coordination: the
 * process salt (random) tells processes apart, and within one the counter does (it would have to
 * wrap, 1.68 M ids, inside one millisecond to repeat). The last four hex digits are only noise
 * for readers: a cheap PRNG, not randomBytes (a crypto call per run was ~1.5 µs of the node's
 * time per run). The run id is the request id executors de-duplicate on.
 */
export function newRunId(nowMs: number): string {
  counter = (counter + 1) % 1_679_616; // 36^4
  return `r${nowMs.toString(36)}${nodeSalt}${counter.toString(36).padStart(4, "0")}${(0x10000 + Math.floor(Math.random() * 0x10000)).toString(16).slice(1)}`;
}

/** A run id derived from its cause, so a redelivered cause yields the same run (and is de-duplicated). */
export function derivedRunId(prefix: string, key: string): string {
  let h1 = 0x811c9dc5, h2 = 0x01000193;
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    h1 = Math.imul(h1 ^ c, 16777619) >>> 0;
    h2 = Math.imul(h2 + c, 2246822519) >>> 0;
  }
  return `${prefix}${h1.toString(36)}${h2.toString(36)}`;
}

/**
 * The token a dispatch gives each run: HMAC-SHA256 of the run id under the cluster's dispatch
 * secret (kept in PostgreSQL, never sent to executors). An executor echoes it on every event of
 * the run; an event without the right token is refused, so only a holder of the dispatch can
 * report on a run. Derived rather than stored: any node can check it for any run.
 */
export function runToken(secret: Uint8Array, runId: string): string {
  return createHmac("sha256", secretKeyOf(secret)).update(runId).digest("base64url").slice(0, 22);
}

/**
 * The secret as a KeyObject, made once per secret: given the bytes, createHmac copied them into a
 * new key on every call (one a run); with the key made once a token took ~1.65 µs here instead of
 * ~1.95. The token is the same (test/unit/ids.test.ts compares them). A node reads its secret once
 * and never changes those bytes in place (the key would not follow them).
 */
const secretKeys = new WeakMap<Uint8Array, KeyObject>();
function secretKeyOf(secret: Uint8Array): KeyObject {
  let key = secretKeys.get(secret);
  if (!key) { key = createSecretKey(secret); secretKeys.set(secret, key); }
  return key;
}

/**
 * Comparison of a presented token with the expected one in time that does not depend on where
 * they differ (only on the length, which is fixed). Over the strings' char codes: two Buffers
 * and timingSafeEqual per event were ~0.4 µs, this ~0.13.
 */
export function tokenMatches(presented: string | undefined, expected: string): boolean {
  if (typeof presented !== "string" || presented.length !== expected.length) return false;
  let diff = 0;
  for (let i = 0; i < expected.length; i++) diff |= presented.charCodeAt(i) ^ expected.charCodeAt(i);
  return diff === 0;
}
