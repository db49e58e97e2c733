import { afterEach, describe, expect, it } from "vitest";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Store } from "../../actors/index.ts";
import { names } from "../../common/index.ts";
import { TestCluster } from "../cluster.ts";
import { OwnNatsServer } from "../natsServer.ts";
import { sleep, waitFor } from "../helpers.ts";

/**
 * A dispatch whose publish is held up (NATS frozen with SIGSTOP, as a stream leader election or a
 * restart holds it) lands seconds after its release. The run must get its whole timeout from
 * the moment its dispatch became visible, as the executor gives its handler: a run the executor
 * completed within its timeout is a success, not `timed_out` with a late outcome (which would
 * also retry it beside the completed one).
 */

let tc: TestCluster | null = null;
let nats: OwnNatsServer | null = null;
let store: Store | null = null;
let nc: NatsConnection | null = null;
afterEach(async () => {
  // The server is stopped whatever failed before (a cluster that never started cannot tear down).
  try {
    await nc?.close(); nc = null;
    nats?.signal("SIGCONT");
    await store?.close(); store = null;
    await tc?.teardown(); tc = null;
  } finally { await nats?.stop(); nats = null; }
});

describe("a dispatch published late", () => {
  it("gives its run the whole timeout from when the dispatch landed, so a completion within it is a success", async () => {
    nats = new OwnNatsServer("listen: 127.0.0.1:{{PORT}}\njetstream { store_dir: \"{{STORE}}\" }\n");
    await nats.start();
    // Leases long enough to outlast the freeze: this test is about the run, not a fail-over.
    // A 100 ms lead: the run is recorded (and its message published) inside the freeze below,
    // which starts 200 ms before the due time; with a longer lead it would have gone out before.
    tc = new TestCluster("latepub", { AX_NATS_URL: nats.url, AX_LEASE_TTL: "30s", AX_SHARDS: "2", AX_LEAD: "100ms" });
    store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 2 });
    await tc.startNode("n1");
    await tc.waitForShards();
    const timeoutMs = 3000;
    const starts: number[] = [];
    nc = await connect({ servers: nats.url });
    const jsm = await jetstreamManager(nc);
    const eventsStream = names(tc.ns).eventsStream;
    // The handler is short, so its end carries its start (nothing tells the shard it started).
    // It also makes the events stream refuse messages for 1.5 s (as a stream electing a leader
    // answers nothing): the executor's completion is retried and lands about 2 s after the run.
    const maxMsgSize = (await jsm.streams.info(eventsStream)).config.max_msg_size;
    let restored: Promise<unknown> = Promise.resolve();
    const ex = await tc.startExecutor("w", async () => {
      starts.push(Date.now());
      const refusing = jsm.streams.update(eventsStream, { max_msg_size: 8 });
      restored = refusing.then(() => sleep(1500)).then(() => jsm.streams.update(eventsStream, { max_msg_size: maxMsgSize }));
      await refusing;
    });
    await ex.registered;
    const client = await tc.client();
    const due = Date.now() + 2500;
    await client.call("task.create", { name: "late", executor: "w", at: new Date(due).toISOString(), timeout: `${timeoutMs}ms`, retries: 1 });
    // Frozen from just before the due time for 2.5 s: the release's publish waits and lands at
    // about due + 2.4 s, the handler runs at once and its completion lands about due + 4.4 s.
    // Timed from the release, the run would be timed out at due + 3 s; from the landing, its
    // timeout is about due + 5.4 s.
    await sleep(Math.max(0, due - 200 - Date.now()));
    nats.signal("SIGSTOP");
    await sleep(2500);
    nats.signal("SIGCONT");
    const task = await waitFor(() => store!.getTask("late"), 10_000, "task row");
    await waitFor(() => starts.length > 0, 10_000, "the handler ran");
    await restored;
    const runs = await waitFor(async () => {
      const rs = await store!.listRuns(task.id, 10);
      return rs.length && rs.every((r) => r.state !== "running") ? rs : null;
    }, 20_000, "the run finished");
    await sleep(500); // a retry, if the run were timed out, would be recorded by now
    const all = await store.listRuns(task.id, 10);
    expect(starts.length, "the handler ran once").toBe(1);
    expect(starts[0]! - due, "the dispatch was held up by the freeze").toBeGreaterThan(2000);
    expect(starts[0]! - due, "the handler ran within its timeout of the dispatch landing").toBeLessThan(timeoutMs);
    expect(all.map((r) => ({ state: r.state, late: r.lateOutcome ?? null })), JSON.stringify({ runs, startedAfterDue: starts[0]! - due })).toEqual([{ state: "success", late: null }]);
  }, 60_000);
});
