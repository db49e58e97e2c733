import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { IDLE_IN_TRANSACTION_MS, Store } from "../../actors/store/index.ts";
import { parseTaskSpec } from "../../ops/api.ts";
import { CuttableProxy } from "../faults/rig.ts";
import { sleep, testConfig, testNamespace, runningRun } from "../helpers.ts";

// A node cut off from PostgreSQL in the middle of a fenced write: its backend holds the shard's
// row FOR SHARE (the fence) and waits for the rest of the transaction. The shard's next owner
// must not wait for the partition to heal before it can claim the shard.
const ns = testNamespace("pgcut");
const cfg = testConfig(ns);
const direct = new Store({ pgUrl: cfg.pgUrl, schema: ns });
let proxy: CuttableProxy;
let cutOff: Store;

const run = (id: string, taskId: number, shard: number, epoch: number) => runningRun(id, taskId, shard, epoch);

beforeAll(async () => {
  await direct.migrate();
  await direct.initShardCount(1);
  await direct.upsertExecutor("ex", "nats", null, 1000);
  await direct.claimShard(0, "n1", 5, 1);
  const url = new URL(cfg.pgUrl);
  proxy = await CuttableProxy.start(Number(url.port || 5432));
  url.host = `127.0.0.1:${proxy.port}`;
  cutOff = new Store({ pgUrl: url.toString(), schema: ns });
});

afterAll(async () => {
  await proxy?.close();
  await cutOff?.close().catch(() => undefined);
  await direct.dropNamespace();
  await direct.close();
});

describe("a node cut off from PostgreSQL mid-transaction", () => {
  it("does not hold the shard's row: the next owner claims it long before the partition heals, and the cut write never lands", async () => {
    const [task] = await direct.createTasksBulk([{ ...parseTaskSpec({ name: "t", executor: "ex", at: new Date(Date.UTC(2030, 0, 1)).toISOString() }, Date.UTC(2029, 0, 1)).task, upstreams: [] }], () => 0);
    // A first write through the proxy prepares the statements on its connection (as a node's do).
    expect(await cutOff.writeBatch([{ shard: 0, epoch: 5, runInserts: [run("before", task!.id, 0, 5)], runUpdates: [], taskUpdates: [] }])).toEqual({ stale: [] });
    // The next write is cut halfway: the server has its begin and fence, not its commit.
    proxy.cutPartway(0.5);
    const cutWrite = cutOff.writeBatch([{ shard: 0, epoch: 5, runInserts: [run("cut", task!.id, 0, 5), run("cut2", task!.id, 0, 5)], runUpdates: [], taskUpdates: [] }]);
    cutWrite.catch(() => undefined);
    await sleep(300); // the partial transaction is in the server
    const startedAt = Date.now();
    const claim = direct.claimShard(0, "n2", 6, 2).then((ok) => ({ ok, afterMs: Date.now() - startedAt }));
    const outcome = await Promise.race([claim, sleep(IDLE_IN_TRANSACTION_MS + 10_000).then(() => "still blocked" as const)]);
    expect(outcome).not.toBe("still blocked");
    expect(outcome).toMatchObject({ ok: true });
    expect((await direct.listShards())[0]).toMatchObject({ owner: "n2", epoch: 6 });
    expect((await direct.listRuns(task!.id, 10)).map((r) => r.id).sort()).toEqual(["before"]);
    proxy.heal();
    await expect(cutWrite).rejects.toBeDefined();
  }, 60_000);
});
