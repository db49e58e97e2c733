import type pg from "pg";
import { storedRecord } from "./recordCodec.ts";
import { UPDATE_DEFINITIONS, definitionUpdatesJson } from "./definitionUpdate.ts";
import { LEDGER_UPSERT, ledgerJson } from "./ledgerStore.ts";
import { FENCE_CTE, okShard } from "./fence.ts";
import type { DispatchRecord, ShardWrite } from "./types.ts";

/**
 * The shard actors' only way to change tasks and runs: one pipelined transaction per batch of
 * shard writes, each fenced by its shard's epoch. Its connections (`pool`) allow only index
 * nested loops (see Store's constructor).
 */
export class FencedWriter {
  constructor(private readonly pool: pg.Pool) {}

  /**
   * Fenced batch write. Inputs: writes from one or many shards, each under the epoch its
   * actor believes current. Guarantee: in one transaction, each shard's `shards` row is locked
   * FOR SHARE and its epoch compared; writes of a shard whose epoch is not current change
   * nothing and the shard is returned in `stale`. Because `claimShard` needs the row lock, a
   * new owner's claim waits for this transaction, and after it no write of the old epoch lands.
   */
  async write(writes: ShardWrite[], dispatches: ReadonlyArray<DispatchRecord> = []): Promise<{ stale: number[] }> {
    if (!writes.length) return { stale: [] };
    // The fence's two arrays as PostgreSQL array literals, built once: given as JS arrays, pg
    // re-serialised them for each of the transaction's statements (4 % of the node's allocations).
    const shards = `{${writes.map((w) => w.shard).join(",")}}`; const epochs = `{${writes.map((w) => w.epoch).join(",")}}`;
    // One round trip: the statements are pipelined on one connection, so the writes cannot wait
    // for the fence's answer. Each write statement therefore repeats the fence as a filter
    // (`ok`): rows of a shard whose epoch is not current are not written. The first statement
    // has locked the current shards' rows FOR SHARE, so their epochs cannot change before
    // commit, and a stale epoch never becomes current again.
    const ins = runInsertsJson(writes); const upd = runUpdatesJson(writes); const tasks = taskUpdatesJson(writes); const defs = definitionUpdatesJson(writes);
    const c = await this.pool.connect();
    const jobs: Array<Promise<unknown>> = [];
    // Corked: the whole transaction leaves in one write (a syscall per statement cost more than
    // the statements at small batch sizes).
    const stream = (c as unknown as { connection?: { stream?: { cork?: () => void; uncork?: () => void } } }).connection?.stream;
    stream?.cork?.();
    try {
      jobs.push(c.query("begin"));
      const fence = c.query({ name: "ax_fence", text: `select s.shard from shards s join unnest($1::int[], $2::bigint[]) f(shard, epoch)
        on s.shard = f.shard and s.epoch = f.epoch for share of s`, values: [shards, epochs] });
      jobs.push(fence);
      if (ins) jobs.push(c.query({ name: "ax_insert_runs", text: INSERT_RUNS, values: [ins, shards, epochs] }));
      if (upd) jobs.push(c.query({ name: "ax_update_runs", text: UPDATE_RUNS, values: [upd, shards, epochs] }));
      if (defs) jobs.push(c.query({ name: "ax_update_definitions", text: UPDATE_DEFINITIONS, values: [defs, shards, epochs, Date.now()] }));
      if (tasks) jobs.push(c.query({ name: "ax_update_tasks", text: UPDATE_TASKS, values: [tasks, shards, epochs, Date.now()] }));
      const ledger = ledgerJson(writes);
      if (ledger) jobs.push(c.query({ name: "ax_ledger", text: LEDGER_UPSERT, values: [ledger, shards, epochs] }));
      // Not fenced: a message row names runs; only the runs that were written are ever re-published.
      if (dispatches.length) jobs.push(c.query({ name: "ax_insert_dispatches", text: INSERT_DISPATCHES, values: [JSON.stringify(dispatches)] }));
      jobs.push(c.query("commit"));
      stream?.uncork?.();
      const settled = await Promise.allSettled(jobs);
      const failed = settled.find((x): x is PromiseRejectedResult => x.status === "rejected");
      // After a failed statement the server ignores the rest and answers "commit" with a rollback.
      if (failed) throw failed.reason;
      const ok = new Set((await fence).rows.map((x) => x.shard as number));
      return { stale: writes.filter((w) => !ok.has(w.shard)).map((w) => w.shard) };
    } catch (e) {
      stream?.uncork?.();
      await c.query("rollback").catch(() => undefined);
      throw e;
    } finally { c.release(); }
  }
}



// Rows travel as one JSON array per statement (json_to_recordset): one native JSON.stringify
// instead of twenty escaped array parameters, and jsonb columns arrive as JSON values. Each row
// object is built once, straight from the shard's write, in the recordset's column order.

const INSERT_RUNS = `${FENCE_CTE}
  insert into runs (id, task_id, task_name, trigger_id, source, due_ms, slot_ms, due_reason, fired_ms, node, shard, epoch, attempt,
    executor, state, error, caused_by, upstream_runs, finished_ms, created_ms, dispatch_id)
  select u.id, u.task_id, u.task_name, u.trigger_id, u.source, u.due_ms, u.slot_ms, u.due_reason, u.fired_ms, u.node, u.shard, u.epoch,
    u.attempt, u.executor, u.state, u.error, u.caused_by, u.upstream_runs, u.finished_ms, u.created_ms, u.dispatch_id
  from json_to_recordset($1::json) as u(id text, task_id bigint, task_name text, trigger_id bigint, source text, due_ms bigint, slot_ms bigint,
    due_reason text, fired_ms bigint, node text, shard int, epoch bigint, attempt int, executor text, state text, error text, caused_by text,
    upstream_runs jsonb, finished_ms bigint, created_ms bigint, dispatch_id text)
  where ${okShard("u.shard")}
  on conflict (id) do nothing`;

function runInsertsJson(writes: ShardWrite[]): string | null {
  const data: unknown[] = [];
  for (const w of writes) {
    for (const r of w.runInserts) {
      data.push({
        id: r.id, task_id: r.taskId, task_name: r.taskName, trigger_id: r.triggerId, source: r.source, due_ms: r.dueMs, slot_ms: r.slotMs,
        due_reason: r.dueReason, fired_ms: r.firedMs, node: r.node, shard: r.shard, epoch: r.epoch, attempt: r.attempt, executor: r.executor,
        state: r.state, error: r.error, caused_by: r.causedBy, upstream_runs: r.upstreamRuns, finished_ms: r.finishedMs ?? null, created_ms: r.createdMs,
        dispatch_id: r.dispatchId ?? null,
      });
    }
  }
  return data.length ? JSON.stringify(data) : null;
}

const INSERT_DISPATCHES = `insert into dispatches (id, executor, node, run_ids, created_ms)
  select u.id, u.executor, u.node, array(select json_array_elements_text(u."runIds")), u."createdMs"
  from json_to_recordset($1::json) as u(id text, executor text, node text, "runIds" json, "createdMs" bigint)
  on conflict (id) do nothing`;

const UPDATE_RUNS = `${FENCE_CTE}
  update runs r set state = coalesce(u.state, r.state), started_ms = coalesce(r.started_ms, u.started_ms),
    finished_ms = coalesce(u.finished_ms, r.finished_ms), executor_instance = coalesce(u.instance, r.executor_instance),
    error = coalesce(u.error, r.error),
    -- A run that has its own outcome keeps it: a completion seen again (redelivered, or re-published
    -- after a NATS restart to a shard loaded afresh) is not a late one.
    late_outcome = case when r.state in ('success', 'failed') then r.late_outcome else coalesce(u.late, r.late_outcome) end,
    result = coalesce(u.result, r.result)
  from json_to_recordset($1::json) as u(id text, shard int, state text, started_ms bigint, finished_ms bigint, instance text, error text, late text, result jsonb)
  where r.id = u.id and r.shard = u.shard and ${okShard("u.shard")}`;

interface RunUpdateRow { id: string; shard: number; state: string | null; started_ms: number | null; finished_ms: number | null; instance: string | null; error: string | null; late: string | null; result?: unknown }

function runUpdatesJson(writes: ShardWrite[]): string | null {
  // Several updates of one run may arrive in one batch (a started event, then the end): folded
  // into one row, a later value winning over an earlier one.
  const folded = new Map<string, RunUpdateRow>();
  for (const w of writes) {
    for (const u of w.runUpdates) {
      const prev = folded.get(u.id);
      if (!prev) {
        folded.set(u.id, { id: u.id, shard: w.shard, state: u.state ?? null, started_ms: u.startedMs ?? null, finished_ms: u.finishedMs ?? null,
          instance: u.executorInstance ?? null, error: u.error ?? null, late: u.lateOutcome ?? null, ...(u.result !== undefined ? { result: u.result } : {}) });
        continue;
      }
      if (u.state !== undefined) prev.state = u.state;
      if (u.startedMs !== undefined) prev.started_ms = u.startedMs;
      if (u.finishedMs !== undefined) prev.finished_ms = u.finishedMs;
      if (u.executorInstance !== undefined) prev.instance = u.executorInstance;
      if (u.error !== undefined) prev.error = u.error;
      if (u.lateOutcome !== undefined) prev.late = u.lateOutcome;
      if (u.result !== undefined) prev.result = u.result;
    }
  }
  return folded.size ? JSON.stringify([...folded.values()]) : null;
}

const UPDATE_TASKS = `${FENCE_CTE}
  update tasks t set state = u.state, record = u.record, trigger_slots = u.slots, next_due_ms = u.due, next_slot_ms = u.slot,
    next_trigger_id = u.trig, next_source = u.source, next_reason = u.reason, next_caused_by = u.caused, updated_ms = $4
  from json_to_recordset($1::json) as u(id bigint, shard int, state text, record jsonb, slots jsonb, due bigint, slot bigint, trig bigint,
    source text, reason text, caused text)
  where t.id = u.id and ${okShard("u.shard")}`;

function taskUpdatesJson(writes: ShardWrite[]): string | null {
  // The last decision of a batch wins: the machine already folded the history.
  const folded = new Map<number, unknown>();
  for (const w of writes) {
    for (const u of w.taskUpdates) {
      folded.set(u.id, { id: u.id, shard: w.shard, state: u.state, record: storedRecord(u.record), slots: u.triggerSlots, due: u.nextDueMs, slot: u.nextSlotMs,
        trig: u.nextTriggerId, source: u.nextSource, reason: u.nextReason, caused: u.nextCausedBy });
    }
  }
  return folded.size ? JSON.stringify([...folded.values()]) : null;
}

/**
 * PostgreSQL refused the write for what it wrote (SQLSTATE classes 22 data exception, 23
 * integrity constraint, P0 raised by a trigger or function), not for the connection, the server's
 * state or a conflict with another transaction: writing it again gives the same answer.
 */
export function refusedForData(e: unknown): boolean {
  const code = (e as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^(22|23|P0)/.test(code);
}
