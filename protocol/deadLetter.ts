import { headers as natsHeaders } from "@nats-io/transport-node";
import type { JetStreamClient, JetStreamManager, JsMsg } from "@nats-io/jetstream";
import { AxError, type Logger, type Names } from "../common/index.ts";
import { encode, type RunEvent } from "./messages.ts";

/**
 * Dead-letter parking. A message a node can never process — malformed, for another shard, or
 * one whose processing failed on every one of `maxDeliveries` deliveries (a write PostgreSQL
 * refuses for that message's content, say) and then alone (see lastChance) — is copied to the
 * namespace's dead-letter stream (`<NS>_DEAD`, subject `<ns>.dead.<consumer>`) with why and
 * where it came from in headers,
 * then terminated on its consumer: it is not redelivered for days, and the shard it kept
 * restarting runs on. `ax dead ls` lists what was parked.
 *
 * Between failed deliveries the message is handed back with an exponential delay
 * (`redeliveryDelayMs`), so the bound is reached after about a minute at the default, not a
 * few seconds; and a message is not parked for its deliveries while the node's dependencies
 * are failing (`healthy()`): an outage makes every message fail, not just poison.
 *
 * If the copy cannot be written, the message is not terminated (handed back instead): it is
 * never lost without a trace.
 */
export const DEAD_HEADERS = {
  reason: "Ax-Dead-Reason", cause: "Ax-Dead-Cause", subject: "Ax-Dead-Subject", stream: "Ax-Dead-Stream",
  seq: "Ax-Dead-Seq", deliveries: "Ax-Dead-Deliveries", consumer: "Ax-Dead-Consumer", node: "Ax-Dead-Node", at: "Ax-Dead-At",
} as const;

/** Why a message was parked. */
export type DeadCause = "malformed" | "wrong-shard" | "deliveries";

/** Delay before a message whose processing failed is delivered again: 1 s doubling, at most 30 s. */
export function redeliveryDelayMs(deliveryCount: number): number {
  return Math.min(30_000, 1000 * 2 ** Math.max(0, Math.min(deliveryCount, 16) - 1));
}

/** Hands a message back with the delay its delivery count calls for (any Ackable; JsMsgs carry their count). */
export function nakLater(m: { nak(delayMs?: number): void; info?: { deliveryCount?: number } }): void {
  m.nak(redeliveryDelayMs(m.info?.deliveryCount ?? 1));
}

export interface DeadLettersOptions {
  js: JetStreamClient;
  names: Names;
  nodeId: string;
  log: Logger;
  /** Processing attempts before a message is parked (AX_DEAD_AFTER). */
  maxDeliveries: number;
  /** False while the node cannot reach a dependency: failures then say nothing about the message. */
  healthy: () => boolean;
  /** Told of each parked message (metrics; the caller logs once per cause per interval). */
  onParked: (consumer: string, cause: DeadCause, reason: string) => void;
}

/** A message past its deliveries, handed on once more (see DeadLetters.lastChance). */
export interface LastChance {
  ack(): void; nak(delayMs?: number): void; working(): void; info: { deliveryCount: number };
  /** Its round of its own failed: park it (hand it back if the node cannot reach a dependency). */
  park(): void;
}

export class DeadLetters {
  constructor(private readonly o: DeadLettersOptions) {}

  get maxDeliveries(): number { return this.o.maxDeliveries; }

  /**
   * True if `m` was delivered more than `maxDeliveries` times and the node is healthy. Not proof
   * that `m` is the poison: a message is handed back whenever a round it was in fails, or its
   * shard restarts while it waits, so neighbours of a poison count up as fast as the poison does.
   * Hence split and lastChance: such a message is parked only once it failed alone.
   */
  exhausted(m: JsMsg): boolean {
    return m.info.deliveryCount > this.o.maxDeliveries && this.o.healthy();
  }

  /**
   * An exhausted event batch: split when it holds more than one event (null: settled here), else
   * its one event's last chance, for the caller to hand to the event's shard.
   */
  settleExhausted(m: JsMsg, consumer: string, events: ReadonlyArray<RunEvent & { shard: number }>, executor: string, instance: string): LastChance | null {
    if (events.length < 2) return this.lastChance(m, consumer);
    void this.split(m, consumer, events, executor, instance);
    return null;
  }

  /**
   * An exhausted event batch of more than one event: the event that fails (a completion whose
   * row PostgreSQL refuses, say) and others that only shared its rounds. Parked whole, those
   * others' runs would never be recorded as finished, and their tasks would skip every slot
   * (overlap) until the runs time out. Each event goes on alone instead, as a v1 batch on its
   * shard's own subject, and `m` is acked; `m` is handed back if a publish fails.
   */
  async split(m: JsMsg, consumer: string, events: ReadonlyArray<RunEvent & { shard: number }>, executor: string, instance: string): Promise<void> {
    const seq = m.info.streamSequence;
    try {
      // One id per event of this stream message: a second split (another node, a redelivery) is dropped as a copy.
      await Promise.all(events.map(({ shard, ...ev }, i) => this.o.js.publish(this.o.names.eventsSubject(shard),
        encode({ v: 1, executor, instance, shard, events: [ev] }), { msgID: `split:${m.info.stream}:${seq}:${i}` })));
    } catch (e) {
      this.o.log.warn({ consumer, seq, err: String(e) }, "could not split an event batch that failed on every delivery; handing it back");
      nakLater(m);
      return;
    }
    m.ack();
    this.o.log.warn({ consumer, seq, events: events.length, deliveries: m.info.deliveryCount - 1 },
      "an event batch failed on every delivery: its events go on one by one, and only one that fails alone is parked");
  }

  /**
   * An exhausted message of one event or trigger, handed to its shard once more with `park`: the
   * shard decides it in a round of its own, after its earlier rounds are written, and calls
   * `park` instead of handing it back if that round fails. A failure alone is the message's own
   * (or an outage's: then, `healthy()` false, it is handed back as before); a neighbour that only
   * shared a poison's rounds is applied, not parked beside it.
   */
  lastChance(m: JsMsg, consumer: string): LastChance {
    return {
      ack: () => m.ack(), nak: (delayMs) => m.nak(delayMs), working: () => m.working(), info: m.info,
      park: () => {
        if (!this.o.healthy()) { nakLater(m); return; }
        void this.park(m, consumer, "deliveries", `failed in a round of its own on delivery ${m.info.deliveryCount}, after ${m.info.deliveryCount - 1} failed deliveries`);
      },
    };
  }

  /** Copies `m` to the dead-letter stream, then terminates it; hands it back if the copy fails. */
  async park(m: JsMsg, consumer: string, cause: DeadCause, reason: string): Promise<void> {
    const h = natsHeaders();
    // Header values are one line of bounded length (a reason quotes hostile input).
    const clean = (s: string) => s.replace(/[\r\n\0]/g, " ").slice(0, 512);
    h.set(DEAD_HEADERS.reason, clean(reason));
    h.set(DEAD_HEADERS.cause, cause);
    h.set(DEAD_HEADERS.subject, clean(m.subject));
    h.set(DEAD_HEADERS.stream, m.info.stream);
    h.set(DEAD_HEADERS.seq, String(m.info.streamSequence));
    h.set(DEAD_HEADERS.deliveries, String(m.info.deliveryCount));
    h.set(DEAD_HEADERS.consumer, consumer);
    h.set(DEAD_HEADERS.node, this.o.nodeId);
    h.set(DEAD_HEADERS.at, new Date().toISOString());
    let duplicate = false;
    try {
      // The message id makes a second parking of the same message (two nodes, a redelivery after
      // its ack wait ran out in a busy consumer's buffer) one copy, counted once.
      ({ duplicate } = await this.o.js.publish(this.o.names.deadSubject(consumer), m.data, { headers: h, msgID: `dead:${m.info.stream}:${m.info.streamSequence}` }));
    } catch (e) {
      this.o.log.warn({ consumer, cause, seq: m.info.streamSequence, err: String(e) }, "could not park a message in the dead-letter stream; handing it back");
      nakLater(m);
      return;
    }
    m.term(clean(reason));
    if (!duplicate) this.o.onParked(consumer, cause, reason);
  }
}

export interface DeadLetter {
  seq: number; consumer: string; cause: string; reason: string; subject: string; stream: string;
  originalSeq: number; deliveries: number; node: string; at: string; bytes: number; preview: string;
}

/** The last `limit` parked messages (newest first), for `ax dead ls`. */
export async function listDeadLetters(jsm: JetStreamManager, names: Names, limit: number): Promise<DeadLetter[]> {
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > 1000) throw new AxError("AX_E_INVALID", "limit is 1..1000", { field: "limit", value: limit });
  let last: number;
  try {
    last = (await jsm.streams.info(names.deadStream)).state.last_seq;
  } catch (e) {
    if (/not found/i.test(String((e as Error)?.message ?? e))) return [];
    throw e;
  }
  const out: DeadLetter[] = [];
  for (let seq = last; seq > 0 && out.length < limit; seq--) {
    const sm = await jsm.streams.getMessage(names.deadStream, { seq }).catch(() => null);
    if (!sm) continue;
    const g = (k: string) => sm.header?.get(k) ?? "";
    out.push({
      seq, consumer: g(DEAD_HEADERS.consumer), cause: g(DEAD_HEADERS.cause), reason: g(DEAD_HEADERS.reason), subject: g(DEAD_HEADERS.subject),
      stream: g(DEAD_HEADERS.stream), originalSeq: Number(g(DEAD_HEADERS.seq)), deliveries: Number(g(DEAD_HEADERS.deliveries)), node: g(DEAD_HEADERS.node),
      at: g(DEAD_HEADERS.at), bytes: sm.data.length, preview: new TextDecoder().decode(sm.data.subarray(0, 120)).replace(/\p{Cc}/gu, "."),
    });
  }
  return out;
}
