import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Store } from "../../actors/index.ts";
import type { AxNode } from "../../ops/node.ts";
import { Executor, NonRetryableError } from "../../protocol/index.ts";
import { TestCluster } from "../cluster.ts";
import { waitFor } from "../helpers.ts";

/**
 * A poison event parks only itself. One executor runs six every-second tasks and a one-shot task
 * whose failure event PostgreSQL refuses (a trigger raises on its error text), all due on the
 * same whole seconds, so the poison shares event messages (the executor's 20 ms flush) and its
 * shard's rounds with its neighbours' completions. Parked whole, those completions were lost:
 * their runs stayed `running` and every later slot of their tasks was skipped (overlap) until
 * the runs timed out. The message is split once it failed on every delivery, and a shard that
 * restarted on a failure decides what comes back alone: only the poison is parked.
 */
/**
 * AX_DEAD_AFTER 1 makes any message handed back once exhausted on its next delivery: the
 * neighbours that failed beside the poison (and were handed back again whenever its shard
 * restarted while they waited behind it) reach their bound as soon as it does. They must still
 * be applied: a message is parked only once it failed in a round of its own.
 */
describe.each(["1", "2"])("a poison event among others (AX_DEAD_AFTER %s)", (deadAfter) => {
  const tc = new TestCluster(`deadnb${deadAfter}`, { AX_DEAD_AFTER: deadAfter, AX_SHARDS: "2" });
  let node: AxNode; let ex: Executor;
  const fires = new Map<string, number[]>();
  const ALIVE = 6;

  beforeAll(async () => {
    node = await tc.startNode("d1");
    await tc.waitForShards();
    ex = new Executor({ name: "dx", namespace: tc.ns, nats: tc.config.nats, concurrency: 64, eventFlushMs: 20, handler: (ctx) => {
      if (ctx.taskName === "poison") throw new NonRetryableError("POISON");
      const l = fires.get(ctx.taskName) ?? []; l.push(Date.now()); fires.set(ctx.taskName, l);
    } });
    await ex.start();
    await ex.registered;
    await tc.refuseRunsWithError("POISON");
    const client = await tc.client();
    // A 10 min timeout: a neighbour whose completion is lost stays `running` (its task skipping) for the whole test.
    for (let i = 0; i < ALIVE; i++) await client.call("task.create", { name: `alive${i}`, executor: "dx", cron: "* * * * * *", timeout: "10m" });
    await waitFor(() => fires.size === ALIVE, 15_000, "every task to fire");
  }, 60_000);
  afterAll(async () => { await ex?.stop(); await tc.teardown(); });

  it("is parked alone: its neighbours' completions are recorded and their tasks keep firing every second", async () => {
    const client = await tc.client();
    const at = new Date(Math.ceil((Date.now() + 1500) / 1000) * 1000);
    await client.call("task.create", { name: "poison", executor: "dx", at: at.toISOString(), retries: 0, timeout: "10m" });
    await waitFor(async () => (await node.metrics.deadLetters.get()).values.reduce((k, v) => k + v.value, 0) >= 1, 60_000, "the poison to be parked");
    const parkedAt = Date.now();
    // Every neighbour fires every second again within 30 s of the parking: a completion handed back
    // by a restarting shard is, rarely, delivered again only after its ack wait (10 s; README,
    // Limits), and its task skips until then; a lost one would keep its task skipping for 10 min.
    const firingAgain = () => {
      const from = Math.max(parkedAt, Date.now() - 5000);
      return [...Array(ALIVE).keys()].every((i) => fires.get(`alive${i}`)!.filter((t) => t > from).length >= 4);
    };
    await waitFor(firingAgain, 30_000, "every neighbour to fire 4 times in 5 s after the parking");
    const end = Date.now();

    const store = new Store({ pgUrl: tc.config.pgUrl, schema: tc.ns, poolSize: 1 });
    try {
      const stuck = await store.pool.query(`select task_name from runs where state = 'running' and due_ms < $1 order by due_ms`, [end - 5000]);
      expect(stuck.rows.map((r) => r.task_name as string)).toEqual(["poison"]);
    } finally { await store.close(); }
    const dead = JSON.parse((await tc.cli(["dead", "ls", "--json"])).stdout) as Array<{ cause: string; preview: string }>;
    expect(dead.filter((d) => d.cause === "deliveries").length).toBe(1);
    expect(dead[0]!.preview).toContain("\"failed\"");
  }, 120_000);
});
