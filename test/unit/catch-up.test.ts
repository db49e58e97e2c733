import { describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { SimulatedClock, SystemClock, silentLogger } from "../../common/index.ts";
import { EventCatchUp, connectionUptime, consumerStalled, noteJetStreamTrouble, type ConsumerProgress, type ConsumerSample } from "../../protocol/index.ts";

/** A consumer whose position the test moves by hand. */
function fakeProgress() {
  const s = { last: 10, pending: 0, ackPending: 0, ackFloor: 10, fail: false };
  const p: ConsumerProgress = {
    async streamLastSeq() { if (s.fail) throw new Error("timeout"); return s.last; },
    async consumer() { if (s.fail) throw new Error("timeout"); return { pending: s.pending, ackPending: s.ackPending, ackFloorSeq: s.ackFloor }; },
  };
  return { s, p };
}
const clock = new SystemClock();
const wait = (c: EventCatchUp) => new Promise<string | undefined>((r) => c.request(r));

describe("EventCatchUp", () => {
  it("confirms at once when the consumer has applied everything", async () => {
    const { p } = fakeProgress();
    const c = new EventCatchUp(p, clock, silentLogger, { pollMs: 5 });
    const t = Date.now();
    expect(c.covers(t)).toBe(false);
    expect(await wait(c)).toBeUndefined();
    expect(c.covers(t)).toBe(true);
    expect(c.covers(Date.now() + 60_000)).toBe(false); // events published later are not vouched for
  });

  it("waits while events published before the check are unread, and confirms once they are acked", async () => {
    const { s, p } = fakeProgress();
    Object.assign(s, { last: 20, pending: 3, ackPending: 2, ackFloor: 15 });
    const c = new EventCatchUp(p, clock, silentLogger, { pollMs: 5 });
    let done: string | undefined | null = null;
    c.request((why) => { done = why; });
    await new Promise((r) => setTimeout(r, 60));
    expect(done).toBeNull();
    s.last = 30; s.ackFloor = 20; // acked up to the target read at the start; later events do not matter
    await new Promise((r) => setTimeout(r, 60));
    expect(done).toBeUndefined();
  });

  it("does not confirm until NATS has been back for the settle time, and gives up with the reason", async () => {
    const { p } = fakeProgress();
    let up: number | null = null;
    const c = new EventCatchUp(p, clock, silentLogger, { pollMs: 5, uptimeMs: () => up, settleMs: 1000, giveUpMs: 200 });
    const why = await wait(c);
    expect(why).toMatch(/NATS disconnected/);
    expect(c.covers(Date.now() - 1000)).toBe(false);
    up = 100;
    expect(await wait(c)).toMatch(/back only 100ms ago/);
    up = 5000;
    expect(await wait(c)).toBeUndefined();
  });

  it("counts its own failed JetStream requests as an outage: confirms only settleMs after the last one, up to the stream's sequence after it, and tells onTrouble", async () => {
    // A clustered stream whose leader died: the connection stays up, the requests time out.
    const { s, p } = fakeProgress();
    s.fail = true;
    let troubles = 0;
    const c = new EventCatchUp(p, clock, silentLogger, { pollMs: 5, uptimeMs: () => 60_000, settleMs: 150, onTrouble: () => { troubles++; }, giveUpMs: 5000 });
    let done: string | undefined | null = null;
    const t0 = Date.now();
    c.request((why) => { done = why; });
    await new Promise((r) => setTimeout(r, 60));
    expect(done).toBeNull();
    expect(troubles).toBeGreaterThan(0);
    // The stream answers again, everything in it applied; the executor's completion is still in
    // its retry loop and lands 80 ms later (seq 11).
    Object.assign(s, { fail: false });
    const backAt = Date.now();
    await new Promise((r) => setTimeout(r, 80));
    expect(done).toBeNull(); // within the settle time: not confirmed although nothing is unread
    Object.assign(s, { last: 11, pending: 1 });
    await new Promise((r) => setTimeout(r, 170));
    expect(done).toBeNull(); // settled, but the completion published after the outage is not applied
    Object.assign(s, { pending: 0, ackFloor: 11 });
    await new Promise((r) => setTimeout(r, 40));
    expect(done).toBeUndefined();
    expect(Date.now() - backAt).toBeGreaterThanOrEqual(150);
    expect(c.covers(t0)).toBe(true);
  });

  it("shares what one check saw: an outage noted on the connection holds every check until it settles", async () => {
    const { p } = fakeProgress();
    let quietFor = 40; // the shared watcher: JetStream failed 40 ms ago (another shard's check, a lease renewal)
    const c = new EventCatchUp(p, clock, silentLogger, { pollMs: 5, uptimeMs: () => quietFor, settleMs: 1000, giveUpMs: 100 });
    expect(await wait(c)).toMatch(/back only 40ms ago/);
    quietFor = 1500;
    expect(await wait(c)).toBeUndefined();
  });

  it("shares one check between concurrent requests", async () => {
    const { p } = fakeProgress();
    let calls = 0;
    const counting: ConsumerProgress = { streamLastSeq: () => { calls++; return p.streamLastSeq(); }, consumer: () => p.consumer() };
    const c = new EventCatchUp(counting, clock, silentLogger, { pollMs: 5 });
    await Promise.all([wait(c), wait(c), wait(c)]);
    expect(calls).toBe(1);
  });
});

describe("connectionUptime", () => {
  it("counts from the later of the last reconnect and the last JetStream trouble noted on the connection, for every caller", async () => {
    // Only status() is read; an iterator that never yields is a connection that never drops.
    const nc = { status: () => ({ [Symbol.asyncIterator]: () => ({ next: () => new Promise<never>(() => undefined) }) }) } as unknown as NatsConnection;
    const sim = new SimulatedClock();
    const uptimeA = connectionUptime(nc, sim);
    const uptimeB = connectionUptime(nc, sim);
    sim.advance(10_000);
    expect(uptimeA()).toBe(Infinity); // connected since before the watch began, no trouble yet
    noteJetStreamTrouble(nc, sim)();
    sim.advance(1200);
    expect(uptimeA()).toBe(1200);
    expect(uptimeB()).toBe(1200);
    const other = { status: nc.status } as unknown as NatsConnection; // another connection is not affected
    expect(connectionUptime(other, sim)()).toBe(Infinity);
  });
});

describe("consumerStalled", () => {
  const at = (o: Partial<ConsumerSample>): ConsumerSample => ({ pending: 0, ackPending: 0, deliveredSeq: 5, ackFloorSeq: 5, atMono: 0, ...o });
  it("is stuck only with messages pending, nothing delivered for the quiet time and nothing unacked", () => {
    expect(consumerStalled(at({}), at({ pending: 3, atMono: 10_000 }), 10_000)).toBe(true);
    expect(consumerStalled(at({}), at({ pending: 3, atMono: 9_000 }), 10_000)).toBe(false); // not quiet long enough
    expect(consumerStalled(at({}), at({ pending: 0, atMono: 20_000 }), 10_000)).toBe(false); // idle, nothing to deliver
    expect(consumerStalled(at({}), at({ pending: 3, deliveredSeq: 6, atMono: 20_000 }), 10_000)).toBe(false); // moving
    expect(consumerStalled(at({}), at({ pending: 3, ackPending: 2, atMono: 20_000 }), 10_000)).toBe(false); // reader slow, not the consumer
  });
});
