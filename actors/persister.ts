import type { Logger } from "../common/index.ts";
import type { ShardWrite, Store } from "./store/index.ts";

/**
 * Write-behind for every shard actor of a node: writes submitted while a batch is being
 * written are coalesced into the next one, so PostgreSQL sees one fenced transaction per
 * round for all shards instead of one per shard per tick. Each submitter learns whether its
 * shard's epoch was still current.
 *
 * Up to `lanes` batches are in flight at once (each one transaction on its own connection).
 * Order is safe without more: a shard actor submits its next round only after the previous
 * one was written, so one shard never has two writes in flight, and the batches of different
 * shards touch disjoint rows. A second lane only starts while the first is busy, so under load
 * writes still coalesce into large batches; it removes the wait behind a batch already on the
 * wire from the latency of a round.
 */
export class Persister {
  private queue: Array<{ write: ShardWrite; resolve: (stale: boolean) => void; reject: (e: unknown) => void }> = [];
  private inFlight = 0;
  readonly stats = { batches: 0, rows: 0, lastBatchMs: 0, maxBatchWrites: 0 };
  constructor(private readonly store: Store, private readonly log: Logger, private readonly lanes = 2) {}

  submit(write: ShardWrite): Promise<boolean> {
    if (!write.runInserts.length && !write.runUpdates.length && !write.taskUpdates.length) return Promise.resolve(false);
    return new Promise((resolve, reject) => {
      this.queue.push({ write, resolve, reject });
      if (this.inFlight < this.lanes) void this.drain();
    });
  }

  private async drain(): Promise<void> {
    this.inFlight++;
    try {
      while (this.queue.length) {
        const batch = this.queue.splice(0, 256);
        const t0 = performance.now();
        try {
          const { stale } = await this.writeWithRetry(batch.map((b) => b.write));
          const staleSet = new Set(stale);
          for (const b of batch) b.resolve(staleSet.has(b.write.shard));
          this.stats.batches++;
          this.stats.maxBatchWrites = Math.max(this.stats.maxBatchWrites, batch.length);
          this.stats.rows += batch.reduce((n, b) => n + b.write.runInserts.length + b.write.runUpdates.length + b.write.taskUpdates.length, 0);
          this.stats.lastBatchMs = performance.now() - t0;
        } catch (e) {
          for (const b of batch) b.reject(e);
        }
      }
    } finally {
      this.inFlight--;
    }
  }

  private async writeWithRetry(writes: ShardWrite[]): Promise<{ stale: number[] }> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.store.writeBatch(writes);
      } catch (e) {
        // PostgreSQL restarting or a serialization hiccup: retry briefly; the caller keeps its
        // effects (dispatches, acks) until the write is in.
        if (attempt >= 8) throw e;
        this.log.warn({ err: String(e), attempt }, "batch write failed; retrying");
        await new Promise((r) => setTimeout(r, Math.min(2000, 50 * 2 ** attempt)));
      }
    }
  }
}
