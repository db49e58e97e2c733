import type { NatsConnection } from "@nats-io/transport-node";
import { Kvm, type KV } from "@nats-io/kv";
import type { JetStreamManager } from "@nats-io/jetstream";
import { AxError, type Logger } from "../common/index.ts";

/**
 * The lease bucket's *incarnations* and the epoch floor that keeps fencing epochs monotonic
 * across them.
 *
 * A lease's epoch is `floor + KV revision`. Revisions restart at 1 when the bucket is deleted
 * and created again, so the floor of a new incarnation is chosen above every epoch the old one
 * can have produced: the next multiple of EPOCH_SPAN above both the largest epoch recorded in
 * PostgreSQL and the floor this node last used. An old incarnation's epochs all lie in
 * [its floor, its floor + EPOCH_SPAN) — revisions never get near 2^40 (a thousand shards
 * renewed every 2 s take 70 years) — so even a claim of the old incarnation that reaches
 * PostgreSQL late (a node that acquired just before the deletion) is below every new epoch,
 * and PostgreSQL's `epoch < new` claim keeps refusing stale actors as before.
 *
 * The floor is stored in the bucket itself (its stream description: nats-server 2.9 has no
 * stream metadata), so every node reads the same floor for the same incarnation; nodes that
 * race to recreate the bucket agree or the loser opens the winner's. A bucket without a floor
 * (created before this, or the first of a fresh cluster) has floor 0: epoch = revision, as it
 * always was.
 *
 * Limit: 2^53 / 2^40 = 8192 recreations before epochs leave the safe-integer range.
 */
export const EPOCH_SPAN = 2 ** 40;
const FLOOR_RE = /epoch floor (\d+)/;

export interface LeaseBucketOptions {
  nc: NatsConnection;
  jsm: JetStreamManager;
  name: string;
  ttlMs: number;
  replicas: number;
  /** The largest epoch PostgreSQL has recorded for any shard. */
  maxRecordedEpoch: () => Promise<number>;
  log: Logger;
}

/** Identity of one incarnation: the stream's creation time and its floor. */
interface Incarnation { created: string; floor: number; ttlMs: number }

export class LeaseBucket {
  kv!: KV;
  private inc: Incarnation = { created: "", floor: 0, ttlMs: 0 };
  /** How many times this node saw the bucket replaced (metrics, tests). */
  recreations = 0;

  constructor(private readonly o: LeaseBucketOptions) {}

  get stream(): string { return `KV_${this.o.name}`; }
  /** The epoch floor of the incarnation in use. */
  get floor(): number { return this.inc.floor; }
  /** An identity token: changes when the bucket is replaced. */
  get incarnation(): string { return `${this.inc.created}/${this.inc.floor}`; }

  /** Opens the bucket, creating it (with a floor) if it does not exist. */
  async open(): Promise<void> {
    await this.ensure(undefined);
  }

  /**
   * Checks that the bucket still exists and is the incarnation in use. Returns "same",
   * "recreated" when it was missing and was created here, or "replaced" when another node
   * recreated it: either way every lease held under the previous incarnation is void.
   */
  async check(): Promise<"same" | "recreated" | "replaced"> {
    const info = await this.info();
    if (info && info.created === this.inc.created) return "same";
    const before = this.inc;
    if (!info) this.o.log.warn({ bucket: this.o.name, floor: before.floor }, "lease bucket is missing: recreating it");
    await this.ensure(before.created ? before.floor : undefined);
    this.recreations++;
    this.o.log.warn({ bucket: this.o.name, floor: this.inc.floor, previousFloor: before.floor, createdHere: !info }, "lease bucket replaced: every lease of the old bucket is void; acquiring again under the new epoch floor");
    return info ? "replaced" : "recreated";
  }

  private async info(): Promise<Incarnation | null> {
    try {
      const si = await this.o.jsm.streams.info(this.stream);
      return { created: si.created, floor: parseFloor(si.config.description), ttlMs: Math.round((si.config.max_age ?? 0) / 1e6) };
    } catch (e) {
      if (/not found/i.test(String((e as Error)?.message ?? e))) return null;
      throw e;
    }
  }

  private async ensure(knownFloor: number | undefined): Promise<void> {
    const existing = await this.info();
    let floor = existing?.floor ?? 0;
    if (!existing) {
      const recorded = await this.o.maxRecordedEpoch();
      // A fresh cluster (nothing ever claimed, no floor known) keeps epoch = revision.
      floor = recorded === 0 && knownFloor === undefined ? 0
        : Math.max((Math.floor(recorded / EPOCH_SPAN) + 1) * EPOCH_SPAN, (knownFloor ?? 0) + EPOCH_SPAN);
      if (!Number.isSafeInteger(floor + EPOCH_SPAN)) throw new AxError("AX_E_INTERNAL", `lease epoch floor ${floor} would leave the safe-integer range: reset shards.epoch with the cluster stopped`, { field: "epoch", value: floor });
    }
    // Kvm.create binds to an existing bucket as it is (its own description, TTL) and creates a missing one.
    // Recreated as the bucket was: the TTL of the incarnation in use (the one nodes act on), if any.
    const opts = { ttl: this.inc.ttlMs > 0 ? this.inc.ttlMs : this.o.ttlMs, history: 1, replicas: this.o.replicas, description: `ax shard leases; epoch floor ${floor}` };
    try {
      this.kv = await new Kvm(this.o.nc).create(this.o.name, opts);
    } catch (e) {
      // Another node recreated it first (with its own floor): bind to theirs.
      if (!/already in use|exists/i.test(String((e as Error)?.message ?? e))) throw e;
      this.kv = await new Kvm(this.o.nc).create(this.o.name, opts);
    }
    const info = await this.info();
    if (!info) throw new AxError("AX_E_UNAVAILABLE", `lease bucket ${this.o.name} vanished while being opened`, { field: "bucket", value: this.o.name });
    this.inc = info;
  }
}

export function parseFloor(description: string | undefined): number {
  const m = FLOOR_RE.exec(description ?? "");
  return m ? Number(m[1]) : 0;
}
