import type pg from "pg";
import { InvalidInputError } from "../../common/index.ts";
import { storedRecord } from "./recordCodec.ts";
import { CopyText, copyIn, cp, reserveIds } from "./copyText.ts";
import type { DependencyGraph } from "./graph.ts";
import type { BulkCreated, BulkNewTask, NewTask, TaskRow, TriggerRow } from "./types.ts";

/** The statistics target of the ANALYZE that follows a bulk load (see analyzeCoarse). */
const ANALYZE_STATISTICS_TARGET = 10;

/**
 * Registering tasks (ax task create, apply, bulk create): the task rows, their triggers and
 * their upstream edges, written in one transaction each call.
 */
export class TaskRegistration {
  constructor(private readonly pool: pg.Pool, private readonly schema: string, private readonly graph: DependencyGraph,
    private readonly getTask: (name: string) => Promise<TaskRow | null>,
    private readonly transaction: <T>(fn: (c: pg.PoolClient) => Promise<T>) => Promise<T>) {}

  async create(t: NewTask): Promise<TaskRow> {
    const c = await this.pool.connect();
    try {
      await c.query("begin");
      const ex = await c.query("select 1 from executors where name = $1", [t.executor]);
      if (!ex.rowCount) throw new InvalidInputError("executor", t.executor, "unknown executor (start it first, or see `ax status` for the known ones)", "AX_E_NOT_FOUND");
      if (t.upstreams.length) await this.graph.lock(c);
      const id = Number((await c.query("select nextval(pg_get_serial_sequence('tasks', 'id')) as id")).rows[0].id);
      const shard = t.shardOf(id);
      try {
        await c.query(
          `insert into tasks (name, executor, payload, timeout_ms, max_attempts, backoff_ms, backoff_max_ms, misfire, overlap,
             shard, state, record, next_due_ms, next_slot_ms, next_source, next_reason, created_ms, updated_ms, id, apply_set)
           values ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$17,$18,$19)`,
          [t.name, t.executor, JSON.stringify(t.payload ?? null), t.timeoutMs, t.maxAttempts, t.backoffMs, t.backoffMaxMs, t.misfire,
            t.overlap, shard, t.state, JSON.stringify(storedRecord(t.record)), t.nextDueMs, t.nextSlotMs, t.nextSource, t.nextReason, t.nowMs, id, t.applySet ?? null]);
      } catch (e) {
        if ((e as { code?: string }).code === "23505") throw new InvalidInputError("name", t.name, "a task with this name already exists", "AX_E_CONFLICT");
        throw e;
      }
      let firstTrigger: number | null = null;
      const set: string[] = [];
      for (const tr of t.triggers) {
        const spec = JSON.stringify(tr.spec);
        const r = await c.query("insert into triggers (kind, spec, created_ms) values ($1, $2, $3) returning id", [tr.kind, spec, t.nowMs]);
        const trId = r.rows[0].id as number;
        firstTrigger ??= trId;
        set.push(triggerSetEntry(trId, tr.kind, spec));
        await c.query("insert into task_triggers (task_id, trigger_id) values ($1, $2)", [id, trId]);
      }
      if (set.length) await c.query("update tasks set next_trigger_id = $2, trigger_set = $3 where id = $1", [id, firstTrigger, `[${set.join(",")}]`]);
      for (const up of t.upstreams) await this.graph.insertEdge(c, id, up, t.nowMs);
      await c.query("commit");
    } catch (e) {
      await c.query("rollback").catch(() => undefined);
      throw e;
    } finally { c.release(); }
    const row = await this.getTask(t.name);
    return row!;
  }

  /**
   * Bulk registration: many tasks in one transaction, written with COPY (tasks, triggers,
   * task_triggers) and one unnest insert for dependency edges. Ids (tasks and triggers) are
   * drawn from the sequences up front, so each task's shard (`shardOf(id)`) and first trigger
   * are known before anything is written. All or nothing: an unknown executor or a name that
   * already exists refuses the whole batch, naming the field and value.
   *
   * Upstreams must be existing tasks (the caller resolves them): a new task only gains
   * in-edges, so no edge added here can close a cycle and no cycle check is needed.
   */
  async bulk(tasks: ReadonlyArray<BulkNewTask>, shardOf: (id: number) => number): Promise<BulkCreated[]> {
    if (!tasks.length) return [];
    const seen = new Set<string>();
    for (const t of tasks) {
      if (seen.has(t.name)) throw new InvalidInputError("name", t.name, "appears twice in the batch", "AX_E_CONFLICT");
      seen.add(t.name);
    }
    const c = await this.pool.connect();
    const out: BulkCreated[] = new Array(tasks.length);
    let analyze = false;
    try {
      const nTriggers = tasks.reduce((n, t) => n + t.triggers.length, 0);
      // Ids (sequences are not transactional) and the COPY text come first, outside the
      // transaction: the transaction then waits on nothing but PostgreSQL (a transaction idle
      // on its client is ended by the server, see IDLE_IN_TRANSACTION_MS).
      const ids = await reserveIds(c, this.schema, "tasks", tasks.length);
      const trIds = nTriggers ? await reserveIds(c, this.schema, "triggers", nTriggers) : [];
      const T = new CopyText(); const TR = new CopyText(); const TT = new CopyText();
      const recordJson = new Map<unknown, string>(); // records are shared per (maxAttempts, overlap): stringify once
      const edges: { d: number[]; u: number[] } = { d: [], u: [] };
      let k = 0;
      for (let i = 0; i < tasks.length; i++) {
        const t = tasks[i]!;
        const id = ids[i]!;
        const shard = shardOf(id);
        let firstTrigger: number | null = null;
        const set: string[] = [];
        for (const tr of t.triggers) {
          const trId = trIds[k++]!;
          firstTrigger ??= trId;
          const spec = JSON.stringify(tr.spec);
          TR.line(`${trId}\t${cp(tr.kind)}\t${cp(spec)}\tt\t${t.nowMs}`);
          TT.line(`${id}\t${trId}`);
          set.push(triggerSetEntry(trId, tr.kind, spec));
        }
        let rec = recordJson.get(t.record);
        if (rec === undefined) { rec = cp(JSON.stringify(storedRecord(t.record))); recordJson.set(t.record, rec); }
        const payload = t.payload === null || t.payload === undefined ? "null" : cp(JSON.stringify(t.payload));
        T.line(`${id}\t${cp(t.name)}\t${cp(t.executor)}\t${payload}\t${t.timeoutMs}\t${t.maxAttempts}\t${t.backoffMs}\t${t.backoffMaxMs}\t${cp(t.misfire)}\t${
          cp(t.overlap)}\t${shard}\t${cp(t.state)}\t${rec}\t{}\t${cp(t.nextDueMs)}\t${cp(t.nextSlotMs)}\t${cp(firstTrigger)}\t${cp(t.nextSource)}\t${
          cp(t.nextReason)}\t\\N\t${t.nowMs}\t${t.nowMs}\t${cp(`[${set.join(",")}]`)}\t${t.upstreams.length ? 1 : 0}`);
        for (const up of t.upstreams) { edges.d.push(id); edges.u.push(up); }
        out[i] = { id, name: t.name, shard, nextDueMs: t.nextDueMs };
      }
      await c.query("begin");
      const executors = [...new Set(tasks.map((t) => t.executor))];
      // FOR KEY SHARE: what the foreign key check on tasks.executor would take, for the whole batch at once.
      const known = new Set((await c.query("select name from executors where name = any($1::text[]) for key share", [executors])).rows.map((x) => x.name as string));
      for (const e of executors) if (!known.has(e)) throw new InvalidInputError("executor", e, "unknown executor (start it first, or see `ax status` for the known ones)", "AX_E_NOT_FOUND");
      // The per-row foreign-key checks (executor, and both ends of each task_triggers link) are
      // half of PostgreSQL's cost here and prove nothing new: the executors are locked above as
      // the check would lock them, and the tasks and triggers linked are the ones this very
      // transaction writes. A role allowed to (superuser) skips them for this transaction only,
      // as pg_restore --disable-triggers does; other roles keep them.
      if (await this.canSkipForeignKeyChecks(c)) await c.query("set local session_replication_role = replica");
      const st = (await c.query(`select c.reltuples, coalesce(s.n_mod_since_analyze, 0) as mods from pg_class c
        left join pg_stat_user_tables s on s.relid = c.oid where c.oid = 'tasks'::regclass`)).rows[0] as { reltuples: number; mods: number } | undefined;
      analyze = !st || st.reltuples < 0 || Number(st.mods) + tasks.length > st.reltuples;
      // triggers first, then tasks, then the links (foreign keys are checked per row).
      if (nTriggers) await copyIn(c, "copy triggers (id, kind, spec, enabled, created_ms) from stdin", TR.chunks());
      try {
        await copyIn(c, `copy tasks (id, name, executor, payload, timeout_ms, max_attempts, backoff_ms, backoff_max_ms, misfire, overlap,
          shard, state, record, trigger_slots, next_due_ms, next_slot_ms, next_trigger_id, next_source, next_reason, next_caused_by,
          created_ms, updated_ms, trigger_set, dep_flags) from stdin`, T.chunks());
      } catch (e) {
        const err = e as { code?: string; detail?: string };
        if (err.code === "23505") {
          const m = /\(name\)=\((.*)\) already exists/.exec(err.detail ?? "");
          throw new InvalidInputError("name", m?.[1] ?? null, "a task with this name already exists", "AX_E_CONFLICT");
        }
        throw e;
      }
      if (nTriggers) await copyIn(c, "copy task_triggers (task_id, trigger_id) from stdin", TT.chunks());
      if (edges.d.length) {
        await this.graph.lock(c);
        await c.query(
          `insert into dependencies (downstream, upstream, created_ms) select d, u, $3 from unnest($1::bigint[], $2::bigint[]) x(d, u)
           on conflict do nothing`, [edges.d, edges.u, tasks[0]!.nowMs]);
        await c.query("update tasks set dep_flags = dep_flags | 2 where id = any($1::bigint[]) and dep_flags & 2 = 0", [[...new Set(edges.u)]]);
      }
      await c.query("commit");
      // A table that doubled since its statistics were taken (or never had any) gets them soon:
      // without, the planner guesses hundreds of triggers per task and the shard actors' task
      // fetches turn into sequential scans. Doubling bounds this to a few ANALYZE runs however
      // many tasks are loaded; it runs beside the callers (one at a time), not in their path.
      if (analyze) this.analyzeSoon();
    } catch (e) {
      await c.query("rollback").catch(() => undefined);
      throw e;
    } finally { c.release(); }
    return out;
  }

  private analyzing: Promise<void> | null = null;
  private analyzeAgain = false;
  /** ANALYZE of the task tables in the background; calls while one runs fold into one more run. */
  private analyzeSoon(): void {
    if (this.analyzing) { this.analyzeAgain = true; return; }
    this.analyzing = this.analyzeCoarse().then(() => undefined, () => undefined).finally(() => {
      this.analyzing = null;
      if (this.analyzeAgain) { this.analyzeAgain = false; this.analyzeSoon(); }
    });
  }

  /**
   * What the planner needs after a bulk load is the tables' sizes and a rough shape, not fine
   * histograms: a sample of 3,000 rows (statistics target 10) instead of 30,000. At the default
   * target one ANALYZE of a 300k-task table took about 0.5 s of PostgreSQL's CPU, mostly sorting
   * the JSON columns, and a bulk load's doublings ran it three or four times beside the COPYs it
   * was meant to help; at 10 it takes about 35 ms. Where autovacuum runs, its own ANALYZE, at the
   * server's target, replaces these statistics once enough rows change.
   */
  private async analyzeCoarse(): Promise<void> {
    await this.transaction(async (c) => {
      await c.query(`set local default_statistics_target = ${ANALYZE_STATISTICS_TARGET}`);
      await c.query("analyze tasks; analyze triggers; analyze task_triggers");
    });
  }
  /** Resolves when no background ANALYZE is running (tests, close). */
  async settled(): Promise<void> { while (this.analyzing) await this.analyzing; }

  private skipFk: boolean | null = null;
  private async canSkipForeignKeyChecks(c: pg.PoolClient): Promise<boolean> {
    if (this.skipFk === null) {
      const r = await c.query("select current_setting('is_superuser') = 'on' as su");
      this.skipFk = r.rows[0].su === true && process.env.AX_BULK_FK_CHECKS !== "1";
    }
    return this.skipFk;
  }
}

/**
 * One element of `tasks.trigger_set` (migration 5), in the shape the fetch returns as a TriggerRow.
 * `specJson` is the spec already serialized for the triggers row; kind is one of four fixed words.
 */
function triggerSetEntry(id: number, kind: TriggerRow["kind"], specJson: string): string {
  return `{"id":${id},"kind":"${kind}","spec":${specJson},"enabled":true}`;
}
