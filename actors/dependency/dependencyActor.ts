import type { JetStreamClient, JsMsg, ConsumerMessages } from "@nats-io/jetstream";
import type { Logger, Names } from "../../common/index.ts";
import { DEPENDENCY_CONSUMER, OutcomeBatchSchema, decode, encode, type DependencyTrigger, type Outcome } from "../../protocol/index.ts";
import type { Store } from "../store/index.ts";

/**
 * Advances dependency graphs from run-chain outcomes. Consumes `<ns>.outcome.>` with one
 * durable shared by every node (each outcome is handled by one node at a time), at least once
 * and idempotently:
 * - success of U: each edge U → D records U's run as "satisfied"; when every upstream edge of
 *   D is satisfied, a `due` trigger goes to D's shard with key = D + the satisfying run ids,
 *   and the edges are consumed. The trigger is published (JetStream msg id = key) while the
 *   edge rows are locked and before the consumption commits, so a crash in between republishes
 *   the same key; the shard derives the run id from the key and never runs it twice.
 * - failure for good (or upstream_failed) of U: each downstream gets an `upstream_failed`
 *   trigger naming U's run; its shard marks it and passes the failure further down.
 */
export class DependencyActor {
  private messages: ConsumerMessages | null = null;
  private loop: Promise<void> | null = null;
  private chain: Promise<void> = Promise.resolve();
  readonly stats = { outcomes: 0, triggers: 0 };
  constructor(private readonly d: { store: Store; js: JetStreamClient; names: Names; log: Logger }) {}

  async start(): Promise<void> {
    const c = await this.d.js.consumers.get(this.d.names.eventsStream, DEPENDENCY_CONSUMER);
    this.messages = await c.consume({ max_messages: 64 });
    const msgs = this.messages;
    this.loop = (async () => {
      for await (const m of msgs) {
        // Serial: two outcomes for one downstream must not race on its edges.
        this.chain = this.chain.then(() => this.onMessage(m)).catch((e) => {
          this.d.log.error({ err: String(e) }, "dependency outcome failed; redelivering");
          m.nak(1000);
        });
      }
    })().catch(() => undefined);
  }

  async stop(): Promise<void> {
    await this.messages?.close().catch(() => undefined);
    await this.chain.catch(() => undefined);
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
  }

  private async onOutcome(o: Outcome): Promise<void> {
    this.stats.outcomes++;
    const pool = this.d.store.pool;
    const upName = (await pool.query("select name from tasks where id = $1", [o.taskId])).rows[0]?.name ?? String(o.taskId);
    const downs = await this.d.store.downstreamsOf(o.taskId);
    for (const down of downs) {
      if (o.outcome !== "success") {
        await this.publish(down.shard, {
          v: 1, kind: "upstream_failed", taskId: down.id, key: `uf:${o.runId}`, upstreamRuns: [o.runId], at: o.at,
          reason: o.outcome === "failed" ? `upstream ${upName} failed for good (run ${o.runId}${o.reason ? `: ${o.reason}` : ""})`
            : `upstream ${upName} is upstream_failed (${o.reason ?? o.runId})`,
        });
        continue;
      }
      const c = await pool.connect();
      try {
        await c.query("begin");
        await c.query("update dependencies set satisfied_run = $3, satisfied_ms = $4 where downstream = $1 and upstream = $2", [down.id, o.taskId, o.runId, o.at]);
        const edges = (await c.query(
          "select d.upstream, t.name, d.satisfied_run from dependencies d join tasks t on t.id = d.upstream where d.downstream = $1 order by d.upstream for update of d",
          [down.id])).rows as Array<{ upstream: number; name: string; satisfied_run: string | null }>;
        if (edges.length && edges.every((e) => e.satisfied_run)) {
          const runs = edges.map((e) => e.satisfied_run!);
          await this.publish(down.shard, {
            v: 1, kind: "due", taskId: down.id, key: `due:${runs.join(",")}`, upstreamRuns: runs, at: o.at,
            reason: `ran because ${edges.map((e) => `${e.name} (run ${e.satisfied_run})`).join(" and ")} succeeded`,
          });
          await c.query("update dependencies set satisfied_run = null, satisfied_ms = null where downstream = $1", [down.id]);
        }
        await c.query("commit");
      } catch (e) {
        await c.query("rollback").catch(() => undefined);
        throw e;
      } finally { c.release(); }
    }
  }
}
