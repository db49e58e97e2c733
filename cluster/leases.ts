import type { KV, KvEntry } from "@nats-io/kv";
import { JetStreamApiError } from "@nats-io/jetstream";
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
 *           last renewal was *sent* (a long GC/VM pause, SIGSTOP): the shard is stopped before
 *           anything else is done, then the lease may be acquired again under a new epoch
 *   released delete(key) with the last revision on a planned hand-over
 * The epoch never changes on renewal: it is the fencing token written to PostgreSQL when the
 * lease is acquired, and every shard write is conditional on it.
 *
 * Operations on one lease are serialised (a renewal in flight and a release never race on
 * the revision: a release that lost that race would fail and leave the target waiting for the
 * whole TTL).
 */
export interface HeldLease { shard: number; epoch: number; revision: number; renewedMono: number }

/**
 * The bucket leases live in (see LeaseBucket): its handle, the epoch floor of its current
 * incarnation (epoch = floor + revision) and a token that changes when it is replaced.
 */
export interface LeaseSource { readonly kv: KV; readonly floor: number; readonly incarnation: string }

interface Slot extends HeldLease { op: Promise<unknown>; releasing: boolean }

export class LeaseTable {
  private held = new Map<number, Slot>();
  constructor(
    private readonly bucket: LeaseSource,
    private readonly nodeId: string,
    private readonly ttlMs: number,
    private readonly clock: Clock,
    private readonly log: Logger,
    /** Told of each renewal's result (metrics). */
    private readonly onRenewal?: (result: "ok" | "refused" | "unanswered") => void,
  ) {}

  static key(shard: number): string { return `s${shard}`; }

  get(shard: number): HeldLease | undefined { return this.held.get(shard); }
  heldShards(): number[] { return [...this.held.keys()].sort((a, b) => a - b); }

  /** How long after a renewal was sent the lease is still acted on (the rest of the TTL is the safety margin). */
  get validForMs(): number { return this.ttlMs - Math.min(1000, this.ttlMs / 4); }

  /** True while the lease is held and its last renewal is recent enough to act on. */
  isValid(shard: number): boolean {
    const l = this.held.get(shard);
    return !!l && !l.releasing && this.clock.monotonic() - l.renewedMono < this.validForMs;
  }

  /** How much longer the lease may be acted on without another renewal (0: not valid). */
  remainingMs(shard: number): number {
    const l = this.held.get(shard);
    if (!l || l.releasing) return 0;
    return Math.max(0, this.validForMs - (this.clock.monotonic() - l.renewedMono));
  }

  private get kv(): KV { return this.bucket.kv; }

  async acquire(shard: number): Promise<HeldLease | null> {
    if (this.held.has(shard)) return null;
    // The floor is read with the incarnation it belongs to: a revision from a newer bucket with
    // an older floor gives a smaller epoch, which PostgreSQL refuses (the safe side), and an
    // acquire that straddled a replacement is dropped below.
    const { floor, incarnation } = this.bucket;
    // The server stamps the key between send and reply: counting from the send is the safe side.
    const sent = this.clock.monotonic();
    let rev: number;
    try {
      rev = await this.kv.create(LeaseTable.key(shard), this.nodeId);
    } catch {
      // Our own key still in the bucket: the lease was given up here (renewals went unanswered
      // during a NATS restart, say) but nobody else can have taken it. Taking it over at its
      // current revision gives a new epoch at once instead of waiting out the TTL; a renewal
      // of the old slot still in flight and this update cannot both succeed (same revision).
      try {
        const e = await this.kv.get(LeaseTable.key(shard));
        if (!e || e.operation !== "PUT" || e.string() !== this.nodeId || this.held.has(shard)) return null;
        rev = await this.kv.update(LeaseTable.key(shard), this.nodeId, e.revision);
      } catch {
        return null; // someone holds it (or NATS is down): try again on the next round
      }
    }
    if (this.held.has(shard) || this.bucket.incarnation !== incarnation) return null;
    const lease: Slot = { shard, epoch: floor + rev, revision: rev, renewedMono: sent, op: Promise.resolve(), releasing: false };
    this.held.set(shard, lease);
    return lease;
  }

  /** Renews every held lease; returns the shards whose lease is lost (already forgotten here). */
  async renewAll(): Promise<number[]> {
    const lost: number[] = [];
    // Checked synchronously first: after a pause, every expired lease is found lost before
    // any other callback (a wheel tick, a buffered message) gets to run.
    for (const l of this.held.values()) if (!l.releasing && !this.isValid(l.shard)) lost.push(l.shard);
    for (const s of lost) this.held.delete(s);
    await Promise.all([...this.held.values()].filter((l) => !l.releasing).map((l) => this.serial(l, async () => {
      if (l.releasing || this.held.get(l.shard) !== l) return;
      const sent = this.clock.monotonic();
      try {
        // A reply later than this is of no use: the lease would be too old to act on anyway.
        l.revision = await this.kv.update(LeaseTable.key(l.shard), this.nodeId, l.revision, Math.max(250, Math.floor(this.ttlMs / 4)));
        l.renewedMono = sent;
        this.onRenewal?.("ok");
      } catch (e) {
        if (this.held.get(l.shard) !== l || l.releasing) return;
        if (!(e instanceof JetStreamApiError)) {
          // No answer (timeout, reconnecting): the lease may still be ours; the next renewal
          // tries again, and isValid() stops the shard if none succeeds in time.
          this.log.warn({ shard: l.shard, epoch: l.epoch, err: String(e) }, "lease renewal got no answer; retrying");
          this.onRenewal?.("unanswered");
          return;
        }
        // Refused by the server (wrong last revision: the key expired or someone else holds it).
        this.log.warn({ shard: l.shard, epoch: l.epoch, err: String(e) }, "lease renewal refused");
        this.onRenewal?.("refused");
        this.held.delete(l.shard);
        lost.push(l.shard);
      }
    })));
    return lost;
  }

  /** The bucket was replaced: every lease held is void. Returns their shards (forgotten here). */
  voidAll(): number[] {
    const shards = this.heldShards();
    this.held.clear();
    return shards;
  }

  /** Forgets a lease without touching the bucket (it was found lost). */
  forget(shard: number): void { this.held.delete(shard); }

  /** Planned release: waits for a renewal in flight, then deletes the key at the last revision. */
  async release(shard: number): Promise<void> {
    const l = this.held.get(shard);
    if (!l) return;
    l.releasing = true;
    await this.serial(l, async () => {
      try { await this.kv.delete(LeaseTable.key(shard), { previousSeq: l.revision }); } catch (e) {
        this.log.warn({ shard, epoch: l.epoch, err: String(e) }, "lease release failed; it will expire");
      }
    });
    if (this.held.get(shard) === l) this.held.delete(shard);
  }

  private serial<T>(l: Slot, fn: () => Promise<T>): Promise<T> {
    const p = l.op.then(fn, fn);
    l.op = p.catch(() => undefined);
    return p;
  }
}

interface ViewEntry { owner: string | null; revision: number; expiresMono: number }

/**
 * Every node's view of who holds which lease, kept from a KV watch instead of listing the
 * bucket on every reconcile. Max-age expiry produces no notification, so each entry carries
 * its expected expiry on the monotonic clock: receipt + TTL for a write seen as it happens;
 * for entries seen at start-up (possibly old), receipt plus what is left of the TTL by the
 * server's timestamp — never more than the TTL, so clock skew between machines can only make
 * the view think a lease ends *earlier*, and acting on that is harmless (create() fails until
 * the key is really gone). A full listing every few seconds adds anything the watch missed.
 */
export class LeaseView {
  private entries = new Map<number, ViewEntry>();
  private watcher: { stop(): void } | null = null;
  private resyncTimer: ReturnType<Clock["setTimeout"]> | null = null;
  private stopped = false;
  /** Bumped when the bucket is replaced: a listing of the old one still running is ignored. */
  private gen = 0;
  onChange: () => void = () => undefined;

  constructor(
    private readonly bucket: LeaseSource,
    private readonly ttlMs: number,
    private readonly clock: Clock,
    private readonly log: Logger,
    private readonly resyncMs = Math.max(5000, ttlMs * 2),
  ) {}

  private get kv(): KV { return this.bucket.kv; }

  /** The bucket was replaced: what was seen of the old one means nothing; watch the new one. */
  async restart(): Promise<void> {
    this.watcher?.stop();
    this.watcher = null;
    this.gen++;
    this.entries.clear();
    this.onChange();
    await this.start();
  }

  async start(): Promise<void> {
    const w = await this.kv.watch({ key: ">" });
    this.watcher = w;
    void (async () => {
      // Only the current watch: entries of a replaced bucket still buffered are dropped.
      for await (const e of w) if (this.watcher === w) this.apply(e, e.isUpdate);
    })().catch((e) => { if (!this.stopped) this.log.warn({ err: String(e) }, "lease watch ended"); });
    await this.resync();
  }

  stop(): void {
    this.stopped = true;
    this.watcher?.stop();
    if (this.resyncTimer) this.clock.clearTimeout(this.resyncTimer);
  }

  /**
   * `live`: the entry was just written (a watch update), so it has the whole TTL ahead of it.
   * Otherwise (start-up replay, listing) it may be old: what is left is estimated from the
   * server's timestamp, which only clock skew can distort — and only towards "earlier".
   */
  private apply(e: KvEntry, live: boolean): void {
    if (!/^s\d+$/.test(e.key)) return;
    const shard = Number(e.key.slice(1));
    const cur = this.entries.get(shard);
    if (cur && cur.revision >= e.revision) return;
    const left = live ? this.ttlMs : Math.min(this.ttlMs, Math.max(0, e.created.getTime() + this.ttlMs - this.clock.now()));
    const owner = e.operation === "PUT" ? e.string() : null;
    this.entries.set(shard, { owner, revision: e.revision, expiresMono: this.clock.monotonic() + left });
    if (!cur || cur.owner !== owner) this.onChange();
  }

  /** Lists the bucket (the watch keeps it current in between). */
  async resync(): Promise<void> {
    if (this.resyncTimer) { this.clock.clearTimeout(this.resyncTimer); this.resyncTimer = null; }
    try {
      const keys: string[] = [];
      const { kv, gen } = this;
      for await (const k of await kv.keys()) keys.push(k);
      await Promise.all(keys.map(async (k) => { const e = await kv.get(k); if (e && this.gen === gen) this.apply(e, false); }));
    } catch (e) {
      // A listing cut off by stop() (the connection drains) is expected, not worth a warning.
      if (!this.stopped) this.log.warn({ err: String(e) }, "lease listing failed; the watch view is used as is");
    }
    if (!this.stopped) this.resyncTimer = this.clock.setTimeout(() => { void this.resync(); }, this.resyncMs);
  }

  /** Current owner of every shard lease that has not (by the view) expired. */
  owners(): Map<number, string> {
    const now = this.clock.monotonic();
    const out = new Map<number, string>();
    for (const [s, e] of this.entries) if (e.owner !== null && e.expiresMono > now) out.set(s, e.owner);
    return out;
  }

  /** When the next lease whose owner passes `which` is expected to run out (monotonic), if any. */
  nextExpiryMono(which: (owner: string) => boolean): number | null {
    const now = this.clock.monotonic();
    let m: number | null = null;
    for (const e of this.entries.values()) if (e.owner !== null && e.expiresMono > now && which(e.owner) && (m === null || e.expiresMono < m)) m = e.expiresMono;
    return m;
  }
}
