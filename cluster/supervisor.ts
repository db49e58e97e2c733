import { createHmac, timingSafeEqual } from "node:crypto";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import type { Clock, Logger, Names } from "../common/index.ts";
import { decode, encode } from "../protocol/index.ts";
import { z } from "zod";
import type { Store } from "../actors/index.ts";
import { LeaseTable, LeaseView } from "./leases.ts";
import type { LeaseBucket } from "./leaseBucket.ts";
import { Membership, type Member } from "./membership.ts";
import { assignShards, planMoves } from "./ring.ts";

export interface ShardHandle {
  readonly shard: number;
  readonly epoch: number;
  stop(): Promise<void>;
  /** Stops the actor at once (nothing more fires or is written); `reason` is logged. */
  fence(reason?: string): void;
}

export interface SupervisorOptions {
  nodeId: string;
  httpAddress: string | null;
  shardCount: number;
  leaseTtlMs: number;
  heartbeatMs: number;
  nc: NatsConnection;
  /** The lease bucket, opened; checked every `bucketCheckMs` and recreated if deleted. */
  bucket: LeaseBucket;
  /** How often the bucket's existence is checked (default 1 s; also at once when a renewal fails). */
  bucketCheckMs?: number;
  store: Store;
  names: Names;
  clock: Clock;
  log: Logger;
  /**
   * Starts the actor of an acquired shard (lease held, epoch recorded in PostgreSQL).
   * `afterFailure`: the shard's last actor here stopped on a failure (a start or a round) within
   * START_BACKOFF.resetAfterMs: what it was handed back may hold the cause (see ShardActorDeps.careful).
   */
  startShard: (shard: number, epoch: number, opts: { afterFailure: boolean }) => Promise<ShardHandle>;
  load: () => { firedPerSec: number; inFlight: number; lagMs: number };
  /**
   * Dependencies this node cannot reach (name → reason). Published in the heartbeat, and
   * while anything is failing no shard is acquired: a start would fail, and every attempt
   * takes a lease and bumps its epoch for nothing.
   */
  failing?: () => Record<string, string>;
  /** Told when the lease bucket was replaced (`createdHere`: this node recreated it). */
  onBucketReplaced?: (createdHere: boolean) => void;
  /** Told of each lease renewal's result and of each lease lost (metrics). */
  onLease?: (e: "ok" | "refused" | "unanswered" | "lost") => void;
  /**
   * The key rebalance plans are signed with (controlKey(dispatch secret)): only a holder of the
   * cluster's secret — a node, which reads it from PostgreSQL — can make a plan others act on.
   */
  controlKey: Uint8Array;
  /** A refused control message or a passed-over node (counted and logged once per cause per interval by the caller). */
  onRefused?: (cause: string, e: Error) => void;
}

/** Back-off of a shard whose start (or whose rounds) failed: full jitter over base·2ⁿ, capped. */
export const START_BACKOFF = { baseMs: 100, capMs: 1000, resetAfterMs: 30_000 };

/** "I released `shard`; `to` should take it now" (core NATS, best effort: the lease bucket is the truth). */
const HandoverSchema = z.object({ v: z.literal(1), shard: z.number().int().nonnegative(), from: z.string().max(256), to: z.string().max(256).nullable() });
/**
 * A planned set of moves (`ax shards rebalance`): every node treats them as pins until they are
 * done or expire. Signed (`mac`) by the node that sent it (`from`, at its wall time `at`).
 */
const PlanSchema = z.object({
  v: z.literal(1), id: z.string().max(256), from: z.string().min(1).max(256), at: z.number().int().nonnegative(),
  ttlMs: z.number().int().positive().max(600_000),
  moves: z.array(z.object({ shard: z.number().int().nonnegative(), to: z.string().max(256) })).max(100_000),
  mac: z.string().max(128),
});
type Plan = z.infer<typeof PlanSchema>;

/** The control-message key derived from the cluster's dispatch secret (a different purpose, a different key). */
export function controlKey(dispatchSecret: Uint8Array): Uint8Array {
  return createHmac("sha256", dispatchSecret).update("ax-control-plan-v1").digest();
}

/** The signature of a plan: HMAC-SHA256 over every field but `mac`, in a fixed order. */
export function signPlan(key: Uint8Array, p: Omit<Plan, "mac">): string {
  return createHmac("sha256", key).update(JSON.stringify([p.v, p.id, p.from, p.at, p.ttlMs, p.moves.map((m) => [m.shard, m.to])])).digest("base64url");
}

/** How far a plan's `at` may be from the receiver's clock (skew between machines). */
const PLAN_SKEW_MS = 30_000;
/**
 * Bounds on control messages (a hint or plan beyond them is refused, counted and logged once
 * per cause per interval): at most MAX_PLANS plans kept at once (a new one beyond that is
 * refused until one finishes or expires), each with at most one move per shard, every shard
 * within 0..shardCount−1; a message is read only if its size fits what a valid one can take.
 */
export const CONTROL_LIMITS = { maxPlans: 16, hintBytes: 1024, planBytesPerShard: 300, planBytesBase: 1024 };
export type PlannedMove = { shard: number; from: string | null; to: string; why: string };
/** How many shard actors one node starts or stops at the same time. */
const PARALLEL = 8;

/**
 * Keeps this node's shards equal to what the assignment says it should own.
 *
 * Node lifecycle: joining (listens to heartbeats for two intervals — on an empty cluster for
 * up to five — before claiming anything, so nodes started together see each other and
 * agree; its heartbeats say `ready: false`, and nobody hands it a shard yet) → member
 * (reconciles every heartbeat and whenever membership, a lease or a hand-over changes) →
 * draining (owns nothing new, releases everything) → stopping (says so in a heartbeat first,
 * then releases its leases with a hand-over hint each). A node that finds it was paused (the
 * heartbeat timer fired far too late) has already lost its leases and joins again.
 *
 * Per shard: unowned → (lease create ok, epoch claimed in PostgreSQL, actor loaded) → owned →
 * either released on a planned move (actor stopped and flushed first, then the lease deleted
 * and a hand-over hint published so the target acquires at once) or lost (renewal failed or
 * the monotonic clock says the lease may have expired: the actor is fenced before anything
 * else, and its writes would be refused by PostgreSQL anyway).
 *
 * Renewal runs on its own timer, never behind a reconcile that is busy starting shards.
 */
export class ShardSupervisor {
  private readonly leases: LeaseTable;
  private readonly view: LeaseView;
  private readonly members: Membership;
  private readonly owned = new Map<number, ShardHandle>();
  /** Shards being acquired or released right now. */
  private readonly busy = new Map<number, Promise<void>>();
  private readonly hints = new Map<number, { to: string; atMono: number }>();
  private readonly plans = new Map<string, { moves: Map<number, string>; untilMono: number }>();
  private beatTimer: ReturnType<Clock["setTimeout"]> | null = null;
  private renewTimer: ReturnType<Clock["setTimeout"]> | null = null;
  private wakeTimer: { h: ReturnType<Clock["setTimeout"]>; at: number } | null = null;
  private subs: Subscription[] = [];
  private joinedFromMono = 0;
  private joinMs = 0;
  private lastTickMono = 0;
  private reconciling: Promise<void> | null = null;
  private again = false;
  private stopping = false;
  private closed = false;
  private drained = new Set<string>();
  private pins = new Map<number, string>();
  private lastRefreshMono = -Infinity;
  private refreshNeeded = true;
  readonly startedAt: number;
  readonly stats = { acquired: 0, released: 0, lost: 0, pauses: 0, startFailures: 0 };
  /** Shards whose last start or rounds failed: not tried again before `retryAtMono`. */
  private readonly failures = new Map<number, { n: number; retryAtMono: number; lastMono: number }>();
  private gateLogged = false;
  private pinsUnreadable = false;

  constructor(private readonly o: SupervisorOptions) {
    // A renewal that fails may mean the bucket is gone: look at once rather than at the next check.
    this.leases = new LeaseTable(o.bucket, o.nodeId, o.leaseTtlMs, o.clock, o.log, (r) => { o.onLease?.(r); if (r !== "ok") void this.checkBucket(); });
    this.view = new LeaseView(o.bucket, o.leaseTtlMs, o.clock, o.log);
    this.members = new Membership(o.nc, o.names, o.clock, o.log, o.heartbeatMs, 3, (cause, e) => this.refuse(cause, e.message));
    this.startedAt = o.clock.now();
  }

  get nodeId(): string { return this.o.nodeId; }
  get leaseTtlMs(): number { return this.o.leaseTtlMs; }
  ownedShards(): number[] { return [...this.owned.keys()].sort((a, b) => a - b); }
  liveMembers(): Member[] { return this.members.live(); }
  leaseValid(shard: number): boolean { return !this.stopping && this.leases.isValid(shard); }
  /** How much longer the shard's lease may be acted on without another renewal (0: not valid, or the node is stopping). */
  leaseRemainingMs(shard: number): number { return this.stopping ? 0 : this.leases.remainingMs(shard); }
  /** Joining: not claiming yet (see the class comment). */
  joining(): boolean { return this.o.clock.monotonic() - this.joinedFromMono < this.joinMs; }

  private get hb(): string { return this.o.names.heartbeatSubject; }

  async start(): Promise<void> {
    this.view.onChange = () => this.kick();
    await this.view.start();
    this.rejoin();
    // A cold cluster (no lease held by anyone): wait longer, so nodes started together agree.
    if (this.view.owners().size === 0) this.joinMs = Math.max(this.joinMs, Math.min(this.o.leaseTtlMs / 2, 5 * this.o.heartbeatMs));
    this.members.start(() => this.kick());
    const sub = (subject: string, fn: (data: Uint8Array) => void) => this.subs.push(this.o.nc.subscribe(subject, { callback: (err, msg) => { if (!err) fn(msg.data); } }));
    sub(`${this.hb}.handover`, (data) => {
      if (data.length > CONTROL_LIMITS.hintBytes) { this.refuse("handover", `${data.length} bytes (at most ${CONTROL_LIMITS.hintBytes})`); return; }
      const d = decode(HandoverSchema, data);
      if (!d.ok) { this.refuse("handover", d.reason); return; }
      if (d.value.shard >= this.o.shardCount) { this.refuse("handover", `shard ${d.value.shard} not in 0..${this.o.shardCount - 1}`); return; }
      if (d.value.to) this.hints.set(d.value.shard, { to: d.value.to, atMono: this.o.clock.monotonic() });
      this.kick();
    });
    sub(`${this.hb}.plan`, (data) => {
      const maxBytes = CONTROL_LIMITS.planBytesBase + CONTROL_LIMITS.planBytesPerShard * this.o.shardCount;
      if (data.length > maxBytes) { this.refuse("plan", `${data.length} bytes (at most ${maxBytes})`); return; }
      const d = decode(PlanSchema, data);
      if (!d.ok) { this.refuse("plan", d.reason); return; }
      const moves = new Map<number, string>();
      for (const m of d.value.moves) {
        if (m.shard >= this.o.shardCount) { this.refuse("plan", `shard ${m.shard} not in 0..${this.o.shardCount - 1}`); return; }
        if (moves.has(m.shard)) { this.refuse("plan", `shard ${m.shard} moved twice`); return; }
        moves.set(m.shard, m.to);
      }
      // Sender authority: signed with the cluster's key, sent by a live member that is not
      // passed over, recently (a plan copied off the wire is replayable only within its TTL),
      // and only moves to live members take effect.
      const p = d.value;
      const mac = Buffer.from(p.mac);
      const want = Buffer.from(signPlan(this.o.controlKey, p));
      if (mac.length !== want.length || !timingSafeEqual(mac, want)) { this.refuse("plan", `plan ${p.id.slice(0, 64)} is not signed by a cluster node`); return; }
      const live = new Set(this.members.live().map((m) => m.id)).add(this.o.nodeId);
      for (const g of this.passedOver()) live.delete(g);
      if (!live.has(p.from)) { this.refuse("plan", `plan sender ${p.from.slice(0, 64)} is not a live member`); return; }
      const ageMs = this.o.clock.now() - p.at;
      if (ageMs > p.ttlMs + PLAN_SKEW_MS || ageMs < -PLAN_SKEW_MS) { this.refuse("plan", `plan ${p.id.slice(0, 64)} sent ${Math.round(ageMs)} ms ago (ttl ${p.ttlMs} ms)`); return; }
      const dead = [...moves].filter(([, to]) => !live.has(to));
      if (dead.length) {
        this.refuse("plan", `plan ${p.id.slice(0, 64)} moves ${dead.length} shard(s) to nodes that are not live members (${dead[0]![1].slice(0, 64)}…); those moves are dropped`);
        for (const [s] of dead) moves.delete(s);
        if (!moves.size) return;
      }
      this.dropExpiredPlans();
      if (!this.plans.has(d.value.id) && this.plans.size >= CONTROL_LIMITS.maxPlans) { this.refuse("plan", `${this.plans.size} plans in progress (at most ${CONTROL_LIMITS.maxPlans})`); return; }
      this.plans.set(d.value.id, { moves, untilMono: this.o.clock.monotonic() + d.value.ttlMs });
      this.kick();
    });
    // `ax shards move/unpin`, `ax node drain`: operator state changed in PostgreSQL.
    sub(`${this.hb}.kick`, () => { this.refreshNeeded = true; this.kick(); });
    this.lastTickMono = this.o.clock.monotonic();
    this.beat();
    this.loop();
    this.renewLoop();
    this.bucketLoop();
  }

  private bucketTimer: ReturnType<Clock["setTimeout"]> | null = null;
  private checkingBucket: Promise<void> | null = null;
  private bucketUnchecked = false;
  private bucketLoop(): void {
    const ms = this.o.bucketCheckMs ?? 1000;
    this.bucketTimer = this.o.clock.setTimeout(() => {
      if (this.stopping) return;
      void this.checkBucket().finally(() => { if (!this.stopping) this.bucketLoop(); });
    }, ms);
  }

  /**
   * A deleted lease bucket is recreated (LeaseBucket.check). Once it is replaced — here or by
   * another node — every lease held in the old one is void: its shards are fenced at once
   * (another node may take the new key right away, under a higher epoch), the view of who
   * holds what starts over from the new bucket, and the shards are acquired again.
   */
  checkBucket(): Promise<void> {
    if (this.stopping) return Promise.resolve();
    this.checkingBucket ??= (async () => {
      try {
        const r = await this.o.bucket.check();
        if (this.bucketUnchecked) this.o.log.info("lease bucket check answers again");
        this.bucketUnchecked = false;
        if (r !== "same") this.o.onBucketReplaced?.(r === "recreated");
        if (r !== "same" && !this.stopping) {
          for (const s of this.leases.voidAll()) { this.o.onLease?.("lost"); this.lose(s, "lease bucket replaced"); }
          await this.view.restart();
          this.kick();
        }
      } catch (e) {
        // Once per streak: NATS being down has its own dependency line.
        if (!this.bucketUnchecked) this.o.log.warn({ err: String(e) }, "could not check the lease bucket; retrying");
        this.bucketUnchecked = true;
      } finally { this.checkingBucket = null; }
    })();
    return this.checkingBucket;
  }

  private rejoin(): void {
    this.joinedFromMono = this.o.clock.monotonic();
    this.joinMs = 2 * this.o.heartbeatMs;
  }

  private beat(): void {
    this.members.publish({
      v: 1, id: this.o.nodeId, http: this.o.httpAddress, startedAt: this.startedAt, shards: this.ownedShards(),
      load: this.o.load(), stopping: this.stopping, ready: !this.stopping && !this.joining(), failing: this.o.failing?.() ?? {},
    });
  }

  private loop(): void {
    this.beatTimer = this.o.clock.setTimeout(() => {
      if (this.stopping) return;
      const now = this.o.clock.monotonic();
      const gap = now - this.lastTickMono;
      this.lastTickMono = now;
      if (gap > Math.max(4 * this.o.heartbeatMs, this.leases.validForMs)) {
        // This process was paused (SIGSTOP, VM freeze, a huge GC): nothing it remembers about
        // others is current. Leases are checked (and found lost) by the renewal; here the
        // node waits as if joining, so its view of members and leases catches up first.
        this.stats.pauses++;
        this.o.log.warn({ pausedMs: Math.round(gap) }, "node was paused: rejoining");
        this.members.touchAll();
        this.rejoin();
        void this.renew();
      }
      this.beat();
      this.kick();
      this.loop();
    }, this.o.heartbeatMs);
  }

  /** Renews every TTL/3, also while stopping (until the leases are handed back). */
  private renewLoop(): void {
    this.renewTimer = this.o.clock.setTimeout(() => {
      if (this.closed) return;
      void this.renew().finally(() => { if (!this.closed) this.renewLoop(); });
    }, Math.max(50, Math.floor(this.o.leaseTtlMs / 3)));
  }

  private renewing: Promise<void> | null = null;
  private renew(): Promise<void> {
    this.renewing ??= (async () => {
      try {
        const lost = await this.leases.renewAll();
        for (const s of lost) { this.o.onLease?.("lost"); this.lose(s, "renewal refused or lease too old"); }
        if (lost.length) this.kick();
      } catch (e) {
        this.o.log.error({ err: String(e) }, "lease renewal failed");
      } finally { this.renewing = null; }
    })();
    return this.renewing;
  }

  private lose(shard: number, why: string): void {
    const h = this.owned.get(shard);
    this.owned.delete(shard);
    this.leases.forget(shard);
    if (!h) return;
    h.fence();
    this.stats.lost++;
    this.o.log.warn({ shard, epoch: h.epoch, why }, "lease:lost");
  }

  /** Runs a reconcile now (or right after the running one). */
  kick(): void {
    if (this.stopping) return;
    this.givePostgresLessShardsUp();
    if (this.reconciling) { this.again = true; return; }
    this.reconciling = this.reconcile().catch((e) => this.o.log.error({ err: String(e) }, "reconcile failed"))
      .finally(() => { this.reconciling = null; if (this.again) { this.again = false; this.kick(); } });
  }

  private refuse(cause: string, reason: string): void {
    if (this.o.onRefused) this.o.onRefused(cause, new Error(reason));
    else this.o.log.warn({ cause, reason }, "control message refused");
  }

  private dropExpiredPlans(): void {
    const now = this.o.clock.monotonic();
    for (const [id, p] of this.plans) if (p.untilMono < now) this.plans.delete(id);
  }

  /** Operator pins, then the planned moves of a rebalance still in progress. */
  private effectivePins(live: Set<string>): Map<number, string> {
    const pins = new Map(this.pins);
    this.dropExpiredPlans();
    for (const p of this.plans.values()) for (const [s, to] of p.moves) if (!pins.has(s) && live.has(to)) pins.set(s, to);
    return pins;
  }

  /**
   * Ghost nodes: a member that the assignment gives shards to but that holds no lease at all
   * for longer than `ghostAfterMs` (its heartbeats arrive, it never acquires — a forged or
   * wedged node) is passed over: left out of everyone's assignment, so its shards go to the
   * nodes that do take them. Logged and counted once per pass-over (cause "ghost-node"). It
   * gets another chance after a penalty that doubles with each pass-over (from 30 s, at most
   * 10 min), at once if it is seen holding a lease, and is forgotten when it leaves.
   */
  private readonly ghosts = new Map<string, { pendingSinceMono: number | null; passedUntilMono: number; strikes: number }>();
  get ghostAfterMs(): number { return Math.max(2 * this.o.leaseTtlMs + 5 * this.o.heartbeatMs, 10 * this.o.heartbeatMs); }

  /** Nodes passed over right now. */
  passedOver(): string[] {
    const now = this.o.clock.monotonic();
    return [...this.ghosts].filter(([, g]) => g.passedUntilMono > now).map(([id]) => id).sort();
  }

  /** Updates the ghost bookkeeping from the assignment just computed; true if a node was newly passed over. */
  private watchGhosts(target: Map<number, string>, owners: Map<number, string>): boolean {
    const now = this.o.clock.monotonic();
    const holding = new Set(owners.values());
    const assigned = new Set(target.values());
    for (const id of this.ghosts.keys()) if (!this.members.get(id)) this.ghosts.delete(id);
    let passed = false;
    for (const m of this.members.live()) {
      if (m.id === this.o.nodeId) continue;
      let g = this.ghosts.get(m.id);
      if (holding.has(m.id)) { if (g) { g.pendingSinceMono = null; g.passedUntilMono = 0; } continue; }
      if (g && g.passedUntilMono > now) continue;
      if (!assigned.has(m.id)) { if (g) g.pendingSinceMono = null; continue; }
      if (!g) { g = { pendingSinceMono: null, passedUntilMono: 0, strikes: 0 }; this.ghosts.set(m.id, g); }
      g.pendingSinceMono ??= now;
      if (now - g.pendingSinceMono <= this.ghostAfterMs) continue;
      const penaltyMs = Math.min(600_000, 30_000 * 2 ** Math.min(g.strikes, 10));
      g.strikes++;
      g.pendingSinceMono = null;
      g.passedUntilMono = now + penaltyMs;
      passed = true;
      this.refuse("ghost-node", `node ${m.id.slice(0, 64)} was given shards but took no lease within ${this.ghostAfterMs} ms; passed over for ${penaltyMs} ms`);
    }
    return passed;
  }

  /** The assignment every node computes from the same view. */
  desired(opts: { sticky: boolean } = { sticky: true }): { target: Map<number, string>; owners: Map<number, string>; nodes: string[]; live: Set<string> } {
    const live = new Set(this.members.live().map((m) => m.id));
    for (const g of this.passedOver()) live.delete(g);
    if (this.stopping) live.delete(this.o.nodeId); else live.add(this.o.nodeId);
    let nodes = [...live].filter((n) => !this.drained.has(n));
    // A node that cannot reach PostgreSQL (its heartbeat says so) cannot write a round: left out,
    // so its shards go to nodes that can instead of waiting for it (a node cut off from PostgreSQL
    // alone still heartbeats). Unless every node fails it: then nobody can do better, and the
    // assignment stays as it was. (Without Redis a node's wheels keep firing; without NATS it
    // sends no heartbeat and drops out anyway.)
    const able = nodes.filter((n) => !this.failsPostgres(n));
    if (able.length) nodes = able;
    const owners = this.view.owners();
    for (const s of this.leases.heldShards()) owners.set(s, this.o.nodeId);
    const sticky = new Map<number, string>();
    if (opts.sticky) {
      for (const [s, n] of owners) if (live.has(n)) sticky.set(s, n);
      const fresh = this.o.clock.monotonic() - Math.max(3 * this.o.heartbeatMs, this.o.leaseTtlMs);
      for (const [s, h] of this.hints) {
        if (h.atMono < fresh) { this.hints.delete(s); continue; }
        if (!owners.has(s) && live.has(h.to)) sticky.set(s, h.to);
      }
    }
    const pins = opts.sticky ? this.effectivePins(new Set(nodes)) : this.pins;
    return { target: assignShards({ shardCount: this.o.shardCount, nodes, owners: sticky, pins }), owners, nodes, live };
  }

  private failsPostgres(n: string): boolean {
    return (n === this.o.nodeId ? this.o.failing?.() : this.members.get(n)?.failing)?.postgres !== undefined;
  }

  private async reconcile(): Promise<void> {
    if (this.stopping) return;
    this.members.sweep();
    await this.refreshOperatorState();
    // Safety net: an actor whose lease is not (or no longer) the one it was started under.
    for (const [s, h] of [...this.owned]) if (this.leases.get(s)?.epoch !== h.epoch || !this.leases.isValid(s)) this.lose(s, "lease not held");
    if (this.joining() || this.stopping) return;
    let { target, owners, nodes, live } = this.desired();
    if (this.watchGhosts(target, owners)) ({ target, owners, nodes, live } = this.desired());
    if (!nodes.length) return; // everyone drained: keep what is owned rather than stop everything
    this.finishPlans(owners);
    // Nor to a node that says it cannot reach a server: after a partition heals, a node still
    // reconnecting was handed shards it could not take, and they sat unowned until its lease
    // view caught up (3 s at TTL 3 s).
    const notReady = new Set(this.members.live().filter((m) => m.ready === false || Object.keys(m.failing ?? {}).length > 0).map((m) => m.id));
    for (const [s, h] of [...this.owned]) {
      const to = target.get(s);
      if (to === undefined || to === this.o.nodeId || this.busy.has(s)) continue;
      if (notReady.has(to)) continue; // hand it over once the target is ready to take it at once
      this.track(s, () => this.release(s, h, to));
    }
    const now = this.o.clock.monotonic();
    const failing = this.o.failing?.() ?? {};
    const gated = Object.keys(failing).length > 0;
    if (gated !== this.gateLogged) {
      this.gateLogged = gated;
      if (gated) this.o.log.warn({ failing }, "not starting shards until the dependencies answer");
    }
    let retryAt: number | null = null;
    for (const [s, n] of target) {
      if (gated) break;
      if (n !== this.o.nodeId || this.owned.has(s) || this.busy.has(s)) continue;
      const hinted = this.hints.get(s)?.to === this.o.nodeId;
      if (owners.has(s) && !(hinted && owners.get(s) !== this.o.nodeId)) continue; // someone else's until it is released or expires
      const f = this.failures.get(s);
      if (f && f.retryAtMono > now) { retryAt = Math.min(retryAt ?? Infinity, f.retryAtMono); continue; }
      this.track(s, () => this.acquire(s));
    }
    if (retryAt !== null) this.wakeAt(retryAt, now);
    // Wake up when the next lease of a node that is gone runs out, not a heartbeat later.
    const next = this.view.nextExpiryMono((owner) => owner !== this.o.nodeId && !live.has(owner));
    if (next !== null) this.wakeAt(next + 5, now);
  }

  private wakeAt(at: number, now: number): void {
    if (this.wakeTimer && this.wakeTimer.at <= at) return;
    if (this.wakeTimer) this.o.clock.clearTimeout(this.wakeTimer.h);
    this.wakeTimer = { at, h: this.o.clock.setTimeout(() => { this.wakeTimer = null; this.kick(); }, Math.max(0, at - now)) };
  }

  /** Records a failed start (or a shard that stopped on a failed round) and when to try it again. */
  private failed(shard: number): { n: number; delayMs: number } {
    const now = this.o.clock.monotonic();
    const prev = this.failures.get(shard);
    const n = prev && now - prev.lastMono < START_BACKOFF.resetAfterMs ? prev.n + 1 : 1;
    const delayMs = Math.round(Math.random() * Math.min(START_BACKOFF.capMs, START_BACKOFF.baseMs * 2 ** Math.min(n, 20)));
    this.failures.set(shard, { n, retryAtMono: now + delayMs, lastMono: now });
    this.stats.startFailures++;
    return { n, delayMs };
  }

  /** Shards the assignment gives this node that it does not run (yet). */
  unownedAssigned(): number[] {
    if (this.stopping) return [];
    const { target } = this.desired();
    const out: number[] = [];
    for (const [s, n] of target) if (n === this.o.nodeId && !this.owned.has(s)) out.push(s);
    return out.sort((a, b) => a - b);
  }

  /** Runs a per-shard operation without holding up the reconcile; at most PARALLEL run at once. */
  private track(shard: number, fn: () => Promise<void>): void {
    const p = this.slot().then(async (done) => { try { await fn(); } finally { done(); } })
      .catch((e) => this.o.log.error({ shard, err: String(e) }, "shard operation failed"))
      .finally(() => { if (this.busy.get(shard) === p) this.busy.delete(shard); this.kick(); });
    this.busy.set(shard, p);
  }

  private running = 0;
  private waiting: Array<() => void> = [];
  private slot(): Promise<() => void> {
    const done = () => { this.running--; this.waiting.shift()?.(); };
    if (this.running < PARALLEL) { this.running++; return Promise.resolve(done); }
    return new Promise((resolve) => this.waiting.push(() => { this.running++; resolve(done); }));
  }

  private finishPlans(owners: Map<number, string>): void {
    for (const [id, p] of this.plans) if ([...p.moves].every(([s, to]) => owners.get(s) === to)) this.plans.delete(id);
  }

  private async refreshOperatorState(): Promise<void> {
    const now = this.o.clock.monotonic();
    if (!this.refreshNeeded && now - this.lastRefreshMono < this.o.heartbeatMs) return;
    this.refreshNeeded = false;
    this.lastRefreshMono = now;
    try {
      const rows = await this.o.store.listShards();
      this.pins = new Map(rows.filter((r) => r.pinnedTo).map((r) => [r.shard, r.pinnedTo!]));
      this.drained = new Set(await this.o.store.drainedNodes());
      this.pinsUnreadable = false;
    } catch (e) {
      // Once per outage: it is retried every heartbeat, and the outage has its own line.
      if (!this.pinsUnreadable) this.o.log.warn({ err: String(e) }, "could not read pins and drains; using the last known");
      this.pinsUnreadable = true;
      this.refreshNeeded = true;
    }
  }

  private async acquire(shard: number): Promise<void> {
    if (this.stopping) return;
    const lease = await this.leases.acquire(shard);
    if (!lease) return;
    let handle: ShardHandle | null = null;
    try {
      const claimed = await this.o.store.claimShard(shard, this.o.nodeId, lease.epoch, this.o.clock.now());
      if (!claimed) throw new Error(`epoch ${lease.epoch} not newer than the one recorded in PostgreSQL (was the lease bucket recreated?)`);
      const f = this.failures.get(shard);
      handle = await this.o.startShard(shard, lease.epoch, { afterFailure: !!f && this.o.clock.monotonic() - f.lastMono < START_BACKOFF.resetAfterMs });
    } catch (e) {
      const { n, delayMs } = this.failed(shard);
      // The first failure of a streak is an error line; the retries of the same outage are
      // debug (the outage itself is one dependency:down line), so a long outage is no flood.
      const line = { shard, epoch: lease.epoch, err: String(e), attempt: n, retryInMs: delayMs };
      if (n === 1) this.o.log.error(line, "could not start acquired shard; releasing, retrying with back-off");
      else this.o.log.debug(line, "could not start acquired shard; releasing, retrying with back-off");
      await this.leases.release(shard);
      return;
    }
    if (this.stopping || this.leases.get(shard)?.epoch !== lease.epoch || !this.leases.isValid(shard)) {
      // Lost (or stopping) while loading: the actor must not run.
      handle.fence();
      if (this.leases.get(shard)?.epoch === lease.epoch) await this.leases.release(shard);
      return;
    }
    this.owned.set(shard, handle);
    this.hints.delete(shard);
    this.stats.acquired++;
    const f = this.failures.get(shard);
    this.o.log.info({ shard, epoch: lease.epoch, ...(f ? { afterFailures: f.n } : {}) }, "shard:owned");
  }

  private async release(shard: number, h: ShardHandle, to: string | null): Promise<void> {
    if (this.owned.get(shard) !== h) return;
    this.owned.delete(shard);
    await h.stop(); // no new fires; the round in progress is written; due times go back to Redis
    await this.leases.release(shard);
    this.o.nc.publish(`${this.hb}.handover`, encode({ v: 1, shard, from: this.o.nodeId, to }));
    this.stats.released++;
    this.o.log.info({ shard, epoch: h.epoch, to }, "shard:handed-over");
  }

  /**
   * A shard actor stopped on its own (stale epoch, or a round that could not be written):
   * forget it and give the lease up, so the next reconcile acquires it afresh under a new
   * epoch and reloads it from PostgreSQL. `epoch` guards against a late call from an actor
   * that was already replaced.
   */
  async dropShard(shard: number, epoch?: number): Promise<void> {
    const h = this.owned.get(shard);
    if (!h || (epoch !== undefined && h.epoch !== epoch)) return;
    this.owned.delete(shard);
    h.fence();
    // It stopped on a failed round (a database or Redis error, usually): load it again after a
    // back-off, not in a loop that takes a new epoch for every attempt.
    this.failed(shard);
    if (this.leases.get(shard)?.epoch === h.epoch) await this.leases.release(shard);
    this.kick();
  }

  /**
   * Cut off from PostgreSQL while another live node reaches it: that node should run the shards,
   * so they are fenced and their leases given up at once (one `shards:given-up` line; the outage
   * has its own). Without this a node cut off from PostgreSQL alone kept renewing its leases while
   * its rounds hung (a blackholed connection answers nothing), and its shards fired nothing for the
   * whole partition. Alone, or when every node fails it, the shards stay and their rounds retry,
   * as before. Checked on every kick (each heartbeat, each dependency change), not inside
   * reconcile: a reconcile reads pins from PostgreSQL and waits as long as PostgreSQL does.
   */
  private givePostgresLessShardsUp(): void {
    const pgDown = this.o.failing?.().postgres;
    if (pgDown === undefined || !this.owned.size) return;
    if (!this.members.live().some((m) => m.id !== this.o.nodeId && !m.stopping && !this.failsPostgres(m.id))) return;
    void this.giveUpAll(`postgres unreachable: ${pgDown}`);
  }

  private async giveUpAll(reason: string): Promise<void> {
    const all = [...this.owned];
    if (!all.length || this.stopping) return;
    this.o.log.warn({ shards: all.map(([s]) => s), epochs: all.map(([, h]) => h.epoch), reason }, "shards:given-up");
    for (const [s, h] of all) { this.owned.delete(s); h.fence(reason); }
    await Promise.allSettled(all.map(async ([s, h]) => { if (this.leases.get(s)?.epoch === h.epoch) await this.leases.release(s); }));
  }

  /** Moves per the non-sticky ideal assignment (what `ax shards rebalance` applies). */
  rebalancePlan(): PlannedMove[] {
    const { target, owners } = this.desired({ sticky: false });
    return planMoves(owners, target).map((m) => ({ ...m, why: this.pins.get(m.shard) === m.to ? "pinned by an operator" : m.from ? "ring order with load bound prefers the target" : "unowned" }));
  }

  /**
   * Publishes planned moves to every node: each treats them as pins until all are done (or
   * `ttlMs` passes), so the owners hand the shards over and no other node reacts to the
   * temporary imbalance by moving further shards.
   */
  requestMoves(moves: Array<{ shard: number; to: string }>, ttlMs = Math.max(10 * this.o.heartbeatMs, 3 * this.o.leaseTtlMs)): string {
    const at = this.o.clock.now();
    const id = `${this.o.nodeId}:${at}:${Math.random().toString(36).slice(2, 8)}`;
    const plan = { v: 1 as const, id, from: this.o.nodeId, at, ttlMs: Math.round(ttlMs), moves };
    if (moves.length) this.o.nc.publish(`${this.hb}.plan`, encode({ ...plan, mac: signPlan(this.o.controlKey, plan) }));
    return id;
  }

  /** Asks the owner of `shard` to hand it to `to` (any node may call; the owner acts). */
  requestHandover(shard: number, to: string): void { this.requestMoves([{ shard, to }]); }

  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true; // no shard fires from here on (leaseValid is false)
    for (const t of [this.beatTimer, this.wakeTimer?.h, this.bucketTimer]) if (t) this.o.clock.clearTimeout(t);
    await this.checkingBucket?.catch(() => undefined);
    await this.reconciling?.catch(() => undefined);
    await Promise.allSettled([...this.busy.values()]);
    // Say so first: the others drop this node from their assignment and take the hand-overs at once.
    this.beat();
    const { target } = this.desired();
    const all = [...this.owned];
    for (let i = 0; i < all.length; i += PARALLEL) {
      await Promise.allSettled(all.slice(i, i + PARALLEL).map(([s, h]) => this.release(s, h, target.get(s) ?? null)));
    }
    this.closed = true;
    if (this.renewTimer) this.o.clock.clearTimeout(this.renewTimer);
    this.beat();
    this.members.stop();
    this.view.stop();
    for (const s of this.subs) s.unsubscribe();
  }
}
