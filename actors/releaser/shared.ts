/**
 * What the releaser's two sides (the node's thread, releaser.ts, and the releaser thread,
 * releaseWorker.ts) share: the states of a held message's slot in shared memory and the
 * monotonic clock both read. Messages carry everything else.
 */

/**
 * A slot's life: FREE → HELD (the node hands a message over) → TAKEN (the releaser thread
 * publishes it; nothing can take it back) or RECALLED (the node took it back before its
 * release: a withdrawn run). Either transition is one compare-and-swap from HELD, so the two
 * threads can never both win: a run the node withdrew is never published by the releaser, and
 * a run the releaser took is never reported withdrawn. The node sets the slot FREE again once
 * the releaser thread has reported on it.
 */
export const FREE = 0;
export const HELD = 1;
export const TAKEN = 2;
export const RECALLED = 3;

/**
 * Milliseconds on CLOCK_MONOTONIC: the same reading on every thread of the process
 * (performance.now() counts from each thread's own start). A lease deadline handed to the
 * releaser thread is on this clock.
 */
export function sharedMonotonicMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

/** Node thread → releaser thread. */
export type ToReleaser =
  | {
    t: "hold"; slot: number; subject: string; msgID: string; data: Uint8Array;
    /** Wall-clock ms (Date.now()): not published before. */
    releaseAt: number;
    /** Shared monotonic ms: the leases of the message's shards are valid until then, no later. */
    validUntil: number;
    /** The message's shards and each one's revocation count when it was handed over. */
    shards: number[]; revocations: number[];
  }
  | { t: "close" };

/** Releaser thread → node thread. */
export type FromReleaser =
  | { t: "ready" }
  | { t: "failed-to-start"; error: string }
  /** Published: the stream sequence JetStream acknowledged, when (wall ms). */
  | { t: "landed"; slot: number; seq: number; atMs: number }
  /** Not published: a shard's lease could not be confirmed at the release time (the node decides). */
  | { t: "returned"; slot: number; reason: string }
  /** Taken, but the publish failed (the node publishes it again under the same id). */
  | { t: "failed"; slot: number; error: string }
  /** Recalled by the node before its release time: nothing was published. */
  | { t: "recalled"; slot: number };
