import { AckPolicy, DeliverPolicy, RetentionPolicy, StorageType, type ConsumerInfo, type ConsumerMessages, type JetStreamManager } from "@nats-io/jetstream";
import { AxError, type Names } from "../common/index.ts";

export interface EnsureStreamsOptions {
  /** `num_replicas` of a stream created here (AX_REPLICAS); consumers inherit it. */
  replicas?: number;
  /** A node (not an executor) also changes existing streams to `replicas`. */
  reconcileReplicas?: boolean;
  /** A node also creates the dead-letter stream (executors have no permission to look at it on deploy/nats). */
  deadLetters?: boolean;
}

function isNotFound(e: unknown): boolean {
  const msg = String((e as Error)?.message ?? e);
  return /not found/i.test(msg) || (e as { code?: number })?.code === 404;
}

/**
 * Creates the namespace's streams idempotently.
 * - DISPATCH: work queue on `<ns>.dispatch.>`; a message leaves when an executor acks it.
 *   `duplicate_window` makes a re-published batch (same message id) a no-op.
 * - EVENTS: interest retention on executor events, run outcomes and dependency triggers; a
 *   message is kept until every consumer interested in its subject acked it. Consumers are
 *   created with the streams (ensureShardConsumers) so no event is published before its reader exists.
 */
export async function ensureStreams(jsm: JetStreamManager, n: Names, opts: EnsureStreamsOptions = {}): Promise<void> {
  const replicas = opts.replicas ?? 1;
  const want = [
    { name: n.dispatchStream, subjects: [n.dispatchWildcard], retention: RetentionPolicy.Workqueue },
    { name: n.eventsStream, subjects: [n.eventsWildcard, n.outcomeWildcard, n.triggerWildcard], retention: RetentionPolicy.Interest },
  ];
  for (const s of want) await ensureStream(jsm, s, replicas, opts.reconcileReplicas === true);
  // Parked messages (protocol/deadLetter.ts): kept 30 days for an operator to look at.
  if (opts.deadLetters) await ensureStream(jsm, { name: n.deadStream, subjects: [n.deadWildcard], retention: RetentionPolicy.Limits, maxAgeS: 30 * 24 * 3600 }, replicas, opts.reconcileReplicas === true);
}

async function ensureStream(jsm: JetStreamManager, s: { name: string; subjects: string[]; retention: RetentionPolicy; maxAgeS?: number }, replicas: number, reconcileReplicas: boolean): Promise<void> {
  try {
    const info = await jsm.streams.info(s.name);
    if (reconcileReplicas && info.config.num_replicas !== replicas) {
      // A cluster grown from one server (or AX_REPLICAS changed): the server moves the data.
      try {
        await jsm.streams.update(s.name, { ...info.config, num_replicas: replicas });
      } catch (e) {
        throw new AxError("AX_E_CONFIG", `stream ${s.name} has ${info.config.num_replicas} replica(s) and AX_REPLICAS=${replicas}; changing it failed: ${String((e as Error).message ?? e)}`, { field: "AX_REPLICAS", value: replicas });
      }
    }
  } catch (e) {
    if (!isNotFound(e)) throw e;
    try {
      await jsm.streams.add({
        name: s.name, subjects: s.subjects, retention: s.retention, storage: StorageType.File,
        duplicate_window: 120_000_000_000, max_age: (s.maxAgeS ?? 7 * 24 * 3600) * 1_000_000_000, num_replicas: replicas,
      });
    } catch (e2) {
      if (!/already in use|exists/i.test(String((e2 as Error).message))) throw e2;
    }
  }
}

/**
 * The namespace's streams (dispatch, events, dead letters) that do not exist: deleted under a running
 * cluster, they are created again by the nodes (with their consumers) instead of every
 * publish failing until a restart.
 */
export async function missingStreams(jsm: JetStreamManager, n: Names): Promise<string[]> {
  const out: string[] = [];
  for (const s of [n.dispatchStream, n.eventsStream, n.deadStream]) {
    try { await jsm.streams.info(s); } catch (e) { if (isNotFound(e)) out.push(s); else throw e; }
  }
  return out;
}

/** The durable's info, after creating it if it did not exist. */
async function ensureConsumer(jsm: JetStreamManager, stream: string, durable: string, filter: string, ackWaitMs: number, maxAckPending: number): Promise<ConsumerInfo> {
  try {
    return await jsm.consumers.info(stream, durable);
  } catch (e) {
    if (!isNotFound(e)) throw e;
    try {
      return await jsm.consumers.add(stream, {
        durable_name: durable, filter_subject: filter, ack_policy: AckPolicy.Explicit, deliver_policy: DeliverPolicy.All,
        ack_wait: ackWaitMs * 1_000_000, max_ack_pending: maxAckPending, max_deliver: -1,
      });
    } catch (e2) {
      if (!/already in use|exists/i.test(String((e2 as Error).message))) throw e2;
      return jsm.consumers.info(stream, durable);
    }
  }
}

/** One durable per executor name, shared by all its instances (pull = work distribution). */
export async function ensureExecutorConsumer(jsm: JetStreamManager, n: Names, executor: string, ackWaitMs = 30_000): Promise<string> {
  const durable = n.executorConsumer(executor);
  await ensureConsumer(jsm, n.dispatchStream, durable, n.dispatchSubject(executor), ackWaitMs, 10_000);
  return durable;
}

export const shardEventsConsumer = (shard: number) => `shard_${shard}_events`;
export const shardTriggerConsumer = (shard: number) => `shard_${shard}_trigger`;
export const DEPENDENCY_CONSUMER = "dependency_actor";
/** The durable through which a node reads the events of the runs it dispatched (EventBatch v2). */
export const nodeEventsConsumer = (nodeId: string) => `node_${nodeId}_events`;
export const NODE_EVENTS_CONSUMER_RE = /^node_([A-Za-z0-9_-]+)_events$/;

/**
 * Created before the node dispatches anything: the events stream keeps a message only while a
 * consumer is interested in its subject, so an event published with no such consumer is gone.
 */
export async function ensureNodeEventsConsumer(jsm: JetStreamManager, n: Names, nodeId: string): Promise<string> {
  const durable = nodeEventsConsumer(nodeId);
  await ensureConsumer(jsm, n.eventsStream, durable, n.nodeEventsSubject(nodeId), 10_000, 20_000);
  return durable;
}
/**
 * Outcomes and dependency triggers are handled in milliseconds and idempotently (edge
 * bookkeeping, run ids derived from the trigger key): a short ack wait lets a message pulled
 * by a node that died reach another node within seconds instead of half a minute.
 */
export const DEPENDENCY_ACK_WAIT_MS = 5_000;

/** One shard's two durables, re-created if they were deleted (a shard being loaded checks them). */
/** A shard's two durables (created if missing), with their info: a consumer made from it needs no second lookup. */
export async function ensureShardConsumer(jsm: JetStreamManager, n: Names, shard: number): Promise<{ events: ConsumerInfo; triggers: ConsumerInfo }> {
  const [events, triggers] = await Promise.all([
    ensureConsumer(jsm, n.eventsStream, shardEventsConsumer(shard), n.eventsSubject(shard), 10_000, 20_000),
    ensureConsumer(jsm, n.eventsStream, shardTriggerConsumer(shard), n.triggerSubject(shard), DEPENDENCY_ACK_WAIT_MS, 5_000),
  ]);
  return { events, triggers };
}

/** Per-shard durables: they move with the shard, so a new owner resumes where the old one acked. */
export async function ensureShardConsumers(jsm: JetStreamManager, n: Names, shardCount: number): Promise<void> {
  const jobs: Array<Promise<unknown>> = [];
  for (let s = 0; s < shardCount; s++) {
    // Events are applied in one round (milliseconds): a short ack wait gets a batch pulled by a
    // node that froze or died to the next owner quickly.
    jobs.push(ensureConsumer(jsm, n.eventsStream, shardEventsConsumer(s), n.eventsSubject(s), 10_000, 20_000));
    jobs.push(ensureConsumer(jsm, n.eventsStream, shardTriggerConsumer(s), n.triggerSubject(s), DEPENDENCY_ACK_WAIT_MS, 5_000));
    if (jobs.length >= 32) await Promise.all(jobs.splice(0));
  }
  jobs.push(ensureConsumer(jsm, n.eventsStream, DEPENDENCY_CONSUMER, n.outcomeWildcard, DEPENDENCY_ACK_WAIT_MS, 5_000));
  await Promise.all(jobs);
}

/** Removes everything a namespace created in JetStream (tests, teardown). */
export async function dropStreams(jsm: JetStreamManager, n: Names): Promise<void> {
  for (const s of [n.dispatchStream, n.eventsStream, n.deadStream, `KV_${n.leaseBucket}`]) {
    try { await jsm.streams.delete(s); } catch (e) { if (!isNotFound(e)) throw e; }
  }
}

/** See handBack. */
const HAND_BACK_DELAY_MS = 100;

/**
 * Gives a message back to JetStream for another reader (this one stops, or its shard moved):
 * a nak with a short delay, never an immediate one. nats-server 2.9.10 redelivers an immediately
 * nak'd message to a pull request that lost its subscription a moment before (the stopping
 * reader's), and some of those go to no one: measured here, a reader stopped with 169 messages
 * queued behind its loop and handing them back with nak() left 3-4 of them pending for the whole
 * ack wait (10 s for a shard's events); with a delay of even 1 ms the server redelivers them
 * through its timer and none was lost (in 240 stops under a steady publish: before, 1-2 in 3 of
 * 5 runs of 40). The delay is what a hand-back costs the next reader.
 */
export function handBack(m: { nak(delayMs?: number): void }): void {
  m.nak(HAND_BACK_DELAY_MS);
}

/**
 * Ends a `consume()` so that no message the server already sent is stranded. `close()` drops the
 * subscription at once: messages on their way to it when it goes are delivered to no one, and
 * wait out the consumer's ack wait (10 s for a shard's events, 30 s for an executor's dispatches)
 * before anyone else gets them: a completion that late keeps its run `running`, and its task
 * skips its slots meanwhile, after every shard restart or hand-over. Draining the subscription
 * behind the iterator has the server stop first, and the messages already sent still reach the
 * consumer's loop (which hands them back, see handBack, or processes them) before the iterator ends; measured
 * on this machine, ten close-and-reopen cycles under a steady publish stranded 4-8 messages with
 * close() and none with this. The subscription is the library's own field (its own connection
 * drain takes the same path): if it is missing, this falls back to close().
 */
export async function closeGently(messages: ConsumerMessages): Promise<void> {
  // (close() after a drain is a no-op; after a failed or slow one it ends the iterator.)
  const sub = (messages as unknown as { sub?: { drain?: () => Promise<void>; isClosed?: () => boolean } }).sub;
  if (sub?.drain && !sub.isClosed?.()) {
    try {
      await sub.drain();
      // The iterator ends once its loop took what arrived; a loop that stopped reading is not waited for.
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([messages.closed(), new Promise((r) => { timer = setTimeout(r, 5000); timer.unref?.(); })]);
      clearTimeout(timer);
    } catch { /* closed meanwhile: close() below settles it */ }
  }
  await messages.close();
}
