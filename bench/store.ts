// Micro-benchmark: batched, epoch-fenced transition writes (the Persister's path) and the hot task fetch.
// Prints one JSON line. Run: node --import tsx bench/store.ts [--rows 100000] [--batch 1000]
import { randomBytes } from "node:crypto";
import { loadConfig } from "../common/index.ts";
import { Store, type RunInsert, type ShardWrite, type TaskUpdate } from "../actors/store/index.ts";
import { procCpuS } from "./proc.ts";

const arg = (k: string, d: number) => { const i = process.argv.indexOf(k); return i > 0 ? Number(process.argv[i + 1]) : d; };
const rows = arg("--rows", 100_000);
const batch = arg("--batch", 1000);
// Shards the batch's rows are spread over (64: the product default; each is one ShardWrite of the batch, fenced under its epoch).
const shardCount = arg("--shards", 64);
const ns = `bench_store_${randomBytes(3).toString("hex")}`;
const cfg = loadConfig(process.env, { AX_NAMESPACE: ns });
const store = new Store({ pgUrl: cfg.pgUrl, schema: ns, poolSize: 4 });
try {
  await store.migrate();
  await store.initShardCount(shardCount);
  for (let s = 0; s < shardCount; s++) await store.claimShard(s, "bench", 1, Date.now());
  await store.upsertExecutor("e", "nats", null, Date.now());
  // Tasks to update, inserted in bulk.
  await store.pool.query(`insert into tasks (name, executor, timeout_ms, max_attempts, backoff_ms, backoff_max_ms, misfire, overlap, shard, state, record, created_ms, updated_ms)
    select 't' || g, 'e', 30000, 1, 1000, 60000, 'once', 'forbid', g % $2, 'pending', '{}'::jsonb, 0, 0 from generate_series(1, $1) g`, [batch, shardCount]);
  const ids = (await store.pool.query("select id from tasks order by id")).rows.map((r) => Number(r.id));
  const shardOfId = new Map((await store.pool.query("select id, shard from tasks")).rows.map((r) => [Number(r.id), Number(r.shard)]));
  const now = Date.now();
  let written = 0; let seq = 0;
  // The PostgreSQL backends of this namespace (its pools): their own CPU, not the whole server's
  // (other work on a shared box runs on other backends).
  const backends = async () => (await store.pool.query("select pid from pg_stat_activity where application_name = $1", [`ax:${ns}`])).rows.map((r) => Number(r.pid));
  const pgSeen = new Map<number, number>();
  const pgCpuS = async () => { for (const pid of await backends()) { const c = procCpuS(pid); if (c !== null) pgSeen.set(pid, c); } return [...pgSeen.values()].reduce((a, b) => a + b, 0); };
  await store.writeBatch([{ shard: 0, epoch: 1, runInserts: [], runUpdates: [], taskUpdates: [{ id: ids[0]!, state: "pending", record: {}, triggerSlots: {}, nextDueMs: null, nextSlotMs: null, nextTriggerId: null, nextSource: null, nextReason: null, nextCausedBy: null }] }]); // opens the write connection
  const pg0 = await pgCpuS();
  const t0 = performance.now(); const cpu0 = process.cpuUsage();
  while (written < rows) {
    const inserts: RunInsert[] = []; const updates: TaskUpdate[] = [];
    for (const id of ids) {
      const runId = `r${++seq}`;
      inserts.push({ id: runId, taskId: id, taskName: `t${id}`, triggerId: null, source: "once", dueMs: now, slotMs: now, dueReason: "bench", firedMs: now,
        node: "bench", shard: shardOfId.get(id)!, epoch: 1, attempt: 1, executor: "e", state: "running", error: null, causedBy: null, upstreamRuns: null, createdMs: now, dispatchId: `d:${runId}` });
      updates.push({ id, state: "running", record: { a: 1, f: [runId], r: runId }, triggerSlots: { [String(id)]: now, [`w:${id}`]: now }, nextDueMs: null, nextSlotMs: null, nextTriggerId: null, nextSource: null, nextReason: null, nextCausedBy: null });
    }
    // One ShardWrite per shard, as the node's round submits them.
    const writes = new Map<number, ShardWrite>();
    const of = (shard: number) => { let w = writes.get(shard); if (!w) { w = { shard, epoch: 1, runInserts: [], runUpdates: [], taskUpdates: [] }; writes.set(shard, w); } return w; };
    for (const x of inserts) { of(x.shard).runInserts.push(x); of(x.shard).runUpdates.push({ id: x.id, state: "success", startedMs: now, finishedMs: now, executorInstance: "i1" }); }
    for (const u of updates) of(shardOfId.get(u.id)!).taskUpdates.push(u);
    const r = await store.writeBatch([...writes.values()]);
    if (r.stale.length) throw new Error("unexpected stale epoch");
    written += inserts.length * 3;
  }
  const s = (performance.now() - t0) / 1000;
  const cpuW = process.cpuUsage(cpu0);
  const pgW = await pgCpuS() - pg0;
  const us = (c: NodeJS.CpuUsage, n: number) => +((c.user + c.system) / n).toFixed(2);
  // The hot fetch (fetchTasks): `rows` rows, `batch` ids a query, as a round asks for them; best
  // of three passes (the node's CPU per row varies with GC between passes on this shared box).
  let fetched = 0; let f = Infinity; let cpuF = { user: Infinity, system: 0 };
  for (let pass = 0; pass < arg("--passes", 3); pass++) {
    const cpu1 = process.cpuUsage(); const t1 = performance.now(); let n = 0;
    while (n < rows) n += (await Promise.all([...new Set(shardOfId.values())].map((sh) => store.fetchTasks(sh, ids.filter((id) => shardOfId.get(id) === sh))))).reduce((a, x) => a + x.length, 0);
    const c = process.cpuUsage(cpu1);
    if (c.user + c.system < cpuF.user + cpuF.system) { cpuF = c; f = (performance.now() - t1) / 1000; fetched = n; }
  }
  process.stdout.write(JSON.stringify({
    bench: "store", rowsWritten: written, batchRows: batch * 3, seconds: +s.toFixed(2), rowsPerSec: Math.round(written / s), transitionsPerSec: Math.round(written / 3 / s),
    nodeUsPerRowWritten: us(cpuW, written), pgUsPerRowWritten: +((pgW * 1e6) / written).toFixed(2), rowsFetched: fetched, fetchRowsPerSec: Math.round(fetched / f), nodeUsPerRowFetched: us(cpuF, fetched),
  }) + "\n");
} finally {
  await store.dropNamespace();
  await store.close();
}
