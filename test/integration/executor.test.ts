import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { names } from "../../common/index.ts";
import { EventBatchSchema, Executor, decode, encode, type DispatchRun, type RunContext, type RunEvent } from "../../protocol/index.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, waitFor } from "../helpers.ts";

// The SDK alone, against real JetStream: dispatches are published here as a node would, and the
// events it sends back are read off the events subjects.
const tc = new TestCluster("executor");
const n = names(tc.ns);
let nc: NatsConnection;
let ex: Executor;
const seen: RunEvent[] = [];
const aborted = new Map<string, boolean>();
const handled = new Map<string, number>();
/** When each run's handler started, on the wall clock and on this process's monotonic clock. */
const startedAt = new Map<string, { wall: number; mono: number }>();

async function handler(ctx: RunContext): Promise<void> {
  const mode = (ctx.payload as { mode: string }).mode;
  startedAt.set(ctx.runId, { wall: Date.now(), mono: performance.now() });
  handled.set(ctx.runId, (handled.get(ctx.runId) ?? 0) + 1);
  if (mode === "watch") {
    await new Promise<void>((_, reject) => ctx.signal.addEventListener("abort", () => { aborted.set(ctx.runId, ctx.signal.aborted); reject(new Error("gave up")); }));
  }
  if (mode === "hang") await new Promise(() => undefined); // never settles, never looks at the signal
  if (mode === "late-look") {
    await new Promise((r) => setTimeout(r, 500));
    aborted.set(ctx.runId, ctx.signal.aborted); // a signal first read after the deadline is already aborted
  }
}

let seq = 0;
async function dispatch(mode: string, timeoutMs: number): Promise<string> {
  const runId = `r-${mode}-${++seq}`;
  const now = Date.now();
  const run: DispatchRun = { runId, taskId: seq, taskName: mode, attempt: 1, source: "manual", payload: { mode }, scheduledAt: now, firedAt: now, timeoutMs };
  await jetstream(nc).publish(n.dispatchSubject("sdk"), encode({ v: 1, shard: 0, epoch: 1, node: "test", runs: [run] }), { msgID: `d:${runId}` });
  return runId;
}
const eventsOf = (runId: string) => seen.filter((e) => e.runId === runId);

beforeAll(async () => {
  nc = await connect({ servers: tc.config.natsUrl });
  ex = new Executor({ name: "sdk", handler, namespace: tc.ns, natsUrl: tc.config.natsUrl, register: false, eventFlushMs: 2 });
  await ex.start();
  nc.subscribe(n.eventsWildcard, { callback: (_e, m) => { const d = decode(EventBatchSchema, m.data); if (d.ok) seen.push(...d.value.events); } });
  await nc.flush();
});

afterAll(async () => {
  await ex?.stop();
  await nc?.close();
  await tc.teardown();
});

describe("executor SDK", () => {
  it("two deliveries of one run while run.check is slow: the handler runs once", async () => {
    // run.check answered here, after 400 ms ("nothing stale"), as a node under load might.
    const sub = nc.subscribe(n.apiSubject("run.check.sdk"), { callback: (_e, m) => { setTimeout(() => m.respond(encode({ ok: true, value: { stale: {} } })), 400); } });
    try {
      const runId = `r-twice-${++seq}`;
      const now = Date.now();
      // Fired 3 s ago: older than the SDK's stale-check threshold, so each delivery asks run.check.
      const run: DispatchRun = { runId, taskId: seq, taskName: "twice", attempt: 1, source: "manual", payload: { mode: "quick" }, scheduledAt: now - 3000, firedAt: now - 3000, timeoutMs: 10_000 };
      const js = jetstream(nc);
      for (const copy of ["a", "b"]) await js.publish(n.dispatchSubject("sdk"), encode({ v: 1, shard: 0, epoch: 1, node: "test", runs: [run] }), { msgID: `d:${runId}:${copy}` });
      await waitFor(() => eventsOf(runId).some((e) => e.type === "completed"), 5000, "completed event");
      await new Promise((r) => setTimeout(r, 1000)); // the second delivery, had it run, would be done by now
      expect(handled.get(runId)).toBe(1);
      expect(eventsOf(runId).filter((e) => e.type === "completed")).toHaveLength(1);
    } finally { sub.unsubscribe(); }
  });

  it("aborts a run's signal at its timeout and reports the run failed", async () => {
    const runId = await dispatch("watch", 300);
    await waitFor(() => eventsOf(runId).some((e) => e.type === "failed"), 5000, "failed event");
    expect(aborted.get(runId)).toBe(true);
    const failed = eventsOf(runId).find((e) => e.type === "failed")!;
    expect(failed.error?.message).toBe("timed out after 300ms");
    expect(failed.error?.type).toBe("timeout");
  });

  it("reports a handler that never settles (and never reads its signal) failed at the timeout", async () => {
    const t0 = Date.now();
    const runId = await dispatch("hang", 300);
    await waitFor(() => eventsOf(runId).some((e) => e.type === "failed"), 5000, "failed event");
    const failed = eventsOf(runId).find((e) => e.type === "failed")!;
    expect(failed.error?.message).toBe("timed out after 300ms");
    expect(failed.at - t0).toBeGreaterThanOrEqual(290);
  });

  it("a signal first read after the deadline is already aborted", async () => {
    const runId = await dispatch("late-look", 200);
    await waitFor(() => aborted.has(runId), 5000, "handler looked at its signal");
    expect(aborted.get(runId)).toBe(true);
  });

  it("a short run sends one completed event carrying its start", async () => {
    const runId = await dispatch("quick", 5000);
    await waitFor(() => eventsOf(runId).length > 0, 5000, "events");
    await new Promise((r) => setTimeout(r, 100));
    const ev = eventsOf(runId);
    expect(ev.map((e) => e.type)).toEqual(["completed"]);
    expect(ev[0]!.startedAt).toBeLessThanOrEqual(ev[0]!.at);
  });

  it("600 runs returning 7 KB results each, finishing together: every completion arrives, in messages NATS accepts (under 1 MB)", async () => {
    // 600 × 7 KB in one flush is 4 MB: sent as one message (or as 500 events, 3.5 MB, as before)
    // NATS refuses it, the completions never arrive and the runs time out.
    const name = "bigresults";
    const runIds = Array.from({ length: 600 }, (_, i) => `r-big-${i}`);
    const now = Date.now();
    const runs: DispatchRun[] = runIds.map((runId, i) => ({ runId, taskId: 5000 + i, taskName: "big", attempt: 1, source: "manual", payload: { mode: "big" }, scheduledAt: now, firedAt: now, timeoutMs: 60_000 }));
    const js = jetstream(nc);
    for (let i = 0; i < runs.length; i += 100) {
      await js.publish(n.dispatchSubject(name), encode({ v: 1, shard: 0, epoch: 1, node: "test", runs: runs.slice(i, i + 100) }), { msgID: `d:big:${i}` });
    }
    const completed = new Map<string, number>();
    let largest = 0;
    const sub = nc.subscribe(n.eventsWildcard, { callback: (_e, m) => {
      largest = Math.max(largest, m.data.byteLength);
      const d = decode(EventBatchSchema, m.data);
      if (!d.ok) return;
      for (const e of d.value.events) if (e.type === "completed" && e.runId.startsWith("r-big-")) completed.set(e.runId, JSON.stringify(e.result ?? null).length);
    } });
    await nc.flush();
    const big = new Executor({ name, handler: () => "x".repeat(7000), namespace: tc.ns, natsUrl: tc.config.natsUrl, register: false, concurrency: 600, eventFlushMs: 300 });
    try {
      await big.start();
      await waitFor(() => completed.size === runIds.length, 20_000, "every completion stored");
      expect([...completed.values()].every((len) => len === 7002)).toBe(true); // the result, whole
      expect(largest).toBeLessThan(1024 * 1024);
    } finally {
      sub.unsubscribe();
      await big.stop();
    }
  });

  it("dispatches finishing within one flush interval share an event message, and each is acked only once its events are stored", async () => {
    // Its own executor name (its own dispatch consumer) and a long flush interval, so the ten
    // dispatches below, delivered together, all finish inside one interval.
    const name = "batched";
    const runIds = Array.from({ length: 10 }, (_, i) => `r-batched-${i}`);
    const js = jetstream(nc);
    const now = Date.now();
    for (const [i, runId] of runIds.entries()) {
      const run: DispatchRun = { runId, taskId: 1000 + i, taskName: "batched", attempt: 1, source: "manual", payload: { mode: "quick" }, scheduledAt: now, firedAt: now, timeoutMs: 10_000 };
      await js.publish(n.dispatchSubject(name), encode({ v: 1, shard: 0, epoch: 1, node: "test", runs: [run] }), { msgID: `d:${runId}` });
    }
    // Event messages carrying these runs, and how many of those runs' completions were seen
    // each time the dispatch consumer's acks are read.
    let messages = 0;
    const completed = new Set<string>();
    const sub = nc.subscribe(n.eventsWildcard, { callback: (_e, m) => {
      const d = decode(EventBatchSchema, m.data);
      if (!d.ok) return;
      const mine = d.value.events.filter((e) => runIds.includes(e.runId));
      if (mine.length) messages++;
      for (const e of mine) if (e.type === "completed") completed.add(e.runId);
    } });
    await nc.flush();
    const batched = new Executor({ name, handler, namespace: tc.ns, natsUrl: tc.config.natsUrl, register: false, eventFlushMs: 300 });
    const jsm = await jetstreamManager(nc);
    try {
      await batched.start();
      const durable = n.executorConsumer(name);
      let ackedBeforeStored = 0;
      let acked = 0;
      while (acked < runIds.length) {
        const info = await jsm.consumers.info(n.dispatchStream, durable);
        // Counted after the consumer's state, not before: the events and this reply come over one
        // connection, and an event stored before an ack was sent to it before the reply showing
        // the ack. Counted before, a burst of completions and acks inside the request's round
        // trip looked like acks ahead of their events (seen once under a full test run).
        const seen = completed.size;
        acked = info.ack_floor.stream_seq === 0 ? 0 : runIds.length - info.num_pending - info.num_ack_pending;
        if (acked > seen) ackedBeforeStored = Math.max(ackedBeforeStored, acked - seen);
        await sleep(5);
      }
      expect(ackedBeforeStored).toBe(0);
      expect(completed.size).toBe(runIds.length);
      // One forced flush per dispatch sent one event message (and took one ack on the node) per dispatch.
      expect(messages).toBeLessThanOrEqual(2);
    } finally {
      sub.unsubscribe();
      await batched.stop();
    }
  });

  describe("runs sent ahead of their due time (v2 `sentAt`)", () => {
    /** Publishes a v2 message as a node whose clock reads `sentAt` now; returns when it was published on this process's monotonic clock. */
    async function sendAhead(runs: DispatchRun[], sentAt: number, msgID: string, node = "test"): Promise<number> {
      const at = performance.now();
      await jetstream(nc).publish(n.dispatchSubject("sdk"), encode({ v: 2, node, sentAt, runs }), { msgID });
      return at;
    }
    const aheadRun = (runId: string, firedAt: number): DispatchRun =>
      ({ runId, taskId: ++seq, taskName: "ahead", attempt: 1, source: "cron", payload: { mode: "quick" }, scheduledAt: firedAt, firedAt, timeoutMs: 30_000, shard: 0 });

    it("each run starts firedAt - sentAt after the message arrived, never sooner, whatever the sender's clock reads (seeded fuzz)", async () => {
      // mulberry32: the same cases every run.
      let state = 0x5eed1234;
      const rand = () => { state = (state + 0x6d2b79f5) | 0; let t = state; t = Math.imul(t ^ (t >>> 15), t | 1); t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
      const cases: Array<{ runId: string; publishedMono: number; holdMs: number }> = [];
      for (let node = 0; node < 3; node++) {
        // Each sender's wall clock up to 20 s behind or ahead of this machine's: the hold must not depend on it.
        const skew = Math.round((rand() - 0.5) * 40_000);
        for (let m = 0; m < 3; m++) {
          // Read before sentAt: the message cannot be sent sooner than this.
          const publishedMono = performance.now();
          const sentAt = Date.now() + skew;
          const runs = Array.from({ length: 2 + Math.floor(rand() * 5) }, (_, i) => aheadRun(`r-fz${node}-${m}-${i}-${++seq}`, sentAt + Math.round(rand() * 500) - 100));
          await sendAhead(runs, sentAt, `d:fz-${node}-${m}-${seq}`, `fz${node}`);
          for (const r of runs) cases.push({ runId: r.runId, publishedMono, holdMs: Math.max(0, r.firedAt - sentAt) });
          await sleep(Math.round(rand() * 50));
        }
      }
      await waitFor(() => cases.every((c) => startedAt.has(c.runId)), 10_000, "every run started");
      for (const c of cases) {
        const s = startedAt.get(c.runId)!;
        // `sentAt` is Date.now(), whole milliseconds: the instant it names is up to 1 ms before the
        // one it was read at (after publishedMono), and so is the due time the hold counts to
        // (seen: 340.87 ms for a hold of 341). Started sooner than that is before its due time.
        expect(s.mono - c.publishedMono, `${c.runId} started before its hold of ${c.holdMs} ms`).toBeGreaterThanOrEqual(c.holdMs - 1);
        // Not held for the skew: 20 s of it would show here.
        expect(s.mono - c.publishedMono - c.holdMs, `${c.runId} held too long`).toBeLessThan(2000);
        expect(handled.get(c.runId)).toBe(1);
      }
    });

    it("run.check is asked about runs whose message sat in the queue, not about runs a node fired late and published at once", async () => {
      const asked: string[] = [];
      const sub = nc.subscribe(n.apiSubject("run.check.sdk"), { callback: (_e, m) => {
        const body = JSON.parse(new TextDecoder().decode(m.data)) as { runs: Array<{ runId: string }> };
        asked.push(...body.runs.map((r) => r.runId));
        m.respond(encode({ ok: true, value: { stale: {} } }));
      } });
      try {
        await nc.flush();
        const checkedBefore = ex.stats.checked;
        // Fired 5 s ago by a node that was behind, published just now: delivered at once, not checked.
        const firedLate = aheadRun(`r-fired-late-${++seq}`, Date.now() - 5000);
        await sendAhead([firedLate], Date.now(), `d:${firedLate.runId}`);
        // Fired 3 s ago and published then: it sat in the queue for 3 s, so it is checked first.
        const queued = aheadRun(`r-queued-${++seq}`, Date.now() - 3000);
        await sendAhead([queued], Date.now() - 3000, `d:${queued.runId}`);
        await waitFor(() => startedAt.has(firedLate.runId) && startedAt.has(queued.runId), 5000, "both runs started");
        expect(asked).toEqual([queued.runId]);
        expect(ex.stats.checked - checkedBefore).toBe(1);
        expect(handled.get(firedLate.runId)).toBe(1);
        expect(handled.get(queued.runId)).toBe(1);
      } finally { sub.unsubscribe(); }
    });

    it("a run revoked while it is held here never starts, nor does one revoked before it arrives", async () => {
      const heldBefore = ex.stats.held;
      const revokedBefore = ex.stats.revoked;
      const a = aheadRun(`r-revoke-held-${++seq}`, Date.now() + 3000);
      const keep = aheadRun(`r-revoke-keep-${++seq}`, Date.now() + 3000);
      await sendAhead([a, keep], Date.now(), `d:${a.runId}`);
      await waitFor(() => ex.stats.held >= heldBefore + 2, 3000, "both runs held");
      nc.publish(n.executorCancelSubject("sdk"), encode({ revoke: [a.runId] }));
      await nc.flush();
      expect(Date.now(), "the revoke went out well before the run's due time").toBeLessThan(a.firedAt - 500);
      // Revoked before its message is even published: the instance remembers it.
      const b = aheadRun(`r-revoke-early-${++seq}`, Date.now() + 300);
      nc.publish(n.executorCancelSubject("sdk"), encode({ revoke: [b.runId] }));
      await nc.flush();
      await sendAhead([b], Date.now(), `d:${b.runId}`);
      await waitFor(() => startedAt.has(keep.runId), 8000, "the run not revoked");
      await waitFor(() => ex.stats.revoked >= revokedBefore + 2, 5000, "both revoked runs dropped");
      await sleep(200);
      expect(handled.has(a.runId)).toBe(false);
      expect(handled.has(b.runId)).toBe(false);
      expect(eventsOf(a.runId)).toEqual([]);
      expect(eventsOf(b.runId)).toEqual([]);
      expect(startedAt.get(keep.runId)!.wall).toBeGreaterThanOrEqual(keep.firedAt);
    });

    it("an operator's cancel of a run held here is answered, and the run ends cancelled without its handler", async () => {
      const r = aheadRun(`r-cancel-held-${++seq}`, Date.now() + 1000);
      const heldBefore = ex.stats.held;
      await sendAhead([r], Date.now(), `d:${r.runId}`);
      await waitFor(() => ex.stats.held > heldBefore, 3000, "the run held");
      const reply = await nc.request(n.executorCancelSubject("sdk"), encode({ runId: r.runId, who: "alice" }), { timeout: 2000 });
      expect(JSON.parse(new TextDecoder().decode(reply.data))).toMatchObject({ ok: true, value: { runId: r.runId } });
      await waitFor(() => eventsOf(r.runId).some((e) => e.type === "failed"), 5000, "failed event");
      const failed = eventsOf(r.runId).find((e) => e.type === "failed")!;
      expect(failed.error).toMatchObject({ type: "cancelled", nonRetryable: true });
      expect(failed.error!.message).toMatch(/cancelled by alice/);
      expect(failed.at).toBeGreaterThanOrEqual(r.firedAt);
      expect(handled.has(r.runId)).toBe(false);
    });
  });
});
