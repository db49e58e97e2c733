import type { JetStreamClient, JsMsg, ConsumerMessages } from "@nats-io/jetstream";
import type pg from "pg";
import type { Logger, Names } from "../../common/index.ts";
import { DEPENDENCY_CONSUMER, OutcomeBatchSchema, decode, derivedRunId, encode, type DependencyTrigger, type Outcome } from "../../protocol/index.ts";
import type { Store } from "../store/index.ts";

export interface DependencyActorDeps {
  store: Store;
  js: JetStreamClient;
  names: Names;
  log: Logger;
  /** How often lost outcomes and coalesced satisfactions are looked for (default 5 s; 0 = only at start). */
  reconcileMs?: number;
  now?: () => number;
  /** Told of each trigger published to a downstream (metrics). */
  onTrigger?: (kind: DependencyTrigger["kind"]) => void;
}

/** The run id a shard derives from a due trigger (ShardActor.onDependencyTrigger uses the same formula). */
export const dependencyRunId = (taskId: number, key: string): string => derivedRunId("rd", `${taskId}:${key}`);

interface Edge {
  upstream: number;
  name: string;
  createdMs: number;
  satisfiedRun: string | null;
  satisfiedMs: number | null;
  seenRun: string | null;
  seenMs: number | null;
  triggerKey: string | null;
  triggerMs: number | null;
}

interface Downstream { id: number; name: string; shard: number }

/** A due trigger still without its run this long after it was sent, while its task was free to run it, counts as lost. */
const PENDING_TRIGGER_LOST_MS = 5 * 60_000;

/**
 * The newest run of each upstream, when it ended its chain (success, or failed/timed out with no
 * attempt left) and some edge has not applied it yet: an outcome whose message was never
 * published (the node died between recording the run and publishing) is found here.
 */
const LOST_OUTCOMES_SQL = `
select x.task_id, x.id, x.state, x.error, x.created_ms, x.finished_ms
from (select distinct upstream from dependencies) u
join tasks t on t.id = u.upstream
cross join lateral (
  select r.task_id, r.id, r.state, r.attempt, r.error, r.created_ms, r.finished_ms from runs r
  where r.task_id = u.upstream and r.state <> 'skipped' order by r.created_ms desc limit 1) x
where (x.state = 'success' or (x.state in ('failed', 'timed_out')
        and (x.attempt >= t.max_attempts or (t.state = 'failed' and t.record->>'r' = x.id))))
  and exists (select 1 from dependencies d where d.upstream = u.upstream and d.seen_run is distinct from x.id
        and (d.seen_ms is null or d.seen_ms <= x.created_ms) and d.created_ms <= x.created_ms)`;

/**
 * Advances dependency graphs from run-chain outcomes. Consumes `<ns>.outcome.>` with one
 * durable shared by every node (each outcome is handled by one node at a time), at least once
 * and idempotently. Per edge U → D the `dependencies` row holds:
 * - `seen_run`/`seen_ms`: the last outcome of U applied to the edge, ordered by the run's
 *   creation time. A redelivered outcome (same run) or an older one is skipped, so a crash
 *   between applying and acking never applies an outcome twice.
 * - `satisfied_run`/`satisfied_ms`: U's latest success not yet consumed by a run of D.
 * - `trigger_key`/`trigger_ms`: the due trigger published for D (same on every edge of D). At
 *   most one is outstanding: until the shard has turned it into a run, later successes only
 *   update the satisfactions, and that run (fired after them) uses them up: they coalesce.
 *
 * Success of U: the edge is satisfied; when every edge of D is satisfied by a success newer
 * than D's last fired run (whatever its source), a `due` trigger goes to D's shard with key =
 * the satisfying run ids and the edges are consumed.
 * The trigger is published (JetStream msg id from the key) while D's edge rows are locked and
 * before the consumption commits, so a crash in between republishes the same key; the shard
 * derives the run id from the key and never runs it twice.
 *
 * Failure for good (or upstream_failed) of U: the edge's satisfaction is dropped and D gets an
 * `upstream_failed` trigger naming the failed run; its shard marks it and passes it further down.
 *
 * A reconcile at start and every `reconcileMs` (one node at a time, advisory lock) applies
 * outcomes whose message was never published (the newest chain-ending run of each upstream,
 * from the run history) and re-evaluates downstreams whose edges are all satisfied (used-up
 * satisfactions are cleared; a lost outstanding trigger is replaced).
 */
export class DependencyActor {
  private messages: ConsumerMessages | null = null;
  private loop: Promise<void> | null = null;
  private chain: Promise<void> = Promise.resolve();
  private timer: ReturnType<typeof setTimeout> | null = null;
  private stopped = false;
  readonly stats = { outcomes: 0, applied: 0, skipped: 0, triggers: 0, reconciled: 0 };
  private readonly now: () => number;

  constructor(private readonly d: DependencyActorDeps) {
    this.now = d.now ?? Date.now;
  }

  async start(): Promise<void> {
    const c = await this.d.js.consumers.get(this.d.names.eventsStream, DEPENDENCY_CONSUMER);
    this.messages = await c.consume({ max_messages: 64 });
    const msgs = this.messages;
    this.loop = (async () => {
      for await (const m of msgs) {
        // Serial within a node; across nodes the edge row locks serialize.
        this.enqueue(() => this.onMessage(m), (e) => {
          this.d.log.error({ err: String(e) }, "dependency outcome failed; redelivering");
          m.nak(1000);
        });
      }
    })().catch(() => undefined);
    // A node starting is often a node replacing one that died: look for lost outcomes at once.
    this.scheduleReconcile(0);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.messages?.close().catch(() => undefined);
    await this.chain.catch(() => undefined);
  }

  /** Runs a reconcile now (tests, operators); resolves when it is done. */
  reconcileNow(): Promise<void> {
    return new Promise((resolve) => this.enqueue(() => this.reconcile(), (e) => this.d.log.warn({ err: String(e) }, "dependency reconcile failed"), resolve));
  }

  private enqueue(job: () => Promise<void>, onError: (e: unknown) => void, done?: () => void): void {
    this.chain = this.chain.then(job).catch(onError).finally(() => done?.());
  }

  private scheduleReconcile(delayMs: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.enqueue(() => this.reconcile(), (e) => this.d.log.warn({ err: String(e) }, "dependency reconcile failed"), () => {
        const every = this.d.reconcileMs ?? 5000;
        if (every > 0) this.scheduleReconcile(every);
      });
    }, delayMs);
    this.timer.unref?.();
  }

  private async onMessage(m: JsMsg): Promise<void> {
    const dec = decode(OutcomeBatchSchema, m.data);
    if (!dec.ok) { this.d.log.warn({ reason: dec.reason }, "malformed outcome refused"); m.term(); return; }
    for (const o of dec.value.outcomes) await this.onOutcome(o);
    m.ack();
  }

  private async publish(shard: number, trig: DependencyTrigger): Promise<void> {
    await this.d.js.publish(this.d.names.triggerSubject(shard), encode(trig), { msgID: `t:${trig.taskId}:${trig.key}` });
    this.stats.triggers++;
    this.d.onTrigger?.(trig.kind);
  }

  private tx<T>(fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
    return this.d.store.transaction(fn);
  }

  /** D's edges, locked in upstream order (every writer locks them the same way: no deadlock). */
  private async lockEdges(c: pg.PoolClient, downstream: number): Promise<Edge[]> {
    const r = await c.query(
      `select d.upstream, t.name, d.created_ms, d.satisfied_run, d.satisfied_ms, d.seen_run, d.seen_ms, d.trigger_key, d.trigger_ms
       from dependencies d join tasks t on t.id = d.upstream where d.downstream = $1 order by d.upstream for update of d`, [downstream]);
    return r.rows.map((x) => ({
      upstream: x.upstream, name: x.name, createdMs: x.created_ms, satisfiedRun: x.satisfied_run, satisfiedMs: x.satisfied_ms,
      seenRun: x.seen_run, seenMs: x.seen_ms, triggerKey: x.trigger_key, triggerMs: x.trigger_ms,
    }));
  }

  async onOutcome(o: Outcome): Promise<void> {
    this.stats.outcomes++;
    const pool = this.d.store.pool;
    const [up, run, downs] = await Promise.all([
      pool.query("select name from tasks where id = $1", [o.taskId]),
      pool.query("select created_ms from runs where id = $1", [o.runId]),
      pool.query("select t.id, t.name, t.shard from dependencies d join tasks t on t.id = d.downstream where d.upstream = $1 order by t.id", [o.taskId]),
    ]);
    const upName = (up.rows[0]?.name as string | undefined) ?? String(o.taskId);
    // Outcomes of one upstream are ordered by when their run was created (the shard's clock at fire time).
    const orderMs = (run.rows[0]?.created_ms as number | undefined) ?? o.at;
    for (const down of downs.rows as Downstream[]) await this.tx((c) => this.applyToEdge(c, down, o, orderMs, upName));
  }

  private async applyToEdge(c: pg.PoolClient, down: Downstream, o: Outcome, orderMs: number, upName: string): Promise<void> {
    const edges = await this.lockEdges(c, down.id);
    const e = edges.find((x) => x.upstream === o.taskId);
    if (!e) return; // edge removed meanwhile
    const stale = e.seenRun === o.runId || (e.seenMs !== null && orderMs < e.seenMs)
      // A run fired before the edge was added does not count for it.
      || (o.outcome !== "upstream_failed" && orderMs < e.createdMs);
    if (stale) { this.stats.skipped++; return; }
    this.stats.applied++;
    const ok = o.outcome === "success";
    e.seenRun = o.runId; e.seenMs = orderMs;
    e.satisfiedRun = ok ? o.runId : null; e.satisfiedMs = ok ? o.at : null;
    await c.query("update dependencies set seen_run = $3, seen_ms = $4, satisfied_run = $5, satisfied_ms = $6 where downstream = $1 and upstream = $2",
      [down.id, o.taskId, e.seenRun, e.seenMs, e.satisfiedRun, e.satisfiedMs]);
    if (!ok) {
      await this.publish(down.shard, {
        v: 1, kind: "upstream_failed", taskId: down.id, key: `uf:${o.runId}`, upstreamRuns: [o.runId], at: this.now(),
        reason: o.outcome === "failed" ? `upstream ${upName} failed for good (run ${o.runId}${o.reason ? `: ${o.reason}` : ""})`
          : `upstream ${upName} is upstream_failed (${o.reason ?? o.runId})`,
      });
      return;
    }
    await this.evaluate(c, down, edges);
  }

  /** With D's edges locked: publish D's due trigger if every upstream has succeeded since D last ran. */
  private async evaluate(c: pg.PoolClient, down: Downstream, edges: Edge[]): Promise<boolean> {
    if (!edges.length || edges.some((x) => !x.satisfiedRun)) return false;
    const pending = edges.find((x) => x.triggerKey);
    if (pending && !(await c.query("select 1 from runs where id = $1", [dependencyRunId(down.id, pending.triggerKey!)])).rowCount) {
      // Outstanding: it comes back until the shard runs it (a running or paused D naks it). Only
      // a trigger that is old while D could have run it is taken as lost, so D never stalls.
      const age = this.now() - (pending.triggerMs ?? 0);
      if (age < PENDING_TRIGGER_LOST_MS) return false;
      const st = (await c.query("select state from tasks where id = $1", [down.id])).rows[0]?.state as string | undefined;
      if (st === "running" || st === "paused" || st === "cancelled") return false;
      this.d.log.warn({ taskId: down.id, key: pending.triggerKey, ageMs: age }, "dependency trigger never turned into a run; sending a new one");
    }
    // "Since D last ran": a run of D fired after an upstream succeeded (by its own trigger, by
    // hand, or the outstanding trigger's run) uses that success up. This is also what makes
    // successes that arrived while a trigger was outstanding coalesce into that trigger's run.
    const last = await c.query(
      "select fired_ms from runs where task_id = $1 and state not in ('skipped', 'refused') and fired_ms is not null order by created_ms desc limit 1",
      [down.id]);
    const lastRanMs = last.rows[0]?.fired_ms as number | undefined;
    if (lastRanMs !== undefined) {
      const used = edges.filter((x) => (x.satisfiedMs ?? 0) < lastRanMs);
      if (used.length) {
        await c.query("update dependencies set satisfied_run = null, satisfied_ms = null where downstream = $1 and upstream = any($2::bigint[])",
          [down.id, used.map((x) => x.upstream)]);
        for (const x of used) { x.satisfiedRun = null; x.satisfiedMs = null; }
        return false;
      }
    }
    const runs = edges.map((x) => x.satisfiedRun!);
    const key = `due:${runs.join(",")}`;
    const now = this.now();
    await this.publish(down.shard, {
      v: 1, kind: "due", taskId: down.id, key, upstreamRuns: runs, at: now,
      reason: `ran because ${edges.map((x) => `${x.name} (run ${x.satisfiedRun})`).join(" and ")} succeeded`,
    });
    await c.query("update dependencies set satisfied_run = null, satisfied_ms = null, trigger_key = $2, trigger_ms = $3 where downstream = $1", [down.id, key, now]);
    for (const x of edges) { x.satisfiedRun = null; x.satisfiedMs = null; x.triggerKey = key; x.triggerMs = now; }
    return true;
  }

  private async reconcile(): Promise<void> {
    if (this.stopped) return;
    const pool = this.d.store.pool;
    const lockKey = `ax-deps-reconcile:${this.d.store.schema}`;
    const c = await pool.connect();
    try {
      if (!(await c.query("select pg_try_advisory_lock(hashtext($1)) as ok", [lockKey])).rows[0].ok) return; // another node is at it
      try {
        const lost = await c.query(LOST_OUTCOMES_SQL);
        for (const r of lost.rows) {
          if (this.stopped) return;
          this.stats.reconciled++;
          this.d.log.warn({ taskId: r.task_id, runId: r.id, state: r.state }, "dependency outcome was not delivered; applying it from the run history");
          await this.onOutcome({
            taskId: r.task_id, runId: r.id, outcome: r.state === "success" ? "success" : "failed", at: r.finished_ms ?? this.now(),
            ...(r.error ? { reason: r.error as string } : {}),
          });
        }
        const ready = await c.query(
          `select t.id, t.name, t.shard from tasks t where t.id in
             (select downstream from dependencies group by downstream having bool_and(satisfied_run is not null)) order by t.id`);
        for (const down of ready.rows as Downstream[]) {
          if (this.stopped) return;
          await this.tx(async (tc) => { await this.evaluate(tc, down, await this.lockEdges(tc, down.id)); });
        }
      } finally {
        await c.query("select pg_advisory_unlock(hashtext($1))", [lockKey]).catch(() => undefined);
      }
    } finally { c.release(); }
  }
}
