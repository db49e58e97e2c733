import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { JetStreamClient } from "@nats-io/jetstream";
import { SystemClock, names, silentLogger } from "../../common/index.ts";
import { Persister, Store, type ShardDispatchRun, type ShardWrite } from "../../actors/index.ts";
import { testConfig, testNamespace } from "../helpers.ts";

/**
 * One shard's row that PostgreSQL refuses (here a trigger in the test's own schema raises on a
 * run id, as a constraint would) must fail that shard's round only: the node's round writes many
 * shards' rounds in one transaction, and before, every shard of the batch failed and restarted
 * with it. Against the real store: the other shards' parts are written and published, the
 * refused one is rejected and none of its runs go out, and nothing is retried that would be
 * refused again.
 */
const ns = testNamespace("isolate");
const cfg = testConfig(ns);
const store = new Store({ pgUrl: cfg.pgUrl, schema: ns, poolSize: 2 });
const NOW = Date.now();
const published: string[] = [];
let batches = 0;

function persister(): Persister {
  const js = { publish: async (_subject: string, data: Uint8Array) => {
    const body = JSON.parse(new TextDecoder().decode(data)) as { runs: Array<{ runId: string }> };
    published.push(...body.runs.map((r) => r.runId));
    return { seq: 1, duplicate: false, stream: "x" };
  } } as unknown as JetStreamClient;
  return new Persister({ store, log: silentLogger, js, names: names(ns), nodeId: "n1", clock: new SystemClock(), mayRelease: () => "yes", lanes: 1,
    holdsAhead: () => false, revoke: () => undefined });
}

function write(shard: number, runIds: string[]): ShardWrite {
  return {
    shard, epoch: 1, runUpdates: [], taskUpdates: [],
    runInserts: runIds.map((id) => ({ id, taskId: shard, taskName: `t${shard}`, triggerId: null, source: "once" as const, dueMs: NOW, slotMs: NOW, dueReason: "test", firedMs: NOW,
      node: "n1", shard, epoch: 1, attempt: 1, executor: "e", state: "running" as const, error: null, causedBy: null, upstreamRuns: null, createdMs: NOW })),
  };
}
function dispatch(shard: number, runIds: string[]): Map<string, ShardDispatchRun[]> {
  return new Map([["e", runIds.map((runId) => ({ runId, taskId: shard, taskName: `t${shard}`, attempt: 1, source: "once" as const, payload: null, scheduledAt: NOW, firedAt: NOW, timeoutMs: 30_000, shard }))]]);
}
async function runIds(): Promise<string[]> {
  return (await store.pool.query("select id from runs order by id")).rows.map((r) => String(r.id));
}

beforeAll(async () => {
  await store.migrate();
  await store.initShardCount(4);
  for (let s = 0; s < 4; s++) await store.claimShard(s, "n1", 1, NOW);
  await store.upsertExecutor("e", "nats", null, NOW);
  for (let s = 0; s < 4; s++) {
    await store.pool.query(`insert into tasks (id, name, executor, timeout_ms, max_attempts, backoff_ms, backoff_max_ms, misfire, overlap, shard, state, record, created_ms, updated_ms)
      values ($1::bigint, $2, 'e', 30000, 1, 1000, 60000, 'once', 'forbid', $3::int, 'pending', '{}'::jsonb, 0, 0)`, [s, `t${s}`, s]);
  }
  await store.pool.query(`create function "${ns}".poison() returns trigger language plpgsql as $$ begin if new.id like 'poison%' then raise exception 'poisoned row'; end if; return new; end $$`);
  await store.pool.query(`create trigger poison before insert or update on "${ns}".runs for each row execute function "${ns}".poison()`);
  const real = store.writeBatch.bind(store);
  store.writeBatch = async (writes, records) => { batches++; return real(writes, records); };
});
afterAll(async () => { await store.dropNamespace(); await store.close(); });

describe("persister: a part PostgreSQL refuses fails its shard alone", () => {
  it("the other shards of the batch are written and published; the refused shard's runs are not; nothing is retried", async () => {
    const p = persister();
    // Submitted in one turn: one batch (one lane), shards 1, 2 and 3.
    const a = p.submit(write(1, ["a1", "a2"]), dispatch(1, ["a1", "a2"]));
    const bad = p.submit(write(2, ["b1", "poison-b2"]), dispatch(2, ["b1", "poison-b2"]));
    const c = p.submit(write(3, ["c1"]), dispatch(3, ["c1"]));
    const [ra, rbad, rc] = await Promise.allSettled([a, bad, c]);
    expect(ra.status).toBe("fulfilled");
    expect(rc.status).toBe("fulfilled");
    expect(rbad.status).toBe("rejected");
    expect(String((rbad as PromiseRejectedResult).reason)).toMatch(/poisoned row/);
    await (ra as PromiseFulfilledResult<Awaited<typeof a>>).value.published;
    await (rc as PromiseFulfilledResult<Awaited<typeof c>>).value.published;
    expect((ra as PromiseFulfilledResult<Awaited<typeof a>>).value.stale).toBe(false);
    // Written: the good shards' runs, none of the refused shard's (its transaction rolled back whole).
    expect(await runIds()).toEqual(["a1", "a2", "c1"]);
    expect(published.sort()).toEqual(["a1", "a2", "c1"]);
    // The batch once, then each shard's part once: a refusal for the data is not retried.
    expect(batches).toBe(4);
    p.close();
  }, 20_000);
});
