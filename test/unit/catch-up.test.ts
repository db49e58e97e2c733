import { describe, expect, it } from "vitest";
import { SystemClock, silentLogger } from "../../common/index.ts";
import { EventCatchUp, consumerStalled, type ConsumerProgress, type ConsumerSample } from "../../protocol/index.ts";

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

  it("shares one check between concurrent requests", async () => {
    const { p } = fakeProgress();
    let calls = 0;
    const counting: ConsumerProgress = { streamLastSeq: () => { calls++; return p.streamLastSeq(); }, consumer: () => p.consumer() };
    const c = new EventCatchUp(counting, clock, silentLogger, { pollMs: 5 });
    await Promise.all([wait(c), wait(c), wait(c)]);
    expect(calls).toBe(1);
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
