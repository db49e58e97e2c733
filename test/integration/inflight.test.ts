import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { connectNats, names } from "../../common/index.ts";
import { encode } from "../../protocol/index.ts";
import type { AxNode } from "../../ops/node.ts";
import type { AxClient } from "../../ops/client.ts";
import { TestCluster } from "../cluster.ts";
import { waitFor } from "../helpers.ts";

/**
 * `executors.inflight` (the dashboard's overview) sums the places every live node's heartbeat
 * says its limiter holds, instead of counting `running` rows (a scan of the runs table on every
 * refresh). A live node of an older version, whose heartbeat does not say, makes it count the
 * runs table as before.
 */
const tc = new TestCluster("infl");
let node: AxNode;
let client: AxClient;
let nc: NatsConnection;
let release: () => void = () => undefined;
const held = new Promise<void>((r) => { release = r; });
let running = 0;

beforeAll(async () => {
  node = await tc.startNode("n1");
  await tc.waitForShards();
  const ex = await tc.startExecutor("slow", async () => { running++; await held; running--; });
  await ex.registered;
  client = await tc.client();
  nc = await connectNats(tc.config.nats);
});
afterAll(async () => { release(); await nc?.close(); await tc.teardown(); });

const inflight = () => client.call<Record<string, number>>("executors.inflight", {});
/** A member that never owns anything (joining), with or without the per-executor load. */
function ghost(id: string, byExecutor?: Record<string, number>): () => void {
  const beat = () => nc.publish(names(tc.ns).heartbeatSubject, encode({ v: 1, id, http: null, startedAt: Date.now(), shards: [],
    load: { firedPerSec: 0, inFlight: 0, lagMs: 0, ...(byExecutor ? { byExecutor } : {}) }, stopping: false, ready: false }));
  beat();
  const t = setInterval(beat, 100);
  return () => clearInterval(t);
}

describe("executors.inflight", () => {
  it("is what the nodes hold, from their heartbeats; with an older node live, the runs table's count", async () => {
    const at = new Date(Date.now() + 300).toISOString();
    for (const name of ["a", "b", "c"]) await client.call("task.create", { name, executor: "slow", at, timeout: "60s" });
    await waitFor(() => running === 3, 15_000, "three runs in their handlers");
    expect(await inflight()).toEqual({ slow: 3 });

    // Another node that holds 2 places at "slow" and 4 at "other": summed with this node's.
    const stopNew = ghost("g-new", { slow: 2, other: 4 });
    try {
      await waitFor(async () => (await inflight()).other === 4, 5_000, "the other node's heartbeat counted");
      expect(await inflight()).toEqual({ slow: 5, other: 4 });
    } finally { stopNew(); }

    // A node whose heartbeat does not say (an older version): the runs table is counted instead.
    const stopOld = ghost("g-old");
    try {
      await waitFor(async () => node.supervisor.liveMembers().some((m) => m.id === "g-old"), 5_000, "the older node is a member");
      await waitFor(async () => (await inflight()).other === undefined, 5_000, "g-new gone");
      expect(await inflight()).toEqual({ slow: 3 });
    } finally { stopOld(); }

    release();
    await waitFor(async () => (await inflight()).slow === undefined, 15_000, "the places given back");
  }, 60_000);
});
