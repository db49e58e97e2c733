import { Worker } from "node:worker_threads";
import type { Logger, NatsSettings } from "../../common/index.ts";
import { FREE, HELD, RECALLED, TAKEN, sharedMonotonicMs, type FromReleaser, type ToReleaser } from "./shared.ts";

/** How a held message ended on the releaser thread (see FromReleaser). */
export type ReleaseOutcome =
  | { kind: "landed"; seq: number; atMs: number }
  | { kind: "returned"; reason: string }
  | { kind: "failed"; error: string };

export interface HoldRequest {
  subject: string;
  msgID: string;
  data: Uint8Array;
  /** Wall ms (the system clock): not published before. */
  releaseAt: number;
  /** How long from now the leases of all its shards stay valid (the releaser refuses after). */
  validForMs: number;
  shards: readonly number[];
}

export interface Held {
  slot: number;
  /** Settles once the releaser thread has reported on it; never for a message recalled here. */
  outcome: Promise<ReleaseOutcome>;
}

/** Messages held at once; beyond it the node releases on its own thread (at 8,200 runs/s about 50 are held). */
const SLOTS = 4096;
/** Shards whose revocation is counted (a shard id at or above it is never handed over). */
const MAX_SHARDS = 4096;
/** How long a start waits for the thread's NATS connection before the node releases on its own thread. */
const START_TIMEOUT_MS = 15_000;

/**
 * The node's side of the releaser thread (releaseWorker.ts). The persister hands it each
 * dispatch message written ahead of its due time; the thread publishes it at that time, on its
 * own event loop, so the node thread's pauses (its collections) no longer delay releases.
 *
 * Safety is kept by three checks on the releaser thread, all against shared memory:
 * - withdrawal: `recall(slot)` and the thread's take are one compare-and-swap each from HELD;
 *   whichever comes first wins, and the loser knows it (a withdrawn run is never published; a
 *   run being published is never reported withdrawn);
 * - lease: each message carries the deadline of its shards' leases on a clock both threads
 *   read (CLOCK_MONOTONIC). A node thread paused past it cannot renew; the thread then hands the
 *   message back unpublished, and the node decides (wait for the lease, or leave the runs to the
 *   shard's next owner) as for a release on its own thread;
 * - fencing: `revoke(shard)` (an actor fenced or stopping) bumps a per-shard counter; a message
 *   handed over before it goes back unpublished.
 * A message the thread took and failed to publish comes back too: the node publishes it again
 * under the same message id, which JetStream de-duplicates if the first attempt landed.
 */
export class Releaser {
  private readonly slots = new Int32Array(new SharedArrayBuffer(4 * SLOTS));
  private readonly revocations = new Int32Array(new SharedArrayBuffer(4 * MAX_SHARDS));
  private readonly waiting = new Map<number, (o: ReleaseOutcome) => void>();
  private readonly free: number[] = [];
  private worker: Worker | null = null;
  readonly stats = { held: 0, landed: 0, returned: 0, failed: 0, recalled: 0, full: 0 };

  private constructor(private readonly log: Logger) {
    for (let i = SLOTS - 1; i >= 0; i--) this.free.push(i);
  }

  /**
   * The releaser thread, connected to NATS; null (logged) if it could not start, in which case
   * the node releases on its own thread as before.
   */
  static async start(opts: { nats: NatsSettings; name: string; log: Logger }): Promise<Releaser | null> {
    const r = new Releaser(opts.log);
    // From the TypeScript sources (tests, a checkout run through tsx) the thread registers tsx
    // first (fromSource.mjs); compiled, it starts releaseWorker.js itself.
    const fromSource = import.meta.url.endsWith(".ts");
    const entry = new URL(fromSource ? "./releaseWorker.ts" : "./releaseWorker.js", import.meta.url);
    const worker = new Worker(fromSource ? new URL("./fromSource.mjs", import.meta.url) : entry, {
      workerData: { nats: opts.nats, name: opts.name, slots: r.slots.buffer, revocations: r.revocations.buffer, entry: entry.href },
    });
    const started = await new Promise<string | null>((resolve) => {
      const timer = setTimeout(() => resolve(`no NATS connection within ${START_TIMEOUT_MS} ms`), START_TIMEOUT_MS);
      worker.once("message", (m: FromReleaser) => { clearTimeout(timer); resolve(m.t === "ready" ? null : m.t === "failed-to-start" ? m.error : `unexpected ${m.t}`); });
      worker.once("error", (e) => { clearTimeout(timer); resolve(String(e)); });
    });
    if (started !== null) {
      opts.log.warn({ err: started }, "releaser thread did not start; dispatches are released on the node's thread");
      await worker.terminate();
      return null;
    }
    r.worker = worker;
    worker.on("message", (m: FromReleaser) => r.onReport(m));
    worker.on("error", (e) => r.onExit(`releaser thread failed: ${String(e)}`));
    worker.on("exit", (code) => r.onExit(`releaser thread exited (${code})`));
    worker.unref();
    return r;
  }

  /** Hands a message over; null when it cannot be (the thread is gone, or all slots are held): release it on this thread. */
  hold(h: HoldRequest): Held | null {
    if (!this.worker) return null;
    if (h.shards.some((s) => s >= MAX_SHARDS)) return null;
    const slot = this.free.pop();
    if (slot === undefined) { this.stats.full++; return null; }
    Atomics.store(this.slots, slot, HELD);
    const outcome = new Promise<ReleaseOutcome>((resolve) => this.waiting.set(slot, resolve));
    const shards = [...h.shards];
    const msg: ToReleaser = {
      t: "hold", slot, subject: h.subject, msgID: h.msgID, data: h.data, releaseAt: h.releaseAt,
      validUntil: sharedMonotonicMs() + h.validForMs, shards, revocations: shards.map((s) => Atomics.load(this.revocations, s)),
    };
    this.worker.postMessage(msg);
    this.stats.held++;
    return { slot, outcome };
  }

  /**
   * Takes a held message back before the thread publishes it. True: it will not be published
   * from there (its outcome never settles; the caller owns the message again). False: the thread
   * took it already (it is being published, or handed back through its outcome).
   */
  recall(slot: number): boolean {
    if (Atomics.compareExchange(this.slots, slot, HELD, RECALLED) !== HELD) return false;
    this.waiting.delete(slot);
    this.stats.recalled++;
    return true;
  }

  /** The thread took this message (it is being published, or about to come back). */
  taken(slot: number): boolean { return Atomics.load(this.slots, slot) === TAKEN; }

  /** The shard's actor no longer releases here (fenced, stopping): messages of it not yet taken come back unpublished. */
  revoke(shard: number): void {
    if (shard < MAX_SHARDS) Atomics.add(this.revocations, shard, 1);
  }

  /** Stops the thread; messages still held come back as "returned", to be released (or not) on the node's thread. */
  async close(): Promise<void> {
    const w = this.worker;
    if (!w) return;
    this.worker = null;
    for (const slot of [...this.waiting.keys()]) {
      // (its slot stays recalled: the thread is going, and nothing is held again)
      if (Atomics.compareExchange(this.slots, slot, HELD, RECALLED) === HELD) this.settle(slot, { kind: "returned", reason: "the node is stopping" }, false);
    }
    // Those taken: their publish is under way; wait for its report (bounded by its 2 s timeout).
    const until = Date.now() + 3000;
    while (this.waiting.size && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    w.postMessage({ t: "close" } satisfies ToReleaser);
    await w.terminate();
    for (const slot of [...this.waiting.keys()]) this.settle(slot, { kind: "failed", error: "the releaser thread stopped before it reported" });
  }

  private onReport(m: FromReleaser): void {
    switch (m.t) {
      case "landed": this.stats.landed++; this.settle(m.slot, { kind: "landed", seq: m.seq, atMs: m.atMs }); break;
      case "returned": this.stats.returned++; this.settle(m.slot, { kind: "returned", reason: m.reason }); break;
      case "failed": this.stats.failed++; this.settle(m.slot, { kind: "failed", error: m.error }); break;
      case "recalled": this.release(m.slot); break;
      default: break;
    }
  }

  /** The thread is gone: every message it held comes back, to be published from this thread (same message ids). */
  private onExit(reason: string): void {
    if (!this.worker) return;
    this.worker = null;
    this.log.error({ err: reason, held: this.waiting.size }, "releaser thread gone; its messages are released on the node's thread");
    for (const slot of [...this.waiting.keys()]) this.settle(slot, { kind: "failed", error: reason });
  }

  private settle(slot: number, o: ReleaseOutcome, freeSlot = true): void {
    const resolve = this.waiting.get(slot);
    this.waiting.delete(slot);
    if (freeSlot) this.release(slot);
    resolve?.(o);
  }

  private release(slot: number): void {
    Atomics.store(this.slots, slot, FREE);
    this.free.push(slot);
  }
}
