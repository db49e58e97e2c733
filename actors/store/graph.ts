import type pg from "pg";
import { AxError } from "../../common/index.ts";

/**
 * The dependency graph's edges as the API changes them (ax deps add/rm, tasks created with
 * `after`): every change under one cluster-wide lock, checked for cycles first.
 */
export class DependencyGraph {
  constructor(private readonly pool: pg.Pool, private readonly schema: string,
    private readonly transaction: <T>(fn: (c: pg.PoolClient) => Promise<T>) => Promise<T>) {}

  /** Serializes every change to the graph cluster-wide, so two concurrent edges cannot both pass the cycle check. */
  async lock(c: pg.PoolClient): Promise<void> {
    await c.query("select pg_advisory_xact_lock(hashtext($1))", [`ax-graph:${this.schema}`]);
  }

  async insertEdge(c: pg.PoolClient, downstream: number, upstream: number, nowMs: number): Promise<void> {
    if (downstream === upstream) throw new AxError("AX_E_CYCLE", "a task cannot depend on itself", { field: "after", value: upstream });
    const r = await c.query("select downstream, upstream from dependencies");
    const edges = r.rows.map((x) => [x.upstream as number, x.downstream as number] as const);
    edges.push([upstream, downstream]);
    const found = findCycle(edges);
    if (found) {
      // Named from the task being changed: "B → … → B" for `deps add B UPSTREAM`.
      const at = found.indexOf(downstream);
      const cycle = at > 0 ? [...found.slice(at, -1), ...found.slice(0, at), downstream] : found;
      const names = await c.query("select id, name from tasks where id = any($1::bigint[])", [cycle]);
      const byId = new Map(names.rows.map((x) => [x.id as number, x.name as string]));
      const path = cycle.map((id) => byId.get(id) ?? String(id));
      throw new AxError("AX_E_CYCLE", `dependency would close a cycle: ${path.join(" → ")}`, { field: "after", value: path });
    }
    await c.query("insert into dependencies (downstream, upstream, created_ms) values ($1, $2, $3) on conflict do nothing", [downstream, upstream, nowMs]);
    // In the edge's transaction: a fetch that sees the edge sees the flags (see migration 6).
    await c.query("update tasks set dep_flags = dep_flags | (case when id = $1 then 1 else 2 end) where id in ($1, $2)", [downstream, upstream]);
  }

  add(downstream: number, upstream: number, nowMs: number): Promise<void> {
    return this.transaction(async (c) => {
      await this.lock(c);
      await this.insertEdge(c, downstream, upstream, nowMs);
    });
  }

  /**
   * Removes an edge and recomputes both ends' dependency flags. Under the graph lock: a
   * recompute racing an edge added at the same time could not see that edge and would clear a
   * flag it needs (its downstream would then never be told of the upstream's outcome).
   */
  remove(downstream: number, upstream: number): Promise<boolean> {
    return this.transaction(async (c) => {
      await this.lock(c);
      const r = await c.query("delete from dependencies where downstream = $1 and upstream = $2", [downstream, upstream]);
      if (!r.rowCount) return false;
      await c.query(`update tasks t set dep_flags = (case when exists (select 1 from dependencies d where d.downstream = t.id) then 1 else 0 end)
        | (case when exists (select 1 from dependencies d where d.upstream = t.id) then 2 else 0 end) where t.id in ($1, $2)`, [downstream, upstream]);
      return true;
    });
  }

  async downstreamsOf(upstream: number): Promise<Array<{ id: number; name: string; shard: number }>> {
    const r = await this.pool.query("select t.id, t.name, t.shard from dependencies d join tasks t on t.id = d.downstream where d.upstream = $1 order by t.id", [upstream]);
    return r.rows.map((x) => ({ id: x.id, name: x.name, shard: x.shard }));
  }

  async allEdges(): Promise<Array<{ upstream: number; downstream: number }>> {
    const r = await this.pool.query("select upstream, downstream from dependencies");
    return r.rows.map((x) => ({ upstream: x.upstream, downstream: x.downstream }));
  }
}

/**
 * Kahn's topological sort over edges [upstream, downstream]; when nodes remain, names one cycle
 * among them as a closed path (A, B, C, A).
 *
 * The path is found walking back along in-edges: every remaining node has one from another
 * remaining node (its in-degree did not reach zero), so the walk never dead-ends and must come
 * back to a node it passed, which closes a cycle. Walking forward along out-edges (as before)
 * could start at a node downstream of the cycle, which is left too but leads nowhere: the cycle
 * was then not reported, and an edge closing it was accepted whenever the edges came back from
 * PostgreSQL in such an order (rows an update moved in the table, say).
 */
export function findCycle(edges: ReadonlyArray<readonly [number, number]>): number[] | null {
  const out = new Map<number, number[]>();
  const into = new Map<number, number[]>();
  const indeg = new Map<number, number>();
  for (const [a, b] of edges) {
    if (!out.has(a)) out.set(a, []);
    if (!out.has(b)) out.set(b, []);
    out.get(a)!.push(b);
    const preds = into.get(b);
    if (preds) preds.push(a); else into.set(b, [a]);
    indeg.set(b, (indeg.get(b) ?? 0) + 1);
    if (!indeg.has(a)) indeg.set(a, 0);
  }
  const queue = [...indeg].filter(([, d]) => d === 0).map(([n]) => n);
  while (queue.length) {
    const n = queue.pop()!;
    for (const m of out.get(n)!) {
      const d = indeg.get(m)! - 1;
      indeg.set(m, d);
      if (d === 0) queue.push(m);
    }
  }
  const left = new Set([...indeg].filter(([, d]) => d > 0).map(([n]) => n));
  if (!left.size) return null;
  // back[i + 1] → back[i] is an edge; a node met again at back[j] closes back[j] → back[k] → … → back[j].
  const start = left.values().next().value as number;
  const back: number[] = [start];
  const at = new Map<number, number>([[start, 0]]);
  for (;;) {
    const pred = into.get(back[back.length - 1]!)!.find((m) => left.has(m))!;
    const j = at.get(pred);
    if (j !== undefined) return [pred, ...back.slice(j + 1).reverse(), pred];
    at.set(pred, back.length);
    back.push(pred);
  }
}
