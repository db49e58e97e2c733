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
  const { total, ids } = await d.store.browse.searchTasks({ nameLike: like, state, executor, tag }, limit, offset);
  const [rows, tags] = await Promise.all([Promise.all(ids.map((id) => d.store.getTask(id))), d.store.browse.tagsOf(ids)]);
  const items = rows.filter((t): t is TaskRow => t !== null).map((t) => ({ ...(d.publicTask(t) as object), tags: tags.get(t.id) ?? [] }));
  return { total, offset, limit, items };
}

/** `task.tag { task, tags }`: replaces the task's tags. */
export async function tagTask(d: BrowseDeps, task: TaskRow, a: Record<string, unknown>): Promise<unknown> {
  const tags = parseTags(a.tags);
  await d.store.browse.setTags(task.id, tags);
  return { task: task.name, tags };
}

/** The tags of one task (task.show adds them). */
export async function taskTags(d: BrowseDeps, id: number): Promise<string[]> {
  return (await d.store.browse.tagsOf([id])).get(id) ?? [];
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
  const f = await d.store.browse.failures(from, executor, limit, offset);
  const runs = await d.store.getRuns(f.runIds);
  runs.sort((x, y) => y.createdMs - x.createdMs || (y.id < x.id ? -1 : 1));
  return { total: f.total, since: new Date(from).toISOString(), offset, limit, items: runs.map(d.publicRun), upstreamFailed: f.upstreamFailed };
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
    const id = await d.store.retryOf(run.taskId, cur.id);
    if (id === null) break;
    const next = await d.store.getRun(id);
    if (!next) break;
    chain.push(next);
    cur = next;
  }
  return chain;
}

/**
 * `executors.inflight`: places held at each executor, cluster-wide — the sum of what every live
 * node's heartbeat says its limiter holds (runs dispatched and not ended, places reserved). No
 * query: counting `running` rows meant a scan of the runs table on every dashboard refresh.
 * While a node of an older version (whose heartbeat does not say) is live, the runs table is
 * counted as before.
 */
export async function inFlightByExecutor(d: BrowseDeps, nodes: ReadonlyArray<{ load?: { byExecutor?: Record<string, number> } }>): Promise<Record<string, number>> {
  if (!nodes.length || nodes.some((n) => !n.load?.byExecutor)) return d.store.browse.runningByExecutor();
  const out: Record<string, number> = {};
  for (const n of nodes) for (const [executor, k] of Object.entries(n.load!.byExecutor!)) out[executor] = (out[executor] ?? 0) + k;
  return out;
}
