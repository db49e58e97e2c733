import { Worker } from "node:worker_threads";
import type { Logger, NatsSettings } from "../../common/index.ts";
import { CLAIMED, FREE, HELD, TAKEN, sharedMonotonicMs, type FromReleaser, type Hold, type ToReleaser } from "./shared.ts";

/** How a message the releaser thread took ended (see Report). */
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
  /** Settles if the releaser thread took the message, once it has reported on it; never for one the node claimed. */
  outcome: Promise<ReleaseOutcome>;
}

/** Messages held at once; beyond it the node releases on its own thread alone (at 8,200 runs/s about 50 are held). */
const SLOTS = 4096;
/** Shards whose revocation is counted (a shard id at or above it is never handed over). */
const MAX_SHARDS = 4096;
/** How long a start waits for the thread's NATS connection before the node releases on its own thread alone. */
const START_TIMEOUT_MS = 15_000;

/**
 * The node's side of the releaser thread (releaseWorker.ts): a backstop for the release timers of
 * the node's own thread. The persister hands over each dispatch message written ahead of its due
 * time and keeps its own timer; when that timer fires it claims the message and publishes it as
 * before. If the timer is held up past BACKSTOP_MS (a young-generation collection of 20–30 ms at
 * thousands of runs a second), the thread publishes it instead, from its own event loop.
 *
 * Safety is kept by three checks, all against shared memory:
 * - one publisher: `claim(slot)` (the node's timer, or a withdrawal) and the thread's take are one
 *   compare-and-swap each from HELD; whichever comes first wins, and the loser knows it (a
 *   withdrawn run is never published; a run the thread took is never reported withdrawn);
 * - lease: each message carries the deadline of its shards' leases on a clock both threads read
 *   (CLOCK_MONOTONIC). A node thread paused past it cannot renew; the thread then hands the
 *   message back unpublished, and the node decides (wait for the lease, or leave the runs to the
 *   shard's next owner) as for any release;
 * - fencing: `revoke(shard)` (an actor fenced or stopped, or the node stopping) bumps a per-shard
 *   counter; a message handed over before it goes back unpublished.
 * A message the thread took and failed to publish comes back too: the node publishes it again
 * under the same message id, which JetStream de-duplicates if the first attempt landed.
 */
export class Releaser {
  private readonly slots = new Int32Array(new SharedArrayBuffer(4 * SLOTS));
  private readonly revocations = new Int32Array(new SharedArrayBuffer(4 * MAX_SHARDS));
  /** Slots handed over and not claimed: settled if the thread reports on them. */
  private readonly waiting = new Map<number, (o: ReleaseOutcome) => void>();
  private cursor = 0;
  private worker: Worker | null = null;
  /** Holds made in this turn of the event loop: handed over in one message (a wake-up of the thread each). */
  private pending: Hold[] = [];
  readonly stats = { held: 0, claimed: 0, taken: 0, returned: 0, failed: 0, full: 0 };

  private constructor(private readonly log: Logger) {}

  /**
   * The releaser thread, connected to NATS; null (logged) if it could not start, in which case
   * the node releases on its own thread alone, as before.
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
      opts.log.warn({ err: started }, "releaser thread did not start; dispatches are released by the node's thread alone");
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

  /** Hands a message over; null when it cannot be (the thread is gone, or all slots are held): the node's timer alone releases it. */
  hold(h: HoldRequest): Held | null {
    if (!this.worker) return null;
    if (h.shards.some((s) => s >= MAX_SHARDS)) return null;
    const slot = this.takeFreeSlot();
    if (slot === null) { this.stats.full++; return null; }
    const outcome = new Promise<ReleaseOutcome>((resolve) => this.waiting.set(slot, resolve));
    const shards = [...h.shards];
    this.pending.push({
      slot, subject: h.subject, msgID: h.msgID, data: h.data, releaseAt: h.releaseAt,
      validUntil: sharedMonotonicMs() + h.validForMs, shards, revocations: shards.map((s) => Atomics.load(this.revocations, s)),
    });
    if (this.pending.length === 1) queueMicrotask(() => this.handOver());
    this.stats.held++;
    return { slot, outcome };
  }

  /**
   * The node takes a held message back: to release it itself (its timer fired in time) or to
   * withdraw a run of it. True: the thread will not publish it (its outcome never settles). False:
   * the thread took it already (it is being published, or comes back through its outcome).
   */
  claim(slot: number): boolean {
    if (Atomics.compareExchange(this.slots, slot, HELD, CLAIMED) !== HELD) return false;
    this.waiting.delete(slot);
    this.stats.claimed++;
    return true;
  }

  /** The thread took this message (it is being published, or about to come back). */
  taken(slot: number): boolean { return Atomics.load(this.slots, slot) === TAKEN; }

  /** The shard's actor no longer releases here (fenced, stopped): messages of it not yet taken come back unpublished if the thread takes them. */
  revoke(shard: number): void {
    if (shard < MAX_SHARDS) Atomics.add(this.revocations, shard, 1);
  }

  /** Stops the thread. Messages it still holds stay with the node's timers; those it took are waited for (up to 3 s). */
  async close(): Promise<void> {
    const w = this.worker;
    if (!w) return;
    this.worker = null;
    for (const slot of [...this.waiting.keys()]) this.claim(slot);
    const until = Date.now() + 3000;
    while (this.waiting.size && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    w.postMessage({ t: "close" } satisfies ToReleaser);
    await w.terminate();
    for (const slot of [...this.waiting.keys()]) this.settle(slot, { kind: "failed", error: "the releaser thread stopped before it reported" });
  }

  /** A FREE slot, claimed for a new message (the thread frees the slots the node claimed, the node those the thread took). */
  private takeFreeSlot(): number | null {
    for (let i = 0; i < SLOTS; i++) {
      const slot = (this.cursor + i) % SLOTS;
      if (Atomics.compareExchange(this.slots, slot, FREE, HELD) === FREE) { this.cursor = (slot + 1) % SLOTS; return slot; }
    }
    return null;
  }

  private handOver(): void {
    const holds = this.pending;
    this.pending = [];
    // (closed meanwhile: close() claimed these back, and the node's timers release them)
    this.worker?.postMessage({ t: "hold", holds } satisfies ToReleaser);
  }

  private onReport(m: FromReleaser): void {
    switch (m.t) {
      case "landed": this.stats.taken++; this.settle(m.slot, { kind: "landed", seq: m.seq, atMs: m.atMs }); break;
      case "returned": this.stats.returned++; this.settle(m.slot, { kind: "returned", reason: m.reason }); break;
      case "failed": this.stats.failed++; this.settle(m.slot, { kind: "failed", error: m.error }); break;
      default: break;
    }
  }

  /** The thread is gone: what it took and did not report comes back, to be published from the node (same message ids); the rest the node's timers release. */
  private onExit(reason: string): void {
    if (!this.worker) return;
    this.worker = null;
    this.log.error({ err: reason }, "releaser thread gone; dispatches are released by the node's thread alone");
    for (const slot of [...this.waiting.keys()]) if (!this.claim(slot)) this.settle(slot, { kind: "failed", error: reason });
  }

  private settle(slot: number, o: ReleaseOutcome): void {
    const resolve = this.waiting.get(slot);
    this.waiting.delete(slot);
    Atomics.store(this.slots, slot, FREE);
    resolve?.(o);
  }
}
