import type { Consumer, JetStreamClient } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Clock, Logger } from "../common/index.ts";

/** What one check needs from JetStream (a seam for tests; the real one is {@link jetStreamProgress}). */
export interface ConsumerProgress {
  /** The stream's last sequence now (any subject). */
  streamLastSeq(): Promise<number>;
  /** The consumer's position: what it has left to deliver, what is delivered but unacked, and the ack floor. */
  consumer(): Promise<{ pending: number; ackPending: number; ackFloorSeq: number }>;
}

/**
 * `durables` is asked on every check (the list can grow once a shard knows its previous owner).
 * A durable in `optional` that does not exist (a gone node's consumer, deleted) counts as caught up.
 */
export function jetStreamProgress(js: JetStreamClient, stream: string, durables: () => string[], optional: (durable: string) => boolean = () => false): ConsumerProgress {
  const cs = new Map<string, Consumer>();
  return {
    async streamLastSeq() { return (await (await js.streams.get(stream)).info()).state.last_seq; },
    // Several durables (a shard's own, its node's, its previous owner's): caught up only when all are.
    async consumer() {
      let pending = 0; let ackPending = 0; let ackFloorSeq = Infinity;
      for (const d of durables()) {
        let i;
        try {
          let c = cs.get(d);
          if (!c) { c = await js.consumers.get(stream, d); cs.set(d, c); }
          i = await c.info();
        } catch (e) {
          if (optional(d) && /not found/i.test(String((e as Error)?.message ?? e))) continue;
          throw e;
        }
        pending += i.num_pending; ackPending += i.num_ack_pending; ackFloorSeq = Math.min(ackFloorSeq, i.ack_floor.stream_seq);
      }
      return { pending, ackPending, ackFloorSeq: Number.isFinite(ackFloorSeq) ? ackFloorSeq : 0 };
    },
  };
}

/** What the watcher of one connection knows: since when it is connected (null: not now), and when JetStream last did not answer. */
interface Watch { sinceMono: number | null; troubleMono: number }
const uptimes = new WeakMap<NatsConnection, Watch>();

/** The connection's watcher, started on first use (its status events). */
function watched(nc: NatsConnection, clock: Clock): Watch {
  const known = uptimes.get(nc);
  if (known) return known;
  const state: Watch = { sinceMono: -Infinity, troubleMono: -Infinity };
  uptimes.set(nc, state);
  void (async () => {
    for await (const s of nc.status()) {
      if (s.type === "disconnect") state.sinceMono = null;
      else if (s.type === "reconnect") state.sinceMono = clock.monotonic();
    }
  })().catch(() => undefined);
  return state;
}

/**
 * How long `nc` has been connected, and JetStream answering, without a break (ms; null while
 * disconnected), from its status events and from {@link noteJetStreamTrouble}. One watcher per
 * connection, shared by every caller; call it once early (the node does at start) so an outage
 * before the first shard actor is not missed.
 *
 * A connection that stays up is not enough: when a clustered JetStream loses its stream leader,
 * a node connected to a surviving server keeps its connection while the stream answers nobody
 * for seconds, and an executor's completion of that time waits in its retry loop.
 */
export function connectionUptime(nc: NatsConnection, clock: Clock): () => number | null {
  const st = watched(nc, clock);
  return () => (st.sinceMono === null ? null : clock.monotonic() - Math.max(st.sinceMono, st.troubleMono));
}

/**
 * Returns the function that tells `nc`'s watcher JetStream did not answer (a request timed out,
 * a stream had no leader) just now. Starts the watcher too, like {@link connectionUptime}.
 */
export function noteJetStreamTrouble(nc: NatsConnection, clock: Clock): () => void {
  const st = watched(nc, clock);
  return () => { st.troubleMono = clock.monotonic(); };
}

/**
 * "Has every event published before time T been applied?" for one shard's event consumer.
 *
 * A run must not be recorded `timed_out` while its completion sits unread in the events stream
 * (after a PostgreSQL outage the shard reloads with runs whose deadline passed meanwhile; after
 * a NATS restart a consumer may lag). A check started at T reads the stream's last sequence
 * (everything published before T is at or below it), then polls the consumer until it has
 * applied everything up to there: acked past it, or nothing left to deliver and nothing
 * unacked. Events are acked only after the round that applied them is written, so "acked"
 * means "applied". Checks run only when a timeout is due, and concurrent requests share one.
 */
export class EventCatchUp {
  private confirmedUpTo = -Infinity;
  private check: { startedAt: number; waiters: Array<() => void> } | null = null;
  private stopped = false;
  /** When this check's own JetStream requests last failed (monotonic). */
  private troubleMono = -Infinity;

  constructor(
    private readonly progress: ConsumerProgress,
    private readonly clock: Clock,
    private readonly log: Logger,
    private readonly opts: {
      pollMs?: number; giveUpMs?: number;
      /**
       * The node's NATS uptime ({@link connectionUptime}). After an outage the executors'
       * completions of that time are still in their buffers, not in the stream: nothing is
       * confirmed until the connection has been back, and JetStream answering, `settleMs`
       * (default 5 s), so they land first. A check whose own JetStream requests fail counts
       * that as an outage too, and tells `onTrouble` (the node's other shards then wait as well).
       */
      uptimeMs?: () => number | null; settleMs?: number; onTrouble?: () => void;
    } = {},
  ) {}

  /** True if every event published before `atMs` (wall clock) is known to be applied. */
  covers(atMs: number): boolean { return this.confirmedUpTo >= atMs; }

  /**
   * Confirms everything published up to now; `then` runs once confirmed, or after `giveUpMs`
   * (default 30 s) with the reason it could not be — JetStream unreachable for that long must
   * not keep runs in flight forever; the caller then acts on its own information.
   */
  request(then: (unconfirmed?: string) => void): void {
    if (this.stopped) return;
    if (this.check) { this.check.waiters.push(then); return; }
    const c = { startedAt: this.clock.now(), waiters: [then] };
    this.check = c;
    void this.run(c.startedAt).then((why) => {
      this.check = null;
      if (why === undefined) this.confirmedUpTo = Math.max(this.confirmedUpTo, c.startedAt);
      if (!this.stopped) for (const w of c.waiters) w(why);
    });
  }

  stop(): void { this.stopped = true; }

  private async run(startedAt: number): Promise<string | undefined> {
    const pollMs = this.opts.pollMs ?? 100;
    const giveUpAt = this.clock.monotonic() + (this.opts.giveUpMs ?? 30_000);
    let target: number | null = null;
    let last = "";
    while (!this.stopped) {
      const connected = this.opts.uptimeMs ? this.opts.uptimeMs() : Infinity; // null = disconnected now
      const up = connected === null ? null : Math.min(connected, this.clock.monotonic() - this.troubleMono);
      let asked = false;
      try {
        if (up === null || up < (this.opts.settleMs ?? 5000)) throw new Error(up === null ? "NATS disconnected" : `NATS back only ${Math.round(up)}ms ago; executors may still be publishing`);
        asked = true;
        // The target is read again after an outage: events published during it count too.
        target ??= await this.progress.streamLastSeq();
        const p = await this.progress.consumer();
        if (p.ackFloorSeq >= target || (p.pending === 0 && p.ackPending === 0)) return undefined;
        last = `consumer behind: ${p.pending} undelivered, ${p.ackPending} unacked, ack floor ${p.ackFloorSeq} < ${target}`;
      } catch (e) {
        last = `progress unknown: ${String((e as Error)?.message ?? e)}`;
        if (asked) { this.troubleMono = this.clock.monotonic(); target = null; this.opts.onTrouble?.(); }
      }
      if (this.clock.monotonic() >= giveUpAt) {
        this.log.warn({ since: new Date(startedAt).toISOString(), why: last }, "could not confirm the shard's events were read; acting on timeouts anyway");
        return last;
      }
      await new Promise<void>((r) => this.clock.setTimeout(r, pollMs));
    }
    return "stopped";
  }
}

/** One sample of a consumer's position (see {@link ConsumerWatch}). */
export interface ConsumerSample { pending: number; ackPending: number; deliveredSeq: number; ackFloorSeq: number; atMono: number }

/**
 * Whether a consumer looks stuck between two samples: messages wait for it (`pending` > 0)
 * but it delivered nothing new for `quietMs`, and nothing it delivered is waiting for an ack
 * (which would mean the reader is merely slow). This is the shape of the "events sit in the
 * stream while the consumer shows nothing" failure seen after a nats-server restart.
 */
export function consumerStalled(prev: ConsumerSample, cur: ConsumerSample, quietMs: number): boolean {
  return cur.pending > 0 && cur.ackPending === 0 && cur.deliveredSeq === prev.deliveredSeq && cur.atMono - prev.atMono >= quietMs;
}

/**
 * Proposed for the shard actor (not wired yet): samples the shard's event consumer every
 * `everyMs` and calls `onStalled(why)` when {@link consumerStalled} holds or the consumer is
 * gone; the owner then fences the shard and restarts it, which re-binds (or, via
 * ensureShardConsumers, recreates) the durable. `onStalled` is called once per stall.
 */
export class ConsumerWatch {
  private timer: ReturnType<Clock["setTimeout"]> | null = null;
  private prev: ConsumerSample | null = null;
  private stopped = false;
  constructor(
    private readonly sample: () => Promise<Omit<ConsumerSample, "atMono"> | null>,
    private readonly clock: Clock,
    private readonly onStalled: (why: string) => void,
    private readonly opts: { everyMs?: number; quietMs?: number } = {},
  ) {}

  start(): void { this.schedule(); }
  stop(): void { this.stopped = true; if (this.timer) this.clock.clearTimeout(this.timer); }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = this.clock.setTimeout(() => { void this.tick().finally(() => this.schedule()); }, this.opts.everyMs ?? 5000);
  }

  private async tick(): Promise<void> {
    let s: Omit<ConsumerSample, "atMono"> | null;
    try { s = await this.sample(); } catch { return; } // JetStream unreachable: the health monitor reports that
    if (this.stopped) return;
    if (s === null) { this.stopped = true; this.onStalled("the consumer does not exist"); return; }
    const cur = { ...s, atMono: this.clock.monotonic() };
    const prev = this.prev;
    if (prev && consumerStalled(prev, cur, this.opts.quietMs ?? 10_000)) {
      this.stopped = true;
      this.onStalled(`${cur.pending} event message(s) pending but nothing delivered for ${Math.round(cur.atMono - prev.atMono)}ms (delivered seq ${cur.deliveredSeq})`);
      return;
    }
    // Keep the older sample while nothing moved, so "quiet for quietMs" spans several ticks.
    if (!prev || cur.deliveredSeq !== prev.deliveredSeq || cur.pending === 0) this.prev = cur;
  }
}
