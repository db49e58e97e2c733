import type { Pool } from "pg";
import { InvalidInputError } from "../common/index.ts";
import type { RunRow, Store, TaskRow } from "../actors/index.ts";

/**
 * The listings the dashboard works with (and `ax` may use): search and filter tasks with a
 * total that matches the filter, failures across all tasks, a run with its retry chain, tags.
 * Read-only but for `task.tag`.
 */
export interface BrowseDeps {
  store: Store;
  publicTask: (t: TaskRow) => unknown;
  publicRun: (r: RunRow) => unknown;
  nowMs: () => number;
}

const TAG_RE = /^[A-Za-z0-9_.:/=-]{1,64}$/;
const STATE_RE = /^[a-z_]{1,32}$/;

function intArg(field: string, v: unknown, min: number, max: number, dflt: number): number {
  if (v === undefined || v === null || v === "") return dflt;
  const n = typeof v === "string" && /^\d+$/.test(v) ? Number(v) : v;
  if (typeof n !== "number" || !Number.isInteger(n) || n < min || n > max) throw new InvalidInputError(field, v, `must be a whole number from ${min} to ${max}`);
  return n;
}
const optStr = (v: unknown): string | null => (v === undefined || v === null || v === "" ? null : String(v));

/** Tags from a list or a comma-separated string: each 1-64 of letters, digits and `_ . : / = -`; at most 32. */
export function parseTags(v: unknown): string[] {
  const list = typeof v === "string" ? v.split(",").map((s) => s.trim()).filter(Boolean) : v;
  if (!Array.isArray(list) || list.length > 32) throw new InvalidInputError("tags", v, "a list of at most 32 tags");
  for (const t of list) if (typeof t !== "string" || !TAG_RE.test(t)) throw new InvalidInputError("tags", t, "a tag is 1-64 letters, digits or _ . : / = -");
  return [...new Set(list as string[])].sort();
}

async function tagsOf(pool: Pool, ids: number[]): Promise<Map<number, string[]>> {
  if (!ids.length) return new Map();
  const r = await pool.query("select id, tags from tasks where id = any($1::bigint[])", [ids]);
  return new Map(r.rows.map((x) => [Number(x.id), x.tags as string[]]));
}

/**
 * `task.search { q?, state?, executor?, tag?, limit? (1-500, 50), offset? }` → `{ total, offset,
 * limit, items }`: tasks whose name contains `q` (any case), in that state, of that executor,
 * with that tag, by name. `total` counts every match (the page is `items`).
 */
export async function searchTasks(d: BrowseDeps, a: Record<string, unknown>): Promise<unknown> {
  const q = optStr(a.q);
  const state = optStr(a.state);
  if (state !== null && !STATE_RE.test(state)) throw new InvalidInputError("state", state, "not a task state");
  const executor = optStr(a.executor);
  const tag = optStr(a.tag);
  if (tag !== null && !TAG_RE.test(tag)) throw new InvalidInputError("tag", tag, "not a tag");
  const limit = intArg("limit", a.limit, 1, 500, 50);
  const offset = intArg("offset", a.offset, 0, 10_000_000, 0);
  const like = q === null ? null : `%${q.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
  const where = `($1::text is null or t.name ilike $1) and ($2::text is null or t.state = $2) and ($3::text is null or t.executor = $3) and ($4::text is null or t.tags @> array[$4::text])`;
  const params = [like, state, executor, tag];
  const [count, page] = await Promise.all([
    d.store.pool.query(`select count(*)::int as n from tasks t where ${where}`, params),
    d.store.pool.query(`select t.id from tasks t where ${where} order by t.name limit $5 offset $6`, [...params, limit, offset]),
  ]);
  const ids = page.rows.map((r) => Number(r.id));
  const [rows, tags] = await Promise.all([Promise.all(ids.map((id) => d.store.getTask(id))), tagsOf(d.store.pool, ids)]);
  const items = rows.filter((t): t is TaskRow => t !== null).map((t) => ({ ...(d.publicTask(t) as object), tags: tags.get(t.id) ?? [] }));
  return { total: count.rows[0].n as number, offset, limit, items };
}

/** `task.tag { task, tags }`: replaces the task's tags. */
export async function tagTask(d: BrowseDeps, task: TaskRow, a: Record<string, unknown>): Promise<unknown> {
  const tags = parseTags(a.tags);
  await d.store.pool.query("update tasks set tags = $2 where id = $1", [task.id, tags]);
  return { task: task.name, tags };
}

/** The tags of one task (task.show adds them). */
export async function taskTags(d: BrowseDeps, id: number): Promise<string[]> {
  return (await tagsOf(d.store.pool, [id])).get(id) ?? [];
}

/**
 * `failures { since? (ms ago, default 24 h), executor?, limit?, offset? }` → runs that failed or
 * timed out across all tasks, newest first, with their total, and the tasks now upstream_failed.
 */
export async function failures(d: BrowseDeps, a: Record<string, unknown>): Promise<unknown> {
  const sinceMs = intArg("since", a.since, 1000, 366 * 86_400_000, 86_400_000);
  const limit = intArg("limit", a.limit, 1, 500, 50);
  const offset = intArg("offset", a.offset, 0, 10_000_000, 0);
  const executor = optStr(a.executor);
  const from = d.nowMs() - sinceMs;
  const where = "state in ('failed','timed_out') and created_ms >= $1 and ($2::text is null or executor = $2)";
  const [count, page, uf] = await Promise.all([
    d.store.pool.query(`select count(*)::int as n from runs where ${where}`, [from, executor]),
    d.store.pool.query(`select id from runs where ${where} order by created_ms desc, id desc limit $3 offset $4`, [from, executor, limit, offset]),
    d.store.pool.query("select name, executor from tasks where state = 'upstream_failed' and ($1::text is null or executor = $1) order by name limit 200", [executor]),
  ]);
  const runs = await d.store.getRuns(page.rows.map((r) => r.id as string));
  runs.sort((x, y) => y.createdMs - x.createdMs || (y.id < x.id ? -1 : 1));
  return { total: count.rows[0].n as number, since: new Date(from).toISOString(), offset, limit, items: runs.map(d.publicRun), upstreamFailed: uf.rows };
}

/** The attempts of the retry chain `run` belongs to, oldest first (at most 50 each way). */
export async function attemptsOf(d: BrowseDeps, run: RunRow): Promise<RunRow[]> {
  const chain: RunRow[] = [run];
  let cur = run;
  for (let i = 0; i < 50 && cur.source === "retry" && cur.causedBy; i++) {
    const prev = await d.store.getRun(cur.causedBy);
    if (!prev || prev.taskId !== run.taskId) break;
    chain.unshift(prev);
    cur = prev;
  }
  cur = run;
  for (let i = 0; i < 50; i++) {
    const r = await d.store.pool.query("select id from runs where task_id = $1 and caused_by = $2 and source = 'retry' limit 1", [run.taskId, cur.id]);
    if (!r.rowCount) break;
    const next = await d.store.getRun(r.rows[0].id as string);
    if (!next) break;
    chain.push(next);
    cur = next;
  }
  return chain;
}

/** `executors.inflight`: runs recorded `running` per executor, cluster-wide (the partial index runs_running serves it). */
export async function inFlightByExecutor(d: BrowseDeps): Promise<Record<string, number>> {
  const r = await d.store.pool.query("select executor, count(*)::int as n from runs where state = 'running' group by executor");
  return Object.fromEntries(r.rows.map((x) => [x.executor as string, x.n as number]));
}
