import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { connectNats, names } from "../../common/index.ts";
import type { AxNode } from "../../ops/node.ts";
import { NonRetryableError } from "../../protocol/index.ts";
import { TestCluster } from "../cluster.ts";
import { sleep, waitFor } from "../helpers.ts";

/**
 * Issue 14, dead-letter parking. A poison message: an executor's failure event whose write
 * PostgreSQL refuses every time (a trigger in the test's own schema raises on that error text,
 * as a constraint would). Before parking, every delivery failed the node's whole write round
 * and restarted its shards, for ever (max_deliver is unlimited). With AX_DEAD_AFTER=2 it must
 * be parked after two failed deliveries — copied to the dead-letter stream with the reason and
 * its original subject, terminated — after which no shard restarts and an every-second task
 * fires at full rate. `ax dead ls` shows it; a malformed event batch is parked at once.
 */
const tc = new TestCluster("dead", { AX_DEAD_AFTER: "2" });
const n = names(tc.ns);
let node: AxNode; let nc: NatsConnection;
let fires = 0;

interface Dead { seq: number; consumer: string; cause: string; reason: string; subject: string; deliveries: number; originalSeq: number }
async function deadLs(): Promise<Dead[]> {
  const r = await tc.cli(["dead", "ls", "--json"]);
  if (r.code !== 0) throw new Error(`ax dead ls exited ${r.code}: ${r.stderr}`);
  return JSON.parse(r.stdout) as Dead[];
}
async function parked(cause: string): Promise<number> {
  return (await node.metrics.deadLetters.get()).values.filter((v) => String(v.labels.cause).endsWith(`/${cause}`)).reduce((k, v) => k + v.value, 0);
}

beforeAll(async () => {
  node = await tc.startNode("d1");
  await tc.waitForShards();
  const ok = await tc.startExecutor("dx", () => { fires++; });
  await ok.registered;
  const px = await tc.startExecutor("px", () => { throw new NonRetryableError("POISON"); });
  await px.registered;
  await tc.refuseRunsWithError("POISON");
  const client = await tc.client();
  await client.call("task.create", { name: "alive", executor: "dx", every: "1s" });
  nc = await connectNats(tc.config.nats);
  await waitFor(() => fires >= 2, 15_000, "alive fires");
}, 60_000);
afterAll(async () => { await nc?.close(); await tc.teardown(); });

describe("dead-letter parking", () => {
  it("a failure event whose write always fails is parked after AX_DEAD_AFTER deliveries; then no shard restarts and firing goes on", async () => {
    const client = await tc.client();
    const t0 = Date.now();
    await client.call("task.create", { name: "poison", executor: "px", delay: "1s", retries: 0 });
    await waitFor(async () => (await parked("deliveries")) >= 1, 45_000, "the poison event to be parked");
    console.log(`poison parked ${Date.now() - t0} ms after its task was created; shard restarts meanwhile: ${node.supervisor.stats.startFailures}`);
    expect(node.supervisor.stats.startFailures).toBeGreaterThanOrEqual(1); // it did restart shards before

    const [d] = (await deadLs()).filter((x) => x.cause === "deliveries");
    expect(d).toBeDefined();
    expect(["node-events", "shard-events"]).toContain(d!.consumer);
    expect(d!.subject.startsWith(`${tc.ns}.events.`)).toBe(true);
    // Failed twice (AX_DEAD_AFTER 2), then alone, and parked: on its third delivery, or later if a
    // restart of its shard handed it back while it waited (JetStream counts every hand-back).
    expect(d!.deliveries).toBeGreaterThanOrEqual(3);
    expect(d!.reason).toBe(`failed in a round of its own on delivery ${d!.deliveries}, after ${d!.deliveries - 1} failed deliveries`);
    expect(d!.originalSeq).toBeGreaterThan(0);

    // Terminated, not redelivered: no more restarts, and the every-second task fires at full rate.
    const restarts = node.supervisor.stats.startFailures;
    const from = fires;
    await sleep(6000);
    expect(node.supervisor.stats.startFailures).toBe(restarts);
    expect(fires - from).toBeGreaterThanOrEqual(5);
    expect(await parked("deliveries")).toBe(1);
  }, 90_000);

  it("a malformed event batch on a shard's subject is parked at once with its subject and the reason", async () => {
    nc.publish(n.eventsSubject(0), new TextEncoder().encode("{\"v\":1,\"shard\":\u0000"));
    await waitFor(async () => (await parked("malformed")) >= 1, 10_000, "the malformed batch to be parked");
    const [d] = (await deadLs()).filter((x) => x.cause === "malformed");
    expect(d).toMatchObject({ consumer: "shard-events", subject: n.eventsSubject(0), deliveries: 1 });
    expect(d!.reason).toMatch(/malformed event batch/);
  }, 30_000);

  it("ax dead --help teaches the command", async () => {
    const r = await tc.cli(["dead", "--help"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/ax dead ls/);
    expect(r.stdout).toMatch(/AX_DEAD_AFTER/);
  }, 30_000);
});
