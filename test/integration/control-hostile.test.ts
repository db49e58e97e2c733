import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { connectNats, names } from "../../common/index.ts";
import type { AxNode } from "../../ops/node.ts";
import { TestCluster } from "../cluster.ts";
import { waitFor } from "../helpers.ts";

/**
 * Forged control messages (issue 14 item 3) against one real node firing an every-second
 * task: heartbeats of a node that never takes a lease (a ghost), hand-over hints for shards
 * that do not exist, floods of rebalance plans, `null` on a shard's command subject. The node
 * must keep (or take back) every shard and keep firing; each refusal is counted by cause.
 */
const tc = new TestCluster("ctlhostile");
let node: AxNode; let nc: NatsConnection;
let fires = 0;
const enc = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));
const n = names(tc.ns);

async function refused(cause: string): Promise<number> {
  const m = await node.metrics.refused.get();
  return m.values.find((v) => v.labels.cause === cause)?.value ?? 0;
}
async function firesGoOn(by = 3): Promise<void> {
  const from = fires;
  await waitFor(() => fires >= from + by, 15_000, `${by} more fires`);
}

beforeAll(async () => {
  node = await tc.startNode("real");
  await tc.waitForShards();
  const ex = await tc.startExecutor("cx", async () => { fires++; });
  await ex.registered;
  const client = await tc.client();
  await client.call("task.create", { name: "alive", executor: "cx", every: "1s" });
  nc = await connectNats(tc.config.nats);
  await firesGoOn(2);
});
afterAll(async () => { await nc?.close(); await tc.teardown(); });

describe("a ghost node (heartbeats, never a lease) is passed over", () => {
  it("attack: forged heartbeats of a fake node — the real node takes every shard back within the bound and keeps firing", async () => {
    const beat = () => nc.publish(n.heartbeatSubject, enc({ v: 1, id: "ghost", http: null, startedAt: Date.now(), shards: [], load: { firedPerSec: 0, inFlight: 0, lagMs: 0 }, stopping: false, ready: true }));
    const timer = setInterval(beat, 150);
    try {
      beat();
      // The ghost is seen as a member and the ring gives it shards: the real node lets them go.
      await waitFor(() => node.supervisor.liveMembers().some((m) => m.id === "ghost"), 5_000, "ghost is a member");
      await waitFor(() => node.ownedShards().length < tc.config.shardCount, 10_000, "real node hands shards to the ghost");
      // …and takes them all back once the ghost has not taken them within the bound.
      await waitFor(() => node.ownedShards().length === tc.config.shardCount, 4 * node.supervisor.ghostAfterMs, "real node owns every shard again");
      expect(node.supervisor.passedOver()).toEqual(["ghost"]);
      expect(node.supervisor.liveMembers().some((m) => m.id === "ghost")).toBe(true); // still beating: passed over, not dead
      expect(await refused("ghost-node")).toBe(1);
      await firesGoOn(3);
      expect(node.ownedShards().length).toBe(tc.config.shardCount);
    } finally { clearInterval(timer); }
  });
});

describe("hints, plans and commands are validated and bounded", () => {
  it("attack: hand-over hints for shard −1 and a shard beyond the count are refused; the node keeps reconciling and firing", async () => {
    const before = await refused("handover");
    nc.publish(`${n.heartbeatSubject}.handover`, enc({ v: 1, shard: -1, from: "x", to: "real" }));
    nc.publish(`${n.heartbeatSubject}.handover`, enc({ v: 1, shard: 100, from: "x", to: "real" }));
    nc.publish(`${n.heartbeatSubject}.handover`, enc({ v: 1, shard: 0, from: "x".repeat(2000), to: "real" }));
    await waitFor(async () => (await refused("handover")) === before + 3, 5_000, "3 hints refused");
    await firesGoOn(2);
    expect(node.ownedShards().length).toBe(tc.config.shardCount);
  });

  it("attack: 100 rebalance plans of ~1 MB, plans with bad shards, and more plans than kept — all refused; RSS stays bounded", async () => {
    const rss0 = process.memoryUsage().rss;
    const before = await refused("plan");
    const big = { v: 1, id: "", ttlMs: 600_000, moves: Array.from({ length: 24_000 }, (_, i) => ({ shard: i % 8, to: `nobody-${i}` })) };
    for (let i = 0; i < 100; i++) { big.id = `big-${i}`; nc.publish(`${n.heartbeatSubject}.plan`, enc(big)); }
    nc.publish(`${n.heartbeatSubject}.plan`, enc({ v: 1, id: "neg", ttlMs: 1000, moves: [{ shard: -1, to: "real" }] }));
    nc.publish(`${n.heartbeatSubject}.plan`, enc({ v: 1, id: "over", ttlMs: 1000, moves: [{ shard: 8, to: "real" }] }));
    nc.publish(`${n.heartbeatSubject}.plan`, enc({ v: 1, id: "twice", ttlMs: 1000, moves: [{ shard: 1, to: "a" }, { shard: 1, to: "b" }] }));
    // Well-formed small plans to a node that does not exist: 16 are kept (harmless), the rest refused.
    for (let i = 0; i < 40; i++) nc.publish(`${n.heartbeatSubject}.plan`, enc({ v: 1, id: `small-${i}`, ttlMs: 600_000, moves: [{ shard: i % 8, to: "nobody" }] }));
    await nc.flush();
    await waitFor(async () => (await refused("plan")) === before + 100 + 3 + 24, 30_000, "127 plans refused");
    await firesGoOn(3);
    expect(node.ownedShards().length).toBe(tc.config.shardCount);
    expect(process.memoryUsage().rss - rss0).toBeLessThan(300 * 1024 * 1024);
  });

  it("attack: `null` (and garbage) on every shard's command subject — refused, no shard restarts, still firing", async () => {
    const before = await refused("shard.cmd");
    const acquired = node.supervisor.stats.acquired;
    for (let s = 0; s < tc.config.shardCount; s++) {
      nc.publish(n.shardSubject(s, "cmd"), enc(null));
      nc.publish(n.shardSubject(s, "cmd"), new TextEncoder().encode("{not json"));
    }
    await waitFor(async () => (await refused("shard.cmd")) === before + 2 * tc.config.shardCount, 5_000, "commands refused");
    await firesGoOn(2);
    expect(node.supervisor.stats.acquired).toBe(acquired);
    expect(node.ownedShards().length).toBe(tc.config.shardCount);
  });
});
