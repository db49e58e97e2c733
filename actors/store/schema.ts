import type { Pool, PoolClient } from "pg";
import { LEDGER_MIGRATION_SQL } from "./ledgerStore.ts";

/**
 * Versioned migrations for one namespace's schema. Applied under a transaction-scoped advisory
 * lock keyed by the schema name, so two nodes starting at once serialize: the second waits,
 * then sees the versions already recorded and applies nothing.
 *
 * Times are epoch milliseconds in bigint columns (`..._ms`): the engine computes in ms and
 * batches thousands of rows through unnest(); conversion to timestamptz is left to readers.
 */
const MIGRATIONS: Array<{ version: number; name: string; sql: string }> = [
  {
    version: 1,
    name: "core model",
    sql: `
create table meta (key text primary key, value jsonb not null);

create table executors (
  name text primary key,
  kind text not null default 'nats' check (kind in ('nats','http')),
  max_in_flight int not null default 5000 check (max_in_flight > 0),
  created_ms bigint not null,
  last_seen_ms bigint
);

create table tasks (
  id bigserial primary key,
  name text not null unique,
  executor text not null references executors(name),
  payload jsonb,
  timeout_ms int not null check (timeout_ms > 0),
  max_attempts int not null check (max_attempts >= 1),
  backoff_ms int not null check (backoff_ms >= 0),
  backoff_max_ms int not null check (backoff_max_ms >= 0),
  misfire text not null check (misfire in ('once','skip','all')),
  overlap text not null check (overlap in ('forbid','allow')),
  shard int not null,
  state text not null,
  record jsonb not null,
  trigger_slots jsonb not null default '{}'::jsonb,
  next_due_ms bigint,
  next_slot_ms bigint,
  next_trigger_id bigint,
  next_source text,
  next_reason text,
  next_caused_by text,
  created_ms bigint not null,
  updated_ms bigint not null
);
-- Rebuilding a shard's due index reads exactly this.
create index tasks_shard_due on tasks (shard, next_due_ms) where next_due_ms is not null;
create index tasks_shard on tasks (shard);

create table triggers (
  id bigserial primary key,
  kind text not null check (kind in ('cron','fixed_rate','fixed_delay','once')),
  spec jsonb not null,
  enabled boolean not null default true,
  created_ms bigint not null
);

create table task_triggers (
  task_id bigint not null references tasks(id) on delete cascade,
  trigger_id bigint not null references triggers(id) on delete cascade,
  primary key (task_id, trigger_id)
);
create index task_triggers_trigger on task_triggers (trigger_id);

create table dependencies (
  downstream bigint not null references tasks(id) on delete cascade,
  upstream bigint not null references tasks(id) on delete cascade,
  created_ms bigint not null,
  -- The upstream's latest success not yet consumed by a downstream run (DependencyActor).
  satisfied_run text,
  satisfied_ms bigint,
  primary key (downstream, upstream),
  check (downstream <> upstream)
);
create index dependencies_upstream on dependencies (upstream);

-- One row per attempt: the lineage record ax why reads back.
create table runs (
  id text primary key,
  task_id bigint not null,
  task_name text not null,
  trigger_id bigint,
  source text not null check (source in ('cron','rate','delay','once','manual','dependency','retry','misfire')),
  due_ms bigint not null,
  slot_ms bigint,
  due_reason text,
  fired_ms bigint,
  node text,
  shard int not null,
  epoch bigint not null,
  attempt int not null,
  executor text not null,
  executor_instance text,
  started_ms bigint,
  finished_ms bigint,
  state text not null check (state in ('running','success','failed','timed_out','refused','skipped')),
  error text,
  caused_by text,
  upstream_runs jsonb,
  late_outcome text,
  created_ms bigint not null
);
create index runs_task_created on runs (task_id, created_ms desc);
create index runs_created on runs (created_ms);
create index runs_running on runs (shard) where state = 'running';

create table shards (
  shard int primary key,
  owner text,
  epoch bigint not null default 0,
  pinned_to text,
  updated_ms bigint not null default 0
);
`,
  },
  {
    version: 2,
    name: "dependency edge bookkeeping",
    // DependencyActor: the last upstream outcome applied to the edge (a redelivered or older
    // outcome is recognised and skipped), and the due trigger published for the downstream and
    // not yet turned into a run (at most one is outstanding, later successes coalesce).
    sql: `
alter table dependencies add column seen_run text, add column seen_ms bigint, add column trigger_key text, add column trigger_ms bigint;
`,
  },
  {
    version: 3,
    name: "dispatch id on runs",
    // The JetStream message id of the dispatch carrying the run: a new owner re-publishes runs
    // recorded but perhaps never published under the same id, and JetStream drops the copy
    // when the first publish did land.
    sql: `alter table runs add column dispatch_id text;`,
  },
  {
    version: 4,
    name: "hot status updates",
    // Every run changes its task row twice and its run row once or twice. Those updates were
    // never HOT: tasks.next_due_ms was indexed and runs.state was the predicate of a partial
    // index, so each one wrote 3-4 index entries (half of PostgreSQL's cost per run, see
    // docs/BENCHMARKS.md). Without those two indexes, and with room left on each page, a status
    // update rewrites only the heap tuple. Their readers are cold paths: a shard's due index is
    // rebuilt from the shard's tasks (tasks_shard), and the running runs of a shard are found
    // through the tasks' in-flight lists (written in the same fenced transaction as the runs).
    sql: `
drop index if exists tasks_shard_due;
drop index if exists runs_running;
alter table tasks set (fillfactor = 70);
alter table runs set (fillfactor = 60);
`,
  },
  {
    version: 5,
    name: "trigger set on the task row",
    // The shard actors fetch a task's row at every fire. Its triggers came through task_triggers
    // and triggers with a json_agg per row: 14 of the fetch's 29 µs of PostgreSQL CPU. A task's
    // triggers are fixed when it is created and trigger rows are never updated, so a copy on the
    // task row, written in the same transaction as the links, is always the same set. (An API
    // that changes a task's triggers must rewrite this copy in its transaction.)
    sql: `
alter table tasks add column trigger_set jsonb not null default '[]'::jsonb;
update tasks t set trigger_set = coalesce((select jsonb_agg(jsonb_build_object('id', tr.id, 'kind', tr.kind, 'spec', tr.spec, 'enabled', tr.enabled) order by tr.id)
  from task_triggers tt join triggers tr on tr.id = tt.trigger_id where tt.task_id = t.id), '[]'::jsonb);
`,
  },
  {
    version: 6,
    name: "dependency flags on the task row",
    // The shard actors' fetch looked up every task's upstreams and downstreams (4.6 µs of
    // PostgreSQL CPU a row) although most tasks have neither. Bit 1: has upstreams, bit 2: has
    // downstreams. Every edge insert sets them in its transaction; a removal recomputes them under
    // the graph lock. A bit left set after a task is deleted only costs the lookup it guards.
    sql: `
alter table tasks add column dep_flags smallint not null default 0;
update tasks t set dep_flags = (case when exists (select 1 from dependencies d where d.downstream = t.id) then 1 else 0 end)
  | (case when exists (select 1 from dependencies d where d.upstream = t.id) then 2 else 0 end)
  where exists (select 1 from dependencies d where d.downstream = t.id or d.upstream = t.id);
`,
  },
  {
    version: 7,
    name: "run history: room for the completion update, a BRIN index for pruning",
    // A run row is inserted at fire and updated once at completion. With fillfactor 60 a third
    // of those updates found no room on the row's page and were not HOT (68 % HOT measured), so
    // each wrote an entry into all three indexes of runs. runs_created only serves the pruning
    // (created_ms < cutoff, in batches); created_ms follows insertion order, so a BRIN index
    // answers it at nearly no cost per insert.
    sql: `
alter table runs set (fillfactor = 50);
drop index if exists runs_created;
create index if not exists runs_created_brin on runs using brin (created_ms) with (autosummarize = on);
`,
  },
  {
    version: 8,
    name: "machine record stored compactly",
    // Every run rewrites its task row twice. The record repeated the row's state, overlap and
    // max_attempts and spelled out every default under long keys (≈ 190 of a one-shot's 536
    // bytes). It now keeps only the rest (see actors/store/recordCodec.ts): a = attempt,
    // f = in-flight run ids, r = last run id, e = last error, p = paused after the run.
    sql: `
update tasks set record = jsonb_strip_nulls(jsonb_build_object(
    'a', nullif((record->'context'->>'attempt')::int, 0),
    'f', case when coalesce(record->'context'->'inFlight', '[]'::jsonb) = '[]'::jsonb then null else record->'context'->'inFlight' end,
    'r', record->'context'->'lastRunId',
    'e', record->'context'->'lastError',
    'p', case when (record->'context'->>'pausedAfterRun')::boolean then 1 end))
  where record ? 'context';
`,
  },
  {
    version: 9,
    name: "task pages keep room for a round's updates",
    // Tasks created together share pages and tend to fire together: one round updates most rows
    // of a page at once, and each update needs room on the page for the new version to be HOT.
    sql: `alter table tasks set (fillfactor = 50);`,
  },
  {
    version: 10,
    name: "node-level dispatch messages",
    // A dispatch message carries runs of many shards (one message per executor per node round).
    // The message's run list is kept for its de-duplication window, so whichever node takes over
    // one of those shards can publish the same message again, complete, under the same id
    // (JetStream drops it when the first publish landed). One row per message, not per run.
    sql: `
create table dispatches (
  id text primary key,
  executor text not null,
  node text not null,
  run_ids text[] not null,
  created_ms bigint not null
);
create index dispatches_created on dispatches (created_ms);
`,
  },
  {
    version: 11,
    name: "tasks edited in place: generation, apply set, history",
    // `ax task update` changes a task's definition in place (the owning shard writes it, fenced,
    // between fires): `generation` counts those changes. `apply_set` names the `ax apply` set
    // that owns the task (null: made by hand; --prune only ever removes tasks of its own set).
    // task_history keeps one row per change (what changed, from what to what, who, and the
    // task's last run before it, so ax why can name the change for the first run after it).
    sql: `
alter table tasks add column generation int not null default 0, add column apply_set text;
create index tasks_apply_set on tasks (apply_set) where apply_set is not null;
create table task_history (
  id bigserial primary key,
  task_id bigint not null,
  task_name text not null,
  generation int not null,
  at_ms bigint not null,
  who text not null,
  kind text not null,
  change jsonb not null,
  prev_run text
);
create index task_history_task on task_history (task_id, id);
`,
  },
  {
    version: 12,
    name: "calendars of excluded dates; backfill runs",
    // Calendars are read by the shards when a task that names one comes due (a change applies
    // to the slots decided after it). Backfill runs are found by (task, slot): a slot is not
    // backfilled twice. The source check is replaced NOT VALID: existing rows are not rescanned
    // (every one of them satisfies the narrower old check).
    sql: `
create table calendars (
  name text primary key,
  tz text,
  dates jsonb not null,
  created_ms bigint not null,
  updated_ms bigint not null
);
alter table runs drop constraint if exists runs_source_check;
alter table runs add constraint runs_source_check
  check (source in ('cron','rate','delay','once','manual','dependency','retry','misfire','backfill')) not valid;
create index runs_backfill_slot on runs (task_id, slot_ms) where source = 'backfill';
`,
  },
  {
    version: 13,
    name: "ledger of non-runs; a shard's previous owner",
    // Every slot is a run or a recorded non-run (actors/shard/ledger.ts); runs of consecutive
    // non-runs with one cause are one row. The shard's previous owner and epoch are kept by a
    // trigger when its epoch changes, so an outage can name them.
    sql: LEDGER_MIGRATION_SQL,
  },
  {
    version: 14,
    name: "stale runs, run results, task generation, executor instances",
    // A run an executor refused to start (expired, superseded, its task removed) ends 'stale';
    // an executor's result (an HTTP job's status and body excerpt) is kept on the run; a task's
    // generation (migration 11) goes out with each dispatch (ax task update bumps it);
    // executor instances report liveness (last seen, runs in flight) by heartbeat.
    sql: `
alter table runs drop constraint if exists runs_state_check;
alter table runs add constraint runs_state_check check (state in ('running','success','failed','timed_out','refused','skipped','stale'));
alter table runs add column result jsonb;
create table executor_instances (
  executor text not null,
  instance text not null,
  started_ms bigint not null,
  last_seen_ms bigint not null,
  in_flight int not null default 0,
  concurrency int,
  stats jsonb,
  primary key (executor, instance)
);
`,
  },
  {
    version: 15,
    name: "task tags and alert hooks",
    // tags: free labels for finding tasks (dashboard filter, ax task ls). alert_hooks: where a
    // task's or an executor's alerts go (ops/alerts.ts): a NATS subject and/or a webhook URL
    // (Slack-compatible JSON), for the events listed (failed, upstream_failed, missed).
    sql: `
alter table tasks add column tags text[] not null default '{}';
create index tasks_tags on tasks using gin (tags);
create table alert_hooks (
  scope text not null check (scope in ('task','executor')),
  target text not null,
  nats_subject text,
  webhook_url text,
  events text[] not null,
  created_ms bigint not null,
  primary key (scope, target),
  check (nats_subject is not null or webhook_url is not null)
);
`,
  },
  {
    version: 17,
    name: "partly released dispatch messages",
    // A message released while one of its shards was lost goes out with the other shards' runs
    // only. The shards it went out with are noted here first, so whoever re-publishes the
    // message sends that part under the message's id (dropped as a duplicate if it landed) and
    // the rest under a second id (see replayParts): re-publishing the whole message under the
    // first id was dropped as a duplicate, and the lost shard's runs never went out.
    sql: `alter table dispatches add column released_shards int[];`,
  },
  {
    version: 18,
    name: "executors that hold runs until their due time",
    // An executor whose instances hold a run received ahead of its due time until then (the SDK
    // registers so) gets its runs as soon as they are recorded, not at their due time (Persister).
    sql: `alter table executors add column holds boolean not null default false;`,
  },
  {
    version: 19,
    name: "the tags index holds tagged tasks only",
    // A GIN index over every task's tags gave each untagged task an entry for its empty array:
    // about 1 µs of PostgreSQL's time per task created (300k inserts: 1.49 against 1.16 s
    // without the index) and index pages for nothing. Tag searches say `tags <> '{}'` (a task
    // with the tag has tags), so they can use this partial index.
    sql: `drop index if exists tasks_tags;
create index tasks_tags on tasks using gin (tags) where tags <> '{}';`,
  },
  {
    version: 20,
    name: "an executor registered without an in-flight limit gets the node's (AX_MAX_IN_FLIGHT)",
    // The column's default (5,000) stood for "no limit of its own", and each node's refresh of
    // the executors applied it as the executor's limit: the node's AX_MAX_IN_FLIGHT (20,000 by
    // default) never applied to an executor that did not ask for a limit, and at 8,200 runs/s
    // with a 500 ms lead (about 5,000 runs decided, held or unreported at any moment) any delay
    // pinned the bound and every later run waited for a place. NULL now means "the node's
    // limit"; a 5,000 stored so far is taken as that default (an executor that asked for
    // exactly 5,000 sets it again when an instance next registers).
    sql: `alter table executors alter column max_in_flight drop not null, alter column max_in_flight drop default;
update executors set max_in_flight = null where max_in_flight = 5000;`,
  },
];

export const LATEST_SCHEMA_VERSION = MIGRATIONS[MIGRATIONS.length - 1]!.version;
/** Every migration's version, in the order they apply. */
export const SCHEMA_VERSIONS: readonly number[] = MIGRATIONS.map((m) => m.version);

export function quoteIdent(id: string): string {
  return `"${id.replace(/"/g, '""')}"`;
}

/** Applies every migration not yet recorded. Safe to call from many nodes at once. */
export async function migrate(pool: Pool, schema: string): Promise<{ applied: number[] }> {
  const client: PoolClient = await pool.connect();
  const applied: number[] = [];
  try {
    await client.query("begin");
    await client.query("select pg_advisory_xact_lock(hashtext($1))", [`ax-migrate:${schema}`]);
    await client.query(`create schema if not exists ${quoteIdent(schema)}`);
    await client.query(`set local search_path to ${quoteIdent(schema)}`);
    await client.query(`create table if not exists schema_migrations (version int primary key, name text not null, applied_ms bigint not null)`);
    const done = new Set((await client.query<{ version: number }>("select version from schema_migrations")).rows.map((r) => r.version));
    for (const m of MIGRATIONS) {
      if (done.has(m.version)) continue;
      await client.query(m.sql);
      await client.query("insert into schema_migrations (version, name, applied_ms) values ($1, $2, $3)", [m.version, m.name, Date.now()]);
      applied.push(m.version);
    }
    await client.query("commit");
  } catch (e) {
    await client.query("rollback").catch(() => undefined);
    throw e;
  } finally {
    client.release();
  }
  return { applied };
}

export async function dropSchema(pool: Pool, schema: string): Promise<void> {
  await pool.query(`drop schema if exists ${quoteIdent(schema)} cascade`);
}
