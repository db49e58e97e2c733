import type { JetStreamClient, JsMsg, ConsumerMessages } from "@nats-io/jetstream";
import type { Logger, Names } from "../../common/index.ts";
import { DEPENDENCY_CONSUMER, OutcomeBatchSchema, closeGently, decode, handBack, derivedRunId, encode, nakLater, type DeadLetters, type DependencyTrigger, type Outcome } from "../../protocol/index.ts";
import type { Downstream, Edge, EdgeTransaction, Store } from "../store/index.ts";

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
  /** Where outcomes that can never be processed are parked (without it they are only terminated). */
  dead?: DeadLetters;
}

/** The run id a shard derives from a due trigger (ShardActor.onDependencyTrigger uses the same formula). */
export const dependencyRunId = (taskId: number, key: string): string => derivedRunId("rd", `${taskId}:${key}`);

/** A due trigger still without its run this long after it was sent, while its task was free to run it, counts as lost. */
const PENDING_TRIGGER_LOST_MS = 5 * 60_000;

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
        if (this.stopped) { handBack(m); continue; } // on its way as the pull stopped (closeGently): the next reader's
        // Serial within a node; across nodes the edge row locks serialize.
        this.enqueue(() => this.onMessage(m), (e) => {
          this.d.log.error({ err: String(e) }, "dependency outcome failed; redelivering");
          nakLater(m);
        });
      }
    })().catch(() => undefined);
    // A node starting is often a node replacing one that died: look for lost outcomes at once.
    this.scheduleReconcile(0);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    if (this.messages) await closeGently(this.messages).catch(() => undefined);
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
    if (!dec.ok) {
      if (this.d.dead) await this.d.dead.park(m, "dependency", "malformed", `malformed outcome batch: ${dec.reason}`);
      else { this.d.log.warn({ reason: dec.reason }, "malformed outcome refused"); m.term(); }
      return;
    }
    // Failed on every delivery so far: parked (the reconcile still finds a lost outcome from PostgreSQL).
    if (this.d.dead?.exhausted(m)) { await this.d.dead.park(m, "dependency", "deliveries", `not processed in ${m.info.deliveryCount - 1} deliveries`); return; }
    for (const o of dec.value.outcomes) await this.onOutcome(o);
    m.ack();
  }

  private async publish(shard: number, trig: DependencyTrigger): Promise<void> {
    await this.d.js.publish(this.d.names.triggerSubject(shard), encode(trig), { msgID: `t:${trig.taskId}:${trig.key}` });
    this.stats.triggers++;
    this.d.onTrigger?.(trig.kind);
  }

  async onOutcome(o: Outcome): Promise<void> {
    this.stats.outcomes++;
    const ctx = await this.d.store.edges.outcomeContext(o.taskId, o.runId);
    const upName = ctx.upstreamName ?? String(o.taskId);
    // Outcomes of one upstream are ordered by when their run was created (the shard's clock at fire time).
    const orderMs = ctx.runCreatedMs ?? o.at;
    for (const down of ctx.downstreams) await this.d.store.edges.transaction((t) => this.applyToEdge(t, down, o, orderMs, upName));
  }

  private async applyToEdge(t: EdgeTransaction, down: Downstream, o: Outcome, orderMs: number, upName: string): Promise<void> {
    const edges = await t.lockEdges(down.id);
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
    await t.saveSeen(down.id, e);
    if (!ok) {
      await this.publish(down.shard, {
        v: 1, kind: "upstream_failed", taskId: down.id, key: `uf:${o.runId}`, upstreamRuns: [o.runId], at: this.now(),
        reason: o.outcome === "failed" ? `upstream ${upName} failed for good (run ${o.runId}${o.reason ? `: ${o.reason}` : ""})`
          : `upstream ${upName} is upstream_failed (${o.reason ?? o.runId})`,
      });
      return;
    }
    await this.evaluate(t, down, edges);
  }

  /** With D's edges locked: publish D's due trigger if every upstream has succeeded since D last ran. */
  private async evaluate(t: EdgeTransaction, down: Downstream, edges: Edge[]): Promise<boolean> {
    if (!edges.length || edges.some((x) => !x.satisfiedRun)) return false;
    const pending = edges.find((x) => x.triggerKey);
    if (pending && !(await t.runExists(dependencyRunId(down.id, pending.triggerKey!)))) {
      // Outstanding: it comes back until the shard runs it (a running or paused D naks it). Only
      // a trigger that is old while D could have run it is taken as lost, so D never stalls.
      const age = this.now() - (pending.triggerMs ?? 0);
      if (age < PENDING_TRIGGER_LOST_MS) return false;
      const st = await t.taskState(down.id);
      if (st === "running" || st === "paused" || st === "cancelled") return false;
      this.d.log.warn({ taskId: down.id, key: pending.triggerKey, ageMs: age }, "dependency trigger never turned into a run; sending a new one");
    }
    // "Since D last ran": a run of D fired after an upstream succeeded (by its own trigger, by
    // hand, or the outstanding trigger's run) uses that success up. This is also what makes
    // successes that arrived while a trigger was outstanding coalesce into that trigger's run.
    const lastRanMs = await t.lastFiredMs(down.id);
    if (lastRanMs !== undefined) {
      const used = edges.filter((x) => (x.satisfiedMs ?? 0) < lastRanMs);
      if (used.length) {
        await t.clearSatisfied(down.id, used.map((x) => x.upstream));
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
    await t.consumeInto(down.id, key, now);
    for (const x of edges) { x.satisfiedRun = null; x.satisfiedMs = null; x.triggerKey = key; x.triggerMs = now; }
    return true;
  }

  private async reconcile(): Promise<void> {
    if (this.stopped) return;
    const edges = this.d.store.edges;
    await edges.whileReconcileLocked(async () => { // false: another node is at it
      for (const r of await edges.lostOutcomes()) {
        if (this.stopped) return;
        this.stats.reconciled++;
        this.d.log.warn({ taskId: r.taskId, runId: r.runId, state: r.state }, "dependency outcome was not delivered; applying it from the run history");
        await this.onOutcome({
          taskId: r.taskId, runId: r.runId, outcome: r.state === "success" ? "success" : "failed", at: r.finishedMs ?? this.now(),
          ...(r.error ? { reason: r.error } : {}),
        });
      }
      for (const down of await edges.readyDownstreams()) {
        if (this.stopped) return;
        await edges.transaction(async (t) => { await this.evaluate(t, down, await t.lockEdges(down.id)); });
      }
    });
  }
}
