import type { NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager, type ConsumerMessages, type JetStreamClient, type JsMsg } from "@nats-io/jetstream";
import type { Logger, Names } from "../../common/index.ts";
import type { Ackable } from "../events/index.ts";
import {
  DependencyTriggerSchema, closeGently, decode, decodeEventBatchV1, ensureShardConsumer, handBack,
  type DeadCause, type DeadLetters, type DependencyTrigger, type RunEvent,
} from "../../protocol/index.ts";

export interface ShardConsumersDeps {
  shard: number;
  nc: NatsConnection;
  js: JetStreamClient;
  names: Names;
  log: Logger;
  /** Lifetime of each pull request (see ShardActorDeps.pullExpiresMs). */
  pullExpiresMs?: number;
  dead?: DeadLetters;
  /** The shard is active: messages are handed over; otherwise handed back (protocol.handBack) for the next owner. */
  active: () => boolean;
  onEvents: (events: RunEvent[], instance: string, msg: Ackable) => void;
  onTrigger: (trig: DependencyTrigger, msg: Ackable) => void;
  /** A loop ended (consumer deleted, a connection that lost it): the shard must not stay owned and deaf. */
  onEnded: (why: string) => void;
}

/**
 * The shard's own JetStream consumers: its events subject (v1 events, and events forwarded from
 * other nodes' consumers) and its dependency triggers. Each message is validated here; one that
 * can never be processed (malformed, another shard's) is parked as a dead letter instead of
 * reaching the actor. One that failed on every delivery reaches it once more, to be decided alone
 * and parked if that fails too (DeadLetters.lastChance).
 */
export class ShardConsumers {
  private messages: ConsumerMessages[] = [];

  constructor(private readonly d: ShardConsumersDeps) {}

  async start(): Promise<void> {
    // Two JetStream API calls per shard at load (was five: a manager's account check and a second
    // lookup of each durable); a node taking 64 shards at once under load waited seconds on them.
    const infos = await ensureShardConsumer(await jetstreamManager(this.d.nc, { checkAPI: false }), this.d.names, this.d.shard);
    const expires = this.d.pullExpiresMs ? { expires: Math.max(1000, this.d.pullExpiresMs) } : {};
    // A deleted consumer ends the loop (see onEnded) instead of being retried silently.
    const evMsgs = await this.d.js.consumers.getConsumerFromInfo(infos.events).consume({ max_messages: 256, abort_on_missing_resource: true, ...expires });
    const trMsgs = await this.d.js.consumers.getConsumerFromInfo(infos.triggers).consume({ max_messages: 64, abort_on_missing_resource: true, ...expires });
    this.messages.push(evMsgs, trMsgs);
    this.loop("event", evMsgs, (m) => {
      const dec = decodeEventBatchV1(m.data);
      if (!dec.ok) { this.park(m, "shard-events", "malformed", `malformed event batch: ${dec.reason}`); return; }
      if (dec.value.shard !== this.d.shard) { this.park(m, "shard-events", "wrong-shard", `event batch for shard ${dec.value.shard} on shard ${this.d.shard}'s subject`); return; }
      // Failed on every delivery so far: split, or its one event's last chance (DeadLetters.settleExhausted).
      const shard = this.d.shard;
      const msg = this.d.dead?.exhausted(m)
        ? this.d.dead.settleExhausted(m, "shard-events", dec.value.events.map((ev) => ({ ...ev, shard })), dec.value.executor, dec.value.instance)
        : m;
      if (msg) this.d.onEvents(dec.value.events, dec.value.instance, msg);
    });
    this.loop("trigger", trMsgs, (m) => {
      const dec = decode(DependencyTriggerSchema, m.data);
      if (!dec.ok) { this.park(m, "shard-trigger", "malformed", `malformed dependency trigger: ${dec.reason}`); return; }
      this.d.onTrigger(dec.value, this.d.dead?.exhausted(m) ? this.d.dead.lastChance(m, "shard-trigger") : m);
    });
  }

  /**
   * Stops the pulls, both at once. Messages delivered and not acked come back to the stream: those
   * on their way when the pull stops too, handed back by the loop (closeGently), not stranded
   * for the ack wait while their runs stay `running`.
   */
  async close(): Promise<void> {
    await Promise.all(this.messages.map((c) => closeGently(c).catch(() => undefined)));
  }

  private loop(kind: string, msgs: ConsumerMessages, handle: (m: JsMsg) => void): void {
    void (async () => {
      for await (const m of msgs) {
        if (!this.d.active()) { handBack(m); continue; } // for the next owner
        handle(m);
      }
    })().then(() => this.d.onEnded(`${kind} consumer ended`), (e) => this.d.onEnded(`${kind} consumer failed: ${String(e)}`));
  }

  /** A message this shard can never process: parked as a dead letter (or only terminated without a sink). */
  private park(m: JsMsg, consumer: string, cause: DeadCause, reason: string): void {
    if (this.d.dead) void this.d.dead.park(m, consumer, cause, reason);
    else { this.d.log.warn({ reason, seq: m.seq }, "message refused"); m.term(); }
  }
}
