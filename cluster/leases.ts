import type { KV } from "@nats-io/kv";
import type { Clock, Logger } from "../common/index.ts";

/**
 * Shard leases in a JetStream KV bucket whose own TTL (max age) expires them: nats-server 2.9
 * ignores per-key TTL, but every renewal rewrites the key, so a key not renewed within the
 * bucket TTL disappears.
 *
 * One lease per shard, key `s<shard>`, value = owner node id. Modes of a lease held here:
 *   held    acquired with create() (fails if anyone holds it); revision at acquire = EPOCH
 *   renewed update(key, value, lastRevision) every ttl/3; a stale revision (someone else's
 *           key, or the key expired) fails → lost
 *   lost    renewal failed, or more than ttl − margin passed on the MONOTONIC clock since the
 *           last successful renewal (a long GC/VM pause): the shard is stopped before
 *           anything else is done, then the lease may be acquired again under a new epoch
 *   released delete(key) with the last revision on a planned hand-over
 * The epoch never changes on renewal: it is the fencing token written to PostgreSQL when the
 * lease is acquired, and every shard write is conditional on it.
 */
export interface HeldLease { shard: number; epoch: number; revision: number; renewedMono: number }

export class LeaseTable {
  private held = new Map<number, HeldLease>();
  constructor(
    private readonly kv: KV,
    private readonly nodeId: string,
    private readonly ttlMs: number,
    private readonly clock: Clock,
    private readonly log: Logger,
  ) {}

  static key(shard: number): string { return `s${shard}`; }

  get(shard: number): HeldLease | undefined { return this.held.get(shard); }
  heldShards(): number[] { return [...this.held.keys()].sort((a, b) => a - b); }

  /** True while the lease is held and its last renewal is recent enough to act on. */
  isValid(shard: number): boolean {
    const l = this.held.get(shard);
    return !!l && this.clock.monotonic() - l.renewedMono < this.ttlMs - this.safetyMarginMs();
  }
  private safetyMarginMs(): number { return Math.min(1000, this.ttlMs / 4); }

  async acquire(shard: number): Promise<HeldLease | null> {
    try {
      const rev = await this.kv.create(LeaseTable.key(shard), this.nodeId);
      const lease = { shard, epoch: rev, revision: rev, renewedMono: this.clock.monotonic() };
      this.held.set(shard, lease);
      return lease;
    } catch {
      return null; // someone holds it (or NATS is down): try again on the next round
    }
  }

  /** Renews every held lease; returns the shards whose lease is lost. */
  async renewAll(): Promise<number[]> {
    const lost: number[] = [];
    await Promise.all([...this.held.values()].map(async (l) => {
      if (!this.isValid(l.shard)) { lost.push(l.shard); return; }
      try {
        l.revision = await this.kv.update(LeaseTable.key(l.shard), this.nodeId, l.revision);
        l.renewedMono = this.clock.monotonic();
      } catch (e) {
        this.log.warn({ shard: l.shard, epoch: l.epoch, err: String(e) }, "lease renewal refused");
        lost.push(l.shard);
      }
    }));
    for (const s of lost) this.held.delete(s);
    return lost;
  }

  /** Forgets a lease without touching the bucket (it was found lost). */
  forget(shard: number): void { this.held.delete(shard); }

  async release(shard: number): Promise<void> {
    const l = this.held.get(shard);
    this.held.delete(shard);
    if (!l) return;
    try { await this.kv.delete(LeaseTable.key(shard), { previousSeq: l.revision }); } catch (e) {
      this.log.warn({ shard, epoch: l.epoch, err: String(e) }, "lease release failed; it will expire");
    }
  }

  /** Current owner of every shard lease in the bucket (any node). */
  async owners(): Promise<Map<number, string>> {
    const out = new Map<number, string>();
    const keys = await this.kv.keys();
    const all: string[] = [];
    for await (const k of keys) all.push(k);
    await Promise.all(all.map(async (k) => {
      const e = await this.kv.get(k);
      if (e && e.operation === "PUT") out.set(Number(k.slice(1)), e.string());
    }));
    return out;
  }
}
