// Micro-benchmark: batched, epoch-fenced transition writes (the Persister's path) and the hot task fetch.
// Prints one JSON line. Run: node --import tsx bench/store.ts [--rows 100000] [--batch 1000]
import { randomBytes } from "node:crypto";
import { loadConfig } from "../common/index.ts";
import { Store, type RunInsert, type TaskUpdate } from "../actors/store/index.ts";

const arg = (k: string, d: number) => { const i = process.argv.indexOf(k); return i > 0 ? Number(process.argv[i + 1]) : d; };
const rows = arg("--rows", 100_000);
const batch = arg("--batch", 1000);
const ns = `bench_store_${randomBytes(3).toString("hex")}`;
const cfg = loadConfig(process.env, { AX_NAMESPACE: ns });
const store = new Store({ pgUrl: cfg.pgUrl, schema: ns, poolSize: 4 });
try {
  await store.migrate();
  await store.initShardCount(1);
  await store.claimShard(0, "bench", 1, Date.now());
  await store.upsertExecutor("e", "nats", null, Date.now());
  // Tasks to update, inserted in bulk.
  await store.pool.query(`insert into tasks (name, executor, timeout_ms, max_attempts, backoff_ms, backoff_max_ms, misfire, overlap, shard, state, record, created_ms, updated_ms)
    select 't' || g, 'e', 30000, 1, 1000, 60000, 'once', 'forbid', 0, 'pending', '{}'::jsonb, 0, 0 from generate_series(1, $1) g`, [batch]);
  const ids = (await store.pool.query("select id from tasks order by id")).rows.map((r) => Number(r.id));
  const now = Date.now();
  let written = 0; let seq = 0;
  const t0 = performance.now(); const cpu0 = process.cpuUsage();
  while (written < rows) {
    const inserts: RunInsert[] = []; const updates: TaskUpdate[] = [];
    for (const id of ids) {
      const runId = `r${++seq}`;
      inserts.push({ id: runId, taskId: id, taskName: `t${id}`, triggerId: null, source: "once", dueMs: now, slotMs: now, dueReason: "bench", firedMs: now,
        node: "bench", shard: 0, epoch: 1, attempt: 1, executor: "e", state: "running", error: null, causedBy: null, upstreamRuns: null, createdMs: now });
      updates.push({ id, state: "running", record: { value: "running", context: { attempt: 1, inFlight: [runId] } }, triggerSlots: {}, nextDueMs: null, nextSlotMs: null, nextTriggerId: null, nextSource: null, nextReason: null, nextCausedBy: null });
    }
    const r = await store.writeBatch([{ shard: 0, epoch: 1, runInserts: inserts, runUpdates: inserts.map((x) => ({ id: x.id, state: "success" as const, finishedMs: now })), taskUpdates: updates }]);
    if (r.stale.length) throw new Error("unexpected stale epoch");
    written += inserts.length * 3;
  }
  const s = (performance.now() - t0) / 1000;
  const cpuW = process.cpuUsage(cpu0);
  const us = (c: NodeJS.CpuUsage, n: number) => +((c.user + c.system) / n).toFixed(2);
  // The hot fetch (fetchTasks): `rows` rows, `batch` ids a query, as a round asks for them; best
  // of three passes (the node's CPU per row varies with GC between passes on this shared box).
  let fetched = 0; let f = Infinity; let cpuF = { user: Infinity, system: 0 };
  for (let pass = 0; pass < arg("--passes", 3); pass++) {
    const cpu1 = process.cpuUsage(); const t1 = performance.now(); let n = 0;
    while (n < rows) n += (await store.fetchTasks(0, ids)).length;
    const c = process.cpuUsage(cpu1);
    if (c.user + c.system < cpuF.user + cpuF.system) { cpuF = c; f = (performance.now() - t1) / 1000; fetched = n; }
  }
  process.stdout.write(JSON.stringify({
    bench: "store", rowsWritten: written, batchRows: batch * 3, seconds: +s.toFixed(2), rowsPerSec: Math.round(written / s), transitionsPerSec: Math.round(written / 3 / s),
    nodeUsPerRowWritten: us(cpuW, written), rowsFetched: fetched, fetchRowsPerSec: Math.round(fetched / f), nodeUsPerRowFetched: us(cpuF, fetched),
  }) + "\n");
} finally {
  await store.dropNamespace();
  await store.close();
}
