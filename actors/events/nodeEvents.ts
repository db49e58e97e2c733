import type { ConsumerMessages, JetStreamClient, JetStreamManager, JsMsg } from "@nats-io/jetstream";
import type { Clock, Logger, Names } from "../../common/index.ts";
import {
  NODE_EVENTS_CONSUMER_RE, closeGently, decodeEventBatchV2, encode, ensureNodeEventsConsumer, nodeEventsConsumer, type DeadLetters, type RunEvent,
} from "../../protocol/index.ts";

/**
 * A delivered message, or the part of one that concerns one shard (a node-level event batch is
 * split per shard, and acked when every part was). `working`: JetStream's "in progress", which
 * restarts the message's ack wait while it is held. `park`: only on a message past its
 * deliveries (DeadLetters.lastChance): its shard decides it in a round of its own and parks it
 * instead of handing it back if that round fails.
 */
export interface Ackable { ack(): void; nak(delayMs?: number): void; working?(): void; info?: { deliveryCount?: number }; park?(): void }

/** What the router needs of a shard actor: take a shard's part of a batch, or say it is not active. */
export interface EventSink { acceptEvents(events: RunEvent[], instance: string, part: Ackable): boolean }

export interface NodeEventsDeps {
  js: JetStreamClient;
  jsm: JetStreamManager;
  names: Names;
  nodeId: string;
  clock: Clock;
  log: Logger;
  /** The active actor of a shard this node owns, if any. */
  sinkOf: (shard: number) => EventSink | undefined;
  /** Lifetime of each pull request (kept below the lease TTL, like the shard consumers'). */
  pullExpiresMs: number;
  /** Where batches that can never be processed are parked (without it they are only terminated). */
  dead?: DeadLetters;
}

/** How long a dead node's drained events consumer is kept before it is deleted (its late events still find it). */
const ORPHAN_KEEP_MS = 3_600_000;

/**
 * The events of the runs this node dispatched (EventBatch v2, one message per executor flush,
 * runs of many shards) come through one durable consumer instead of 64 per-shard ones. Each
 * message is split by shard: a shard this node owns gets its part as mail; any other shard's part
 * (moved away, or being loaded) is forwarded as a v1 batch to that shard's own subject, which its
 * owner reads. The message is acked once every part is (applied and written, or forwarded), and
 * nak'ed if any part failed; parts applied twice on redelivery are recognised by the shard.
 *
 * A node that died leaves its consumer behind with events in it: every live node drains such
 * consumers by forwarding their events to the shards' own subjects (drainOrphans), so nothing
 * waits for the dead node to return.
 *
 * Lifecycle: created → running (consume loop; re-created with back-off if it ends) → stopped.
 */
export class NodeEvents {
  private stopped = false;
  private messages: ConsumerMessages | null = null;
  private loop: Promise<void> | null = null;
  private readonly orphansSeen = new Map<string, number>();
  private lastRefusalLog = 0;
  readonly stats = { batches: 0, applied: 0, forwarded: 0, refused: 0, orphanMessages: 0 };
  constructor(private readonly d: NodeEventsDeps) {}

  async start(): Promise<void> {
    await ensureNodeEventsConsumer(this.d.jsm, this.d.names, this.d.nodeId);
    this.loop = this.run();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.messages) await closeGently(this.messages).catch(() => undefined);
    await this.loop?.catch(() => undefined);
  }

  private async run(): Promise<void> {
    for (let failures = 0; !this.stopped;) {
      try {
        const consumer = await this.d.js.consumers.get(this.d.names.eventsStream, nodeEventsConsumer(this.d.nodeId));
        this.messages = await consumer.consume({ max_messages: 256, expires: Math.max(1000, this.d.pullExpiresMs), abort_on_missing_resource: true });
        for await (const m of this.messages) { failures = 0; this.onMessage(m); }
      } catch (e) {
        if (this.stopped) break;
        this.d.log.warn({ err: String(e) }, "node events consumer failed; re-creating it");
      }
      if (this.stopped) break;
      // Ended without stop(): the consumer was deleted or the connection lost it. Re-created, so
      // events published to this node's subject keep an interested reader.
      await new Promise((r) => setTimeout(r, Math.min(5000, 200 * 2 ** failures++)));
      await ensureNodeEventsConsumer(this.d.jsm, this.d.names, this.d.nodeId).catch(() => undefined);
    }
  }

  private onMessage(m: JsMsg): void {
    const dec = decodeEventBatchV2(m.data);
    if (!dec.ok) {
      this.refused(dec.reason, m.seq);
      if (this.d.dead) void this.d.dead.park(m, "node-events", "malformed", `malformed event batch: ${dec.reason}`); else m.term();
      return;
    }
    // Failed on every delivery so far: split, or its one event's last chance (DeadLetters.settleExhausted).
    const lastChance = this.d.dead?.exhausted(m) ? this.d.dead.settleExhausted(m, "node-events", dec.value.events, dec.value.executor, dec.value.instance) : undefined;
    if (lastChance === null) return;
    const park = lastChance?.park;
    this.stats.batches++;
    const parts = splitByShard(dec.value.events);
    let open = parts.size;
    let failed = false;
    // The longest delay a part asked for: 100 ms for a hand-back (a shard that moved; protocol.handBack),
    // the back-off of nakLater (from this message's delivery count, which parts carry) for a failed round.
    let delayMs = 0;
    const settle = () => { if (--open === 0) { if (failed) m.nak(delayMs); else m.ack(); } };
    for (const [shard, events] of parts) {
      const part: Ackable = { ack: settle, nak: (d) => { failed = true; delayMs = Math.max(delayMs, d ?? 1000); settle(); }, info: m.info, ...(park ? { park } : {}) };
      const sink = this.d.sinkOf(shard);
      if (sink?.acceptEvents(events, dec.value.instance, part)) { this.stats.applied += events.length; continue; }
      this.forward(shard, events, dec.value.executor, dec.value.instance, `f:${this.d.nodeId}:${m.info.streamSequence}:${shard}`).then(part.ack, part.nak);
    }
  }

  /** One shard's events as a v1 batch on the shard's own subject (read by whoever owns it). */
  private async forward(shard: number, events: RunEvent[], executor: string, instance: string, msgID: string): Promise<void> {
    const plain = events.map(({ shard: _s, ...ev }) => ev);
    await this.d.js.publish(this.d.names.eventsSubject(shard), encode({ v: 1, executor, instance, shard, events: plain }), { msgID });
    this.stats.forwarded += events.length;
  }

  /**
   * Drains the events consumers of nodes that are not live (forwarding every event to its shard's
   * subject) and deletes one once it has been empty and its node absent for ORPHAN_KEEP_MS.
   * A node wrongly thought dead loses nothing: its events reach its shards the long way round.
   */
  async drainOrphans(live: ReadonlySet<string>): Promise<number> {
    let moved = 0;
    const now = this.d.clock.monotonic();
    const seen = new Set<string>();
    for await (const ci of this.d.jsm.consumers.list(this.d.names.eventsStream)) {
      const node = NODE_EVENTS_CONSUMER_RE.exec(ci.name)?.[1];
      if (!node || node === this.d.nodeId || live.has(node)) continue;
      seen.add(ci.name);
      if (!this.orphansSeen.has(ci.name)) this.orphansSeen.set(ci.name, now);
      const consumer = await this.d.js.consumers.get(this.d.names.eventsStream, ci.name);
      for (;;) {
        const batch = await consumer.fetch({ max_messages: 256, expires: 1000 });
        let got = 0;
        for await (const m of batch) {
          got++;
          const dec = decodeEventBatchV2(m.data);
          if (!dec.ok) { this.refused(dec.reason, m.seq); m.term(); continue; }
          try {
            await Promise.all([...splitByShard(dec.value.events)].map(([shard, events]) =>
              this.forward(shard, events, dec.value.executor, dec.value.instance, `f:${node}:${m.info.streamSequence}:${shard}`)));
            m.ack();
            moved++;
          } catch { m.nak(1000); }
        }
        if (got === 0) break;
      }
      const info = await consumer.info(true).catch(() => null);
      if (info && info.num_pending === 0 && info.num_ack_pending === 0 && now - this.orphansSeen.get(ci.name)! > ORPHAN_KEEP_MS) {
        await this.d.jsm.consumers.delete(this.d.names.eventsStream, ci.name).catch(() => undefined);
        this.orphansSeen.delete(ci.name);
        this.d.log.info({ consumer: ci.name }, "deleted the drained events consumer of a node gone for an hour");
      }
    }
    for (const name of this.orphansSeen.keys()) if (!seen.has(name)) this.orphansSeen.delete(name);
    this.stats.orphanMessages += moved;
    if (moved) this.d.log.info({ messages: moved }, "forwarded events from the consumers of nodes that are gone");
    return moved;
  }

  /** Counted always; logged at most once every 10 s (a flood of bad messages is not a flood of lines). */
  private refused(reason: string, seq: number): void {
    this.stats.refused++;
    const now = this.d.clock.monotonic();
    if (now - this.lastRefusalLog < 10_000) return;
    this.lastRefusalLog = now;
    this.d.log.warn({ reason, seq, refusedSoFar: this.stats.refused }, "malformed node event batch refused");
  }
}

function splitByShard(events: ReadonlyArray<RunEvent & { shard: number }>): Map<number, RunEvent[]> {
  const out = new Map<number, RunEvent[]>();
  for (const ev of events) {
    let list = out.get(ev.shard);
    if (!list) { list = []; out.set(ev.shard, list); }
    list.push(ev);
  }
  return out;
}
