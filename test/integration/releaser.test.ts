import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { Releaser, type Held, type ReleaseOutcome } from "../../actors/index.ts";
import { connectNats, names, silentLogger } from "../../common/index.ts";
import { dropStreams, ensureStreams } from "../../protocol/index.ts";
import { sleep, testConfig, testNamespace } from "../helpers.ts";

/**
 * The releaser thread (the backstop of the node's release timers) against a real NATS server: a
 * message handed over is published by the thread, not before its release time, while the node's
 * own thread is blocked past it; a message the node claims back is never published by the thread,
 * and one the thread took cannot be claimed back (a seeded race of both, checked against what the
 * stream holds); a lease past its deadline or a revoked shard hands the message back unpublished.
 */
const ns = testNamespace("releaser");
const n = names(ns);
const cfg = testConfig(ns);
const subject = n.dispatchSubject("e");
let nc: NatsConnection;
let jsm: JetStreamManager;
let releaser: Releaser;
const enc = new TextEncoder();

beforeAll(async () => {
  nc = await connectNats(cfg.nats);
  jsm = await jetstreamManager(nc);
  await ensureStreams(jsm, n, { replicas: 1 });
  const r = await Releaser.start({ nats: cfg.nats, name: "releaser-test", log: silentLogger });
  if (!r) throw new Error("the releaser thread did not start");
  releaser = r;
});
afterAll(async () => {
  await releaser?.close();
  await dropStreams(jsm, n);
  await nc.close();
});

/** Message id → server timestamp (ms) of every message in the dispatch stream. */
async function streamed(): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  const info = await jsm.streams.info(n.dispatchStream);
  for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages > 0; seq++) {
    const m = await jsm.streams.getMessage(n.dispatchStream, { seq }).catch(() => null);
    const id = m?.header?.get("Nats-Msg-Id");
    if (m && id) out.set(id, m.timestamp ? Date.parse(m.timestamp) : NaN);
  }
  return out;
}

function hold(msgID: string, releaseAt: number, o: { validForMs?: number; shards?: number[] } = {}): Held {
  const h = releaser.hold({ subject, msgID, data: enc.encode(msgID), releaseAt, validForMs: o.validForMs ?? 60_000, shards: o.shards ?? [0] });
  if (!h) throw new Error("not held");
  return h;
}

const settledWithin = (p: Promise<ReleaseOutcome>, ms: number) => Promise.race([p, sleep(ms).then(() => null)]);

describe("the releaser thread", () => {
  it("publishes at the release time, never before, while the node's thread is blocked", async () => {
    const releaseAt = Date.now() + 300;
    const h = hold("blocked", releaseAt);
    await sleep(0); // handed over at the end of the turn that held it
    // The node's thread is busy past the release time (as in a long collection pause).
    const blockedUntil = Date.now() + 900;
    while (Date.now() < blockedUntil) { /* blocked */ }
    const o = await h.outcome;
    expect(o.kind).toBe("landed");
    const at = (await streamed()).get("blocked");
    expect(at).toBeDefined();
    expect(at!).toBeGreaterThanOrEqual(releaseAt);
    expect(at!, "published from the releaser thread while the node's thread was blocked").toBeLessThan(blockedUntil);
  });

  it("a message the node claims back is never published by the thread; one the thread took cannot be claimed back (seeded race)", async () => {
    let seed = 0x5eed;
    const rand = () => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed / 0x7fffffff; };
    const cases: Array<{ id: string; h: Held; recalled: boolean | null }> = [];
    const t0 = Date.now();
    for (let i = 0; i < 200; i++) {
      const id = `race-${i}`;
      cases.push({ id, h: hold(id, t0 + Math.floor(rand() * 60), { shards: [i % 7] }), recalled: null });
    }
    // Claims at random moments around the backstop times: some before, some after the take.
    const order = cases.map((c, i) => ({ c, at: t0 + Math.floor(rand() * 80), i })).sort((a, b) => a.at - b.at);
    for (const { c, at } of order) {
      const wait = at - Date.now();
      if (wait > 0) await sleep(wait);
      c.recalled = releaser.claim(c.h.slot);
    }
    const outcomes = await Promise.all(cases.map((c) => settledWithin(c.h.outcome, c.recalled ? 500 : 5000)));
    const inStream = await streamed();
    let recalled = 0;
    for (const [i, c] of cases.entries()) {
      if (c.recalled) {
        recalled++;
        expect(outcomes[i], `${c.id}: claimed, yet reported`).toBeNull();
        expect(inStream.has(c.id), `${c.id}: claimed, yet published by the thread`).toBe(false);
      } else {
        expect(outcomes[i]?.kind, c.id).toBe("landed");
        expect(inStream.has(c.id), `${c.id}: taken, not published`).toBe(true);
      }
    }
    // The seed gives both sides of the race (it would prove nothing with only one).
    expect(recalled).toBeGreaterThan(10);
    expect(recalled).toBeLessThan(190);
  });

  it("hands a message back unpublished when its leases' deadline has passed or its shard was revoked", async () => {
    const lapsed = hold("lapsed", Date.now() + 150, { validForMs: 50, shards: [1] });
    releaser.revoke(2);
    const before = hold("before-revoke", Date.now() + 150, { shards: [2, 3] });
    releaser.revoke(2);
    const after = hold("after-revoke", Date.now() + 150, { shards: [2] });
    expect(await lapsed.outcome).toMatchObject({ kind: "returned", reason: expect.stringMatching(/lease/) });
    expect(await before.outcome).toMatchObject({ kind: "returned", reason: expect.stringMatching(/shard 2/) });
    expect((await after.outcome).kind, "handed over after the revocation: released").toBe("landed");
    const inStream = await streamed();
    expect(inStream.has("lapsed")).toBe(false);
    expect(inStream.has("before-revoke")).toBe(false);
    expect(inStream.has("after-revoke")).toBe(true);
  });

  it("publishes nothing it held once closed (the node's timers release those)", async () => {
    const other = await Releaser.start({ nats: cfg.nats, name: "releaser-test-2", log: silentLogger });
    expect(other).not.toBeNull();
    const h = other!.hold({ subject, msgID: "closing", data: enc.encode("x"), releaseAt: Date.now() + 200, validForMs: 60_000, shards: [0] })!;
    await sleep(0);
    await other!.close();
    expect(await settledWithin(h.outcome, 500), "claimed back by close(): never reported").toBeNull();
    expect(other!.hold({ subject, msgID: "after-close", data: enc.encode("x"), releaseAt: Date.now(), validForMs: 60_000, shards: [0] }), "closed: the node releases on its own thread").toBeNull();
    expect((await streamed()).has("closing")).toBe(false);
  });
});
