import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { AckPolicy, jetstream, jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { connectNats } from "../../common/index.ts";
import { closeGently } from "../../protocol/index.ts";
import { testConfig, testNamespace, waitFor } from "../helpers.ts";

/**
 * A shard restart or hand-over, an executor's stop: each ends a consume() while the server is
 * sending. A message on its way to a subscription that is gone reaches no one and waits out the
 * consumer's ack wait (10 s for a shard's events): a completion that late kept its run `running`
 * and its every-second task skipping slots (found as a flaky dead-letter test in CI). Ended with
 * closeGently, every message sent reaches the loop, which acks or hands it back: nothing stays
 * pending once publishing stops, over many stop-and-restart cycles under a steady publish.
 */
const ns = testNamespace("cclose");
const STREAM = `${ns.toUpperCase()}_CLOSE`;
let nc: NatsConnection; let jsm: JetStreamManager;

beforeAll(async () => {
  nc = await connectNats(testConfig(ns).nats);
  jsm = await jetstreamManager(nc);
  await jsm.streams.add({ name: STREAM, subjects: [`${ns}.close.>`] });
  // A 60 s ack wait: a stranded message cannot come back within the test.
  await jsm.consumers.add(STREAM, { durable_name: "c", ack_policy: AckPolicy.Explicit, ack_wait: 60_000_000_000, filter_subject: `${ns}.close.x` });
});
afterAll(async () => {
  await jsm?.streams.delete(STREAM).catch(() => undefined);
  await nc?.close();
});

describe("closeGently", () => {
  it("strands no message across stop-and-restart cycles of a consumer under a steady publish; those on their way are handed back", async () => {
    const js = jetstream(nc);
    const acked = new Set<number>();
    let handedBack = 0; let published = 0; let publishing = true;
    const publisher = (async () => {
      for (let i = 0; publishing; i++) {
        await js.publish(`${ns}.close.x`, new Uint8Array([i & 255]));
        published++;
        if (i % 20 === 19) await new Promise((r) => setTimeout(r, 5));
      }
    })();
    // Fixed, uneven lifetimes (a seeded sequence, not Math.random): each stop lands at a different point of a pull.
    let seed = 7;
    for (let cycle = 0; cycle < 14; cycle++) {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      const lifetimeMs = 150 + (seed % 250);
      const messages = await (await js.consumers.get(STREAM, "c")).consume({ max_messages: 256, expires: 30_000 });
      let stopping = false;
      const loop = (async () => {
        for await (const m of messages) {
          // As a shard actor that stopped does: what arrives after the stop goes back at once.
          if (stopping) { m.nak(); handedBack++; continue; }
          acked.add(m.seq); m.ack();
        }
      })();
      await new Promise((r) => setTimeout(r, lifetimeMs));
      stopping = true;
      await closeGently(messages);
      await loop;
    }
    publishing = false;
    await publisher;
    // One last reader takes what is left; nothing may stay pending behind it.
    const last = await (await js.consumers.get(STREAM, "c")).consume({ max_messages: 256, expires: 30_000 });
    const tail = (async () => { for await (const m of last) { acked.add(m.seq); m.ack(); } })();
    await waitFor(() => acked.size >= published, 10_000, `all ${published} messages to be read (got ${acked.size})`);
    await waitFor(async () => (await jsm.consumers.info(STREAM, "c")).num_ack_pending === 0, 5_000, "no message pending an ack");
    await last.close(); await tail;
    const info = await jsm.consumers.info(STREAM, "c");
    expect(info.num_ack_pending).toBe(0);
    expect(info.num_pending).toBe(0);
    expect(acked.size).toBe(published);
    expect(published).toBeGreaterThan(1000);
    console.log(`[consume-close] ${published} published over 14 cycles; ${handedBack} arrived after a stop and were handed back; 0 stranded`);
  }, 60_000);
});
