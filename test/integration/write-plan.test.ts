import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Store, type ShardWrite } from "../../actors/index.ts";
import { testConfig, testNamespace } from "../helpers.ts";

/**
 * The fenced batch write's statements are prepared once per connection, and PostgreSQL keeps
 * the generic plan it settles on after a few executions. Made while `runs` is nearly empty (a new
 * namespace), that plan was a hash join on a sequential scan of runs, kept as the table grew: every
 * batch then read the whole table (at 835 runs/s, ~2,000 rows read per run written). Here: the
 * write's statements settle their plans on a near-empty table, the table grows by 20,000 rows,
 * and a run update must still not scan it.
 */
const ns = testNamespace("wplan");
const cfg = testConfig(ns);
const store = new Store({ pgUrl: cfg.pgUrl, schema: ns, poolSize: 2 });
const NOW = Date.now();

const insert = (ids: string[]): ShardWrite => ({
  shard: 0, epoch: 1, runUpdates: [], taskUpdates: [],
  runInserts: ids.map((id) => ({ id, taskId: 1, taskName: "t", triggerId: null, source: "once" as const, dueMs: NOW, slotMs: NOW, dueReason: "test", firedMs: NOW,
    node: "n1", shard: 0, epoch: 1, attempt: 1, executor: "e", state: "running" as const, error: null, causedBy: null, upstreamRuns: null, createdMs: NOW })),
});
const finish = (ids: string[]): ShardWrite => ({ shard: 0, epoch: 1, runInserts: [], taskUpdates: [], runUpdates: ids.map((id) => ({ id, state: "success" as const, startedMs: NOW, finishedMs: NOW })) });

/** Rows of runs read by sequential scans so far; call once the writing store is closed (a backend publishes its counters when it exits). */
async function runRowsScanned(reader: Store): Promise<number> {
  const r = await reader.pool.query("select seq_tup_read from pg_stat_user_tables where schemaname = $1 and relname = 'runs'", [ns]);
  return Number(r.rows[0].seq_tup_read);
}

beforeAll(async () => {
  await store.migrate();
  await store.initShardCount(1);
  await store.claimShard(0, "n1", 1, NOW);
});
const reader = new Store({ pgUrl: cfg.pgUrl, schema: ns, poolSize: 1 });
afterAll(async () => { await reader.dropNamespace(); await reader.close(); });

describe("fenced write plans", () => {
  it("a run update reads runs by its key, however small runs was when the statement was prepared", async () => {
    // Both write connections settle their plans while runs holds a handful of rows.
    for (let i = 0; i < 12; i++) {
      await Promise.all([0, 1].map(async (lane) => {
        const id = `small-${i}-${lane}`;
        await store.writeBatch([insert([id])]);
        await store.writeBatch([finish([id])]);
      }));
    }
    await store.pool.query(`insert into runs (id, task_id, task_name, source, due_ms, shard, epoch, attempt, executor, state, created_ms)
      select 'big-' || g, 1, 't', 'once', $1, 0, 1, 1, 'e', 'running', $1 from generate_series(1, 20000) g`, [NOW]);
    for (let i = 0; i < 6; i++) await Promise.all([0, 1].map((lane) => store.writeBatch([finish([`big-${i * 2 + lane + 1}`])])));
    await store.close();
    // The small phase can have read at most a few hundred rows; one scan of the grown table reads 20,000.
    expect(await runRowsScanned(reader)).toBeLessThan(2000);
    const done = await reader.pool.query("select count(*)::int as n from runs where id like 'big-%' and state = 'success'");
    expect(done.rows[0].n).toBe(12);
  });
});
