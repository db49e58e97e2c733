import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { AckPolicy, jetstream, jetstreamManager, type ConsumerMessages, type JetStreamManager } from "@nats-io/jetstream";
import { connectNats } from "../../common/index.ts";
import { closeGently, handBack } from "../../protocol/index.ts";
import { testConfig, testNamespace, waitFor } from "../helpers.ts";

/**
 * A shard restart or hand-over, an executor's stop: each ends a consume() while messages the
 * server already sent are on their way to it. Two ways lose such a message for the consumer's
 * ack wait (10 s for a shard's events), which kept a completion's run `running` and its
 * every-second task skipping slots (found as a flaky dead-letter test in CI):
 * - close() drops the subscription at once: what arrives after it reaches no one. closeGently
 *   drains it, so those messages still reach the loop.
 * - the loop hands them back; with an immediate nak, nats-server 2.9.10 redelivers some of them
 *   to the pull request of the subscription that just went, and they reach no one either.
 *   handBack naks with a short delay.
 * Each stop here comes while the reader's connection is held busy with messages on their way,
 * and nothing is published around it. The second case runs the same cycles with close(), to show
 * the first one's check would see what it guards against.
 */
const ns = testNamespace("cclose");
const STREAM = `${ns.toUpperCase()}_CLOSE`;
let nc: NatsConnection; let jsm: JetStreamManager;

beforeAll(async () => {
  nc = await connectNats(testConfig(ns).nats);
  jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name: STREAM, subjects: [`${ns}.close.>`] });
  // A 60 s ack wait: a stranded message cannot come back within the test.
  for (const c of ["gently", "abruptly"]) {
    await jsm.consumers.add(STREAM, { durable_name: c, ack_policy: AckPolicy.Explicit, ack_wait: 60_000_000_000, filter_subject: `${ns}.close.${c}` });
  }
});
afterAll(async () => {
  await jsm?.streams.delete(STREAM).catch(() => undefined);
  await nc?.close();
});

/** Runs the cycles on one consumer, each ended by `stop`; returns how many messages were never read. */
async function cycles(consumer: "gently" | "abruptly", stop: (m: ConsumerMessages) => Promise<void>): Promise<{ published: number; handedBack: number; stranded: number }> {
  // Published from a connection of its own, so the reader's connection can be held busy.
  const pubNc = await connectNats(testConfig(ns).nats);
  const js = jetstream(pubNc);
  const subject = `${ns}.close.${consumer}`;
  const acked = new Set<number>();
  let published = 0; let handedBack = 0; let handedBackBefore = 0;
  const publish = async (n: number) => {
    await Promise.all(Array.from({ length: n }, (_, i) => js.publish(subject, new Uint8Array([i & 255]))));
    published += n;
  };
  let seed = 7; // fixed, uneven sizes (a seeded sequence, not Math.random)
  for (let cycle = 0; cycle < 10; cycle++) {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    const messages = await (await jetstream(nc).consumers.get(STREAM, consumer)).consume({ max_messages: 256, expires: 30_000 });
    let stopping = false;
    const loop = (async () => {
      for await (const m of messages) {
        // As a shard actor that stopped does: what comes after the stop is handed back.
        if (stopping) { handBack(m); handedBack++; continue; }
        acked.add(m.seq); m.ack();
      }
    })();
    const first = 50 + (seed % 150);
    const ackedBefore = acked.size;
    await publish(first);
    // These, and the ones the last stop handed back, are read as usual.
    await waitFor(() => acked.size >= ackedBefore + first + (handedBack - handedBackBefore), 10_000, `cycle ${cycle}: the new messages and those the last stop handed back to be read (one stranded?)`);
    handedBackBefore = handedBack;
    await publish(20 + ((seed >> 8) % 180));
    // The reader's connection is held (a busy event loop): what the server sends meanwhile waits
    // in its socket, on its way, when the stop comes. Nothing is published from here on, so the
    // server has nothing left to hand out as the pull goes.
    const until = Date.now() + 150;
    while (Date.now() < until) { /* busy */ }
    stopping = true;
    await stop(messages); await loop;
  }
  // One last reader takes what is left; a message dropped by a stop stays pending behind it.
  const last = await (await jetstream(nc).consumers.get(STREAM, consumer)).consume({ max_messages: 256, expires: 30_000 });
  const tail = (async () => { for await (const m of last) { acked.add(m.seq); m.ack(); } })();
  // Done when everything is read, or all that is left is pending behind a stop (stranded).
  await waitFor(async () => {
    if (acked.size >= published) return true;
    const info = await jsm.consumers.info(STREAM, consumer);
    return info.num_pending === 0 && acked.size >= published - info.num_ack_pending;
  }, 10_000, "the last reader to take what is left");
  await new Promise((r) => setTimeout(r, 500)); // hand-backs still on their way
  await last.close(); await tail;
  await pubNc.close();
  return { published, handedBack, stranded: published - acked.size };
}

describe("closeGently", () => {
  it("hands back the messages already sent when a consumer stops; none waits out the ack wait", async () => {
    const r = await cycles("gently", closeGently);
    expect(r.handedBack).toBeGreaterThan(10); // the cycles did stop with messages on their way
    expect(r.stranded).toBe(0);
    const info = await jsm.consumers.info(STREAM, "gently");
    expect(info.num_ack_pending).toBe(0);
    expect(info.num_pending).toBe(0);
    console.log(`[consume-close] closeGently: ${r.published} published over 10 stops; ${r.handedBack} on their way at a stop were handed back; 0 stranded`);
  }, 60_000);

  it("the same cycles ended with close() strand messages (what the test above would see)", async () => {
    const r = await cycles("abruptly", async (m) => { await m.close(); });
    expect(r.stranded).toBeGreaterThan(0);
    const info = await jsm.consumers.info(STREAM, "abruptly");
    expect(info.num_ack_pending).toBe(r.stranded); // delivered once, never read, waiting out the ack wait
    console.log(`[consume-close] close(): ${r.published} published over 10 stops; ${r.stranded} stranded`);
  }, 60_000);
});
