import { afterEach, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager, jetstream } from "@nats-io/jetstream";
import { Store } from "../../actors/index.ts";
import { UNDELIVERED_GRACE_MS } from "../../actors/shard/decide.ts";
import { connectNats, names } from "../../common/index.ts";
import { DispatchDelivery, dropStreams, ensureExecutorConsumer, ensureStreams } from "../../protocol/index.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, testConfig, testNamespace, waitFor } from "../helpers.ts";

/**
 * A run's timeout counts from its dispatch's landing in the stream. When nothing delivers it
 * (a consumer leader election, its pulls issued again; here: no executor instance pulling), the
 * executor has not had its timeout yet: the run waits for delivery (up to UNDELIVERED_GRACE_MS
 * past its timeout) instead of timing out unseen, and runs once delivered.
 */

let tc: TestCluster | null = null;
let store: Store | null = null;
let nc: NatsConnection | null = null;
afterEach(async () => {
  await nc?.close(); nc = null;
  await store?.close(); store = null;
  await tc?.teardown(); tc = null;
});

describe("the executors' consumer's delivery progress (DispatchDelivery)", () => {
  it("says a message is undelivered until a pull takes it, then delivered; an answer older than asked for is not used", async () => {
    const ns = testNamespace("deliv");
    const n = names(ns);
    nc = await connectNats(testConfig(ns).nats);
    const jsm = await jetstreamManager(nc);
    await ensureStreams(jsm, n, { replicas: 1 });
    try {
      const durable = await ensureExecutorConsumer(jsm, n, "w");
      const js = jetstream(nc);
      const seqs: number[] = [];
      for (let i = 0; i < 3; i++) seqs.push((await js.publish(n.dispatchSubject("w"), new TextEncoder().encode(`m${i}`))).seq);
      let now = 1000;
      const d = new DispatchDelivery({ jsm, names: n, clock: { now: () => now } });
      const ask = () => new Promise<void>((r) => d.ask("w", r));
      expect(d.status("w", seqs[0]!, 1000)).toBe("ask");
      await ask();
      expect(d.status("w", seqs[0]!, 1000)).toBe("undelivered");
      const c = await js.consumers.get(n.dispatchStream, durable);
      const m = await c.next({ expires: 2000 });
      expect(m?.seq).toBe(seqs[0]);
      expect(d.status("w", seqs[0]!, 1001), "an answer from before the question").toBe("ask");
      now = 2000;
      await ask();
      expect(d.status("w", seqs[0]!, 2000)).toBe("delivered");
      expect(d.status("w", seqs[1]!, 2000)).toBe("undelivered");
      // An unknown consumer (JetStream answers with an error): nothing is known to be delivered.
      await new Promise<void>((r) => d.ask("nobody", r));
      expect(d.status("nobody", 1, 2000)).toBe("undelivered");
    } finally {
      await dropStreams(jsm, n);
    }
  });

  it("a run whose dispatch nobody took within its timeout runs once an executor takes it, and succeeds", async () => {
    tc = new TestCluster("undeliv", { AX_SHARDS: "2" });
    store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
    await tc.startNode("n1");
    await tc.waitForShards();
    // Registered, then gone: its consumer keeps the dispatch, nobody pulls it.
    const first = await tc.startExecutor("w", async () => undefined);
    await first.registered;
    await first.stop();
    const client = await tc.client();
    const timeoutMs = 2000;
    const due = Date.now() + 1500;
    await client.call("task.create", { name: "unseen", executor: "w", at: new Date(due).toISOString(), timeout: `${timeoutMs}ms`, retries: 0 });
    const task = await waitFor(() => store!.getTask("unseen"), 10_000, "task row");
    // Its timeout passes with the dispatch undelivered.
    await sleep(Math.max(0, due + timeoutMs + 2500 - Date.now()));
    expect((await store.listRuns(task.id, 10)).map((r) => r.state)).toEqual(["running"]);
    const starts: number[] = [];
    await tc.startExecutor("w", async () => { starts.push(Date.now()); });
    const runs = await waitFor(async () => {
      const rs = await store!.listRuns(task.id, 10);
      return rs.length && rs.every((r) => r.state !== "running") ? rs : null;
    }, 20_000, "the run finished");
    expect(starts, "the handler ran once, after the run's timeout").toHaveLength(1);
    expect(starts[0]! - due).toBeGreaterThan(timeoutMs);
    expect(starts[0]! - due).toBeLessThan(timeoutMs + UNDELIVERED_GRACE_MS);
    expect(runs.map((r) => r.state)).toEqual(["success"]);
  }, 60_000);
});
