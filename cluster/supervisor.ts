import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import type { KV } from "@nats-io/kv";
import type { Clock, Logger, Names } from "../common/index.ts";
import { decode, encode } from "../protocol/index.ts";
import { z } from "zod";
import type { Store } from "../actors/index.ts";
import { LeaseTable } from "./leases.ts";
import { Membership, type Member } from "./membership.ts";
import { assignShards, planMoves } from "./ring.ts";

export interface ShardHandle {
  readonly shard: number;
  readonly epoch: number;
  stop(): Promise<void>;
  fence(): void;
}

export interface SupervisorOptions {
  nodeId: string;
  httpAddress: string | null;
  shardCount: number;
  leaseTtlMs: number;
  heartbeatMs: number;
  nc: NatsConnection;
  kv: KV;
  store: Store;
  names: Names;
  clock: Clock;
  log: Logger;
  /** Starts the actor of an acquired shard (lease held, epoch recorded in PostgreSQL). */
  startShard: (shard: number, epoch: number) => Promise<ShardHandle>;
  load: () => { firedPerSec: number; inFlight: number; lagMs: number };
}

const HandoverSchema = z.object({ v: z.literal(1), shard: z.number().int(), from: z.string(), to: z.string().nullable() });

/**
 * Keeps this node's shards equal to what the assignment says it should own.
 *
 * Node lifecycle: joining (listens to heartbeats for two intervals before claiming anything,
 * so nodes started together see each other and agree) → member (reconciles every heartbeat
 * and whenever membership or a hand-over changes) → draining (owns nothing new, releases
 * everything) → stopping (releases its leases, last heartbeat says so).
 *
 * Per shard: unowned → (lease create ok, epoch claimed in PostgreSQL) → owned → either
 * released on a planned move (actor stopped and flushed first, then the lease deleted and a
 * hand-over notice published so the target acquires at once) or lost (renewal failed or the
 * monotonic clock says the lease may have expired: the actor is fenced before anything else).
 */
export class ShardSupervisor {
  private readonly leases: LeaseTable;
  private readonly members: Membership;
  private readonly owned = new Map<number, ShardHandle>();
  private readonly hints = new Map<number, { to: string; atMono: number }>();
  private timer: ReturnType<Clock["setTimeout"]> | null = null;
  private sub: Subscription | null = null;
  private startedMono = 0;
  private reconciling: Promise<void> | null = null;
  private again = false;
  private stopping = false;
  private lastRenewMono = 0;
  private drained = new Set<string>();
  private pins = new Map<number, string>();
  readonly startedAt: number;

  constructor(private readonly o: SupervisorOptions) {
    this.leases = new LeaseTable(o.kv, o.nodeId, o.leaseTtlMs, o.clock, o.log);
    this.members = new Membership(o.nc, o.names, o.clock, o.log, o.heartbeatMs);
    this.startedAt = o.clock.now();
  }

  get nodeId(): string { return this.o.nodeId; }
  ownedShards(): number[] { return [...this.owned.keys()].sort((a, b) => a - b); }
  liveMembers(): Member[] { return this.members.live(); }
  leaseValid(shard: number): boolean { return this.leases.isValid(shard) && !this.stopping; }

  async start(): Promise<void> {
    this.startedMono = this.o.clock.monotonic();
    this.members.start(() => this.kick());
    this.sub = this.o.nc.subscribe(`${this.o.names.heartbeatSubject}.handover`, {
      callback: (err, msg) => {
        if (err) return;
        const d = decode(HandoverSchema, msg.data);
        if (!d.ok) return;
        if (d.value.to) this.hints.set(d.value.shard, { to: d.value.to, atMono: this.o.clock.monotonic() });
        this.kick();
      },
    });
    this.beat();
    this.loop();
  }

  private beat(): void {
    this.members.publish({
      v: 1, id: this.o.nodeId, http: this.o.httpAddress, startedAt: this.startedAt, shards: this.ownedShards(),
      load: this.o.load(), stopping: this.stopping,
    });
  }

  private loop(): void {
    this.timer = this.o.clock.setTimeout(() => {
      if (this.stopping) return;
      this.beat();
      this.kick();
      this.loop();
    }, this.o.heartbeatMs);
  }

  /** Runs a reconcile now (or right after the running one). */
  kick(): void {
    if (this.stopping) return;
    if (this.reconciling) { this.again = true; return; }
    this.reconciling = this.reconcile().catch((e) => this.o.log.error({ err: String(e) }, "reconcile failed"))
      .finally(() => { this.reconciling = null; if (this.again) { this.again = false; this.kick(); } });
  }

  /** The assignment every node computes from the same view. */
  async desired(opts: { sticky: boolean } = { sticky: true }): Promise<{ target: Map<number, string>; owners: Map<number, string>; nodes: string[] }> {
    const live = new Set(this.members.live().map((m) => m.id));
    if (!this.stopping) live.add(this.o.nodeId);
    const nodes = [...live].filter((n) => !this.drained.has(n));
    const owners = await this.leases.owners();
    const sticky = new Map<number, string>();
    if (opts.sticky) {
      for (const [s, n] of owners) if (live.has(n)) sticky.set(s, n);
      const fresh = this.o.clock.monotonic() - 3 * this.o.heartbeatMs;
      for (const [s, h] of this.hints) {
        if (h.atMono < fresh) { this.hints.delete(s); continue; }
        if (!owners.has(s) && live.has(h.to)) sticky.set(s, h.to);
      }
    }
    return { target: assignShards({ shardCount: this.o.shardCount, nodes, owners: sticky, pins: this.pins }), owners, nodes };
  }

  private async reconcile(): Promise<void> {
    const now = this.o.clock.monotonic();
    // Renew first: a lease that may have expired stops its shard before anything else runs.
    if (now - this.lastRenewMono >= this.o.leaseTtlMs / 3 || [...this.owned.keys()].some((s) => !this.leases.isValid(s))) {
      const lost = await this.leases.renewAll();
      this.lastRenewMono = this.o.clock.monotonic();
      for (const s of lost) {
        const h = this.owned.get(s);
        this.owned.delete(s);
        h?.fence();
        this.o.log.warn({ shard: s, epoch: h?.epoch }, "lease:lost");
      }
    }
    this.members.sweep();
    await this.refreshOperatorState();
    if (now - this.startedMono < 2 * this.o.heartbeatMs) return; // joining: learn who else is here first
    const { target, owners } = await this.desired();
    for (const [s, h] of [...this.owned]) {
      if (target.get(s) !== this.o.nodeId) await this.release(s, h, target.get(s) ?? null);
    }
    const toAcquire = [...target].filter(([s, n]) => n === this.o.nodeId && !this.owned.has(s) && !owners.has(s)).map(([s]) => s);
    await Promise.all(toAcquire.map((s) => this.acquire(s)));
  }

  private async refreshOperatorState(): Promise<void> {
    const rows = await this.o.store.listShards();
    this.pins = new Map(rows.filter((r) => r.pinnedTo).map((r) => [r.shard, r.pinnedTo!]));
    const r = await this.o.store.pool.query("select value from meta where key = 'drained'");
    this.drained = new Set((r.rows[0]?.value as string[] | undefined) ?? []);
  }

  private async acquire(shard: number): Promise<void> {
    const lease = await this.leases.acquire(shard);
    if (!lease) return;
    try {
      const claimed = await this.o.store.claimShard(shard, this.o.nodeId, lease.epoch, this.o.clock.now());
      if (!claimed) throw new Error(`epoch ${lease.epoch} not newer than the recorded one`);
      const handle = await this.o.startShard(shard, lease.epoch);
      this.owned.set(shard, handle);
    } catch (e) {
      this.o.log.error({ shard, epoch: lease.epoch, err: String(e) }, "could not start acquired shard; releasing");
      await this.leases.release(shard);
    }
  }

  private async release(shard: number, h: ShardHandle, to: string | null): Promise<void> {
    this.owned.delete(shard);
    await h.stop();
    await this.leases.release(shard);
    this.o.nc.publish(`${this.o.names.heartbeatSubject}.handover`, encode({ v: 1, shard, from: this.o.nodeId, to }));
    this.o.log.info({ shard, epoch: h.epoch, to }, "shard:handed-over");
  }

  /**
   * A shard actor stopped on its own (stale epoch, or a round that could not be written):
   * forget it and give the lease up, so the next reconcile acquires it afresh under a new
   * epoch and reloads it from PostgreSQL.
   */
  async dropShard(shard: number): Promise<void> {
    if (!this.owned.delete(shard)) return;
    await this.leases.release(shard);
    this.kick();
  }

  /** Moves per the non-sticky ideal assignment (what `ax shards rebalance` applies). */
  async rebalancePlan(): Promise<Array<{ shard: number; from: string | null; to: string; why: string }>> {
    const { target, owners } = await this.desired({ sticky: false });
    return planMoves(owners, target).map((m) => ({ ...m, why: this.pins.get(m.shard) === m.to ? "pinned by an operator" : m.from ? "ring order with load bound prefers the target" : "unowned" }));
  }

  /** Asks the owner of `shard` to hand it to `to` (any node may call; the owner acts). */
  requestHandover(shard: number, to: string): void {
    this.o.nc.publish(`${this.o.names.heartbeatSubject}.handover.request`, encode({ v: 1, shard, from: "", to }));
  }

  /** Executes a hand-over request addressed to a shard this node owns. */
  async handover(shard: number, to: string): Promise<boolean> {
    const h = this.owned.get(shard);
    if (!h) return false;
    this.hints.set(shard, { to, atMono: this.o.clock.monotonic() });
    await this.release(shard, h, to);
    return true;
  }

  async stop(): Promise<void> {
    this.stopping = true;
    if (this.timer) this.o.clock.clearTimeout(this.timer);
    await this.reconciling?.catch(() => undefined);
    for (const [s, h] of [...this.owned]) await this.release(s, h, null);
    this.beat();
    this.members.stop();
    this.sub?.unsubscribe();
  }
}
