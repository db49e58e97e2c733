/**
 * What the releaser's two sides (the node's thread, releaser.ts, and the releaser thread,
 * releaseWorker.ts) share: the states of a held message's slot in shared memory, the monotonic
 * clock both read, and the messages between them.
 */

/**
 * A slot's life: FREE → HELD (the node hands a message over) → either CLAIMED (the node took it
 * back: its own release timer fired in time, or a run of it was withdrawn) or TAKEN (the releaser
 * thread publishes it: the node's timer had not fired by the backstop time). Each transition out
 * of HELD is one compare-and-swap, so exactly one side wins and both know which. A claimed slot
 * is set FREE by the releaser thread when its own timer finds it claimed (the thread touches a
 * slot once); a taken one by the node once the thread has reported on it.
 */
export const FREE = 0;
export const HELD = 1;
export const TAKEN = 2;
export const CLAIMED = 3;

/**
 * How long after its release time the releaser thread takes a message the node has not released
 * yet. The node's own timer fires 1–3 ms late at the median under load, and 20–30 ms late when a
 * young-generation collection holds its thread: the thread caps that at about this much, and the
 * node keeps the usual case (its publish shares the node's connection and socket writes; the
 * thread's costs a write and a wake-up of its own, ~9 µs a run when it published everything).
 */
export const BACKSTOP_MS = 4;

/**
 * Milliseconds on CLOCK_MONOTONIC: the same reading on every thread of the process
 * (performance.now() counts from each thread's own start). A lease deadline handed to the
 * releaser thread is on this clock.
 */
export function sharedMonotonicMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

/** A message handed to the releaser thread. */
export interface Hold {
  slot: number; subject: string; msgID: string; data: Uint8Array;
  /** Wall-clock ms (Date.now()): not published before. */
  releaseAt: number;
  /** Shared monotonic ms: the leases of the message's shards are valid until then, no later. */
  validUntil: number;
  /** The message's shards and each one's revocation count when it was handed over. */
  shards: number[]; revocations: number[];
}

/** Node thread → releaser thread: the holds of one turn of the node's event loop travel together. */
export type ToReleaser = { t: "hold"; holds: Hold[] } | { t: "close" };

/** What became of a message the releaser thread took. */
export type Report =
  /** Published: the stream sequence JetStream acknowledged, when (wall ms). */
  | { t: "landed"; slot: number; seq: number; atMs: number }
  /** Not published: a shard's lease could not be confirmed at the release time (the node decides). */
  | { t: "returned"; slot: number; reason: string }
  /** The publish failed (the node publishes it again under the same id). */
  | { t: "failed"; slot: number; error: string };

/** Releaser thread → node thread. */
export type FromReleaser =
  | { t: "ready" }
  | { t: "failed-to-start"; error: string }
  | Report;
