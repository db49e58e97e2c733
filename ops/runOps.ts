import type { NatsConnection } from "@nats-io/transport-node";
import { AxError, InvalidInputError, type Clock, type Names } from "../common/index.ts";
import { encode } from "../protocol/index.ts";
import type { RunRow, Store } from "../actors/index.ts";

/**
 * Operations about single runs and executor instances, beside the task API (ops/api.ts):
 * - `run.check.<executor>` (the SDK, before starting a run that sat in the queue or came back):
 *   which of these runs are stale — ended already (a timeout and its retry superseded it), their
 *   task removed, or their task's generation moved on;
 * - `getRun` (op `run.get`, `ax run --wait`; ops/api.ts answers it): a run and what follows it (its retry, or one still to come);
 * - `run.cancel` (`ax run cancel`): asks the instance running the run to abort it;
 * - `executor.heartbeat.<executor>` (the SDK, every few seconds): an instance's liveness;
 * - `executorLiveness()`: every executor with its live instances, for `status`.
 */
export interface RunOpsDeps { store: Store; nc: NatsConnection; names: Names; clock: Clock }

/** An instance is live while its last heartbeat is younger than this many of its periods. */
const MISSED_BEATS = 3;
/** Instance rows older than this are forgotten (a dead instance stays visible this long). */
const FORGET_INSTANCE_MS = 3_600_000;
const NAME_RE = /^[A-Za-z0-9_-]{1,64}$/;

export type Liveness = "alive" | "dead" | "none";
export interface ExecutorView {
  name: string; kind: string; maxInFlight: number; lastSeenMs: number | null; lastSeenAt: string | null;
  /** alive: an instance heartbeats; dead: instances stopped heartbeating without saying goodbye; none: no instance reports. */
  liveness: Liveness; dead: boolean; instances: number; inFlight: number;
  instanceList: Array<{ instance: string; lastSeenAt: string; inFlight: number; concurrency: number | null; alive: boolean; startedAt: string }>;
}

const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());

export class RunOps {
  constructor(private readonly d: RunOpsDeps) {}

  /** The operations this module answers; `undefined` for any other. */
  handle(op: string, a: Record<string, unknown>, who: string): Promise<unknown> | undefined {
    if (op.startsWith("run.check.")) return this.check(op.slice("run.check.".length), a);
    if (op.startsWith("executor.heartbeat.")) return this.heartbeat(op.slice("executor.heartbeat.".length), a);
    if (op === "run.cancel") return this.cancel(a, who);
    return undefined;
  }

  private async check(executor: string, a: Record<string, unknown>): Promise<{ stale: Record<string, string> }> {
    if (!NAME_RE.test(executor)) throw new InvalidInputError("executor", executor, "letters, digits, _ or - only");
    const list = a.runs;
    if (!Array.isArray(list) || list.length > 10_000) throw new InvalidInputError("runs", Array.isArray(list) ? list.length : list, "an array of at most 10000 {runId, taskId, gen?}");
    const want = list.map((x, i) => {
      const r = x as { runId?: unknown; taskId?: unknown; gen?: unknown };
      if (typeof r?.runId !== "string" || !Number.isSafeInteger(r.taskId)) throw new InvalidInputError(`runs[${i}]`, x, "needs runId (string) and taskId (integer)");
      return { runId: r.runId, taskId: r.taskId as number, gen: Number.isSafeInteger(r.gen) ? (r.gen as number) : null };
    });
    const stale: Record<string, string> = {};
    if (!want.length) return { stale };
    const pool = this.d.store.pool;
    const runs = new Map((await pool.query<{ id: string; state: string; error: string | null; executor: string; task_id: number }>(
      "select id, state, error, executor, task_id from runs where id = any($1::text[])", [want.map((w) => w.runId)])).rows.map((r) => [r.id, r]));
    const tasks = new Map((await pool.query<{ id: number; generation: number }>(
      "select id, generation from tasks where id = any($1::bigint[])", [[...new Set(want.map((w) => w.taskId))]])).rows.map((t) => [Number(t.id), t.generation]));
    const ended = want.filter((w) => runs.get(w.runId) && runs.get(w.runId)!.state !== "running");
    const retries = new Map<string, string>();
    if (ended.length) {
      const r = await pool.query<{ id: string; caused_by: string }>(
        "select id, caused_by from runs where task_id = any($1::bigint[]) and caused_by = any($2::text[]) order by created_ms",
        [[...new Set(ended.map((w) => w.taskId))], ended.map((w) => w.runId)]);
      for (const x of r.rows) if (!retries.has(x.caused_by)) retries.set(x.caused_by, x.id);
    }
    for (const w of want) {
      const run = runs.get(w.runId);
      if (run && run.executor !== executor) throw new InvalidInputError("runs", w.runId, `run of executor ${run.executor}, not ${executor}`, "AX_E_FORBIDDEN");
      const gen = tasks.get(w.taskId);
      if (gen === undefined) { stale[w.runId] = `its task (id ${w.taskId}) was removed`; continue; }
      if (run && run.state !== "running") {
        const next = retries.get(w.runId);
        stale[w.runId] = `superseded: the run already ended ${run.state}${run.error ? ` (${run.error})` : ""}${next ? `; retry ${next} replaced it` : ""}`;
        continue;
      }
      if (w.gen !== null && gen > w.gen) stale[w.runId] = `its task changed after the run was decided (generation ${w.gen} → ${gen})`;
    }
    return { stale };
  }

  private async heartbeat(executor: string, a: Record<string, unknown>): Promise<{ ok: true }> {
    if (!NAME_RE.test(executor)) throw new InvalidInputError("executor", executor, "letters, digits, _ or - only");
    const instance = a.instance;
    if (typeof instance !== "string" || !instance.length || instance.length > 200) throw new InvalidInputError("instance", instance, "required (1 to 200 characters)");
    const num = (v: unknown, min: number, max: number) => (typeof v === "number" && Number.isFinite(v) ? Math.max(min, Math.min(max, Math.floor(v))) : null);
    const now = this.d.clock.now();
    const pool = this.d.store.pool;
    if (a.stopping === true) {
      await pool.query("delete from executor_instances where executor = $1 and instance = $2", [executor, instance]);
    } else {
      const stats = { everyMs: num(a.everyMs, 100, 3_600_000) ?? 5000, kind: a.kind === "http" ? "http" : "nats", counters: a.stats ?? null };
      await pool.query(
        `insert into executor_instances (executor, instance, started_ms, last_seen_ms, in_flight, concurrency, stats) values ($1, $2, $3, $4, $5, $6, $7)
         on conflict (executor, instance) do update set last_seen_ms = $4, in_flight = $5, concurrency = $6, stats = $7`,
        [executor, instance, num(a.startedMs, 0, Number.MAX_SAFE_INTEGER) ?? now, now, num(a.inFlight, 0, 10_000_000) ?? 0, num(a.concurrency, 1, 10_000_000), JSON.stringify(stats)]);
    }
    await pool.query("update executors set last_seen_ms = greatest(coalesce(last_seen_ms, 0), $2) where name = $1", [executor, now]);
    return { ok: true };
  }

  /** Every registered executor with its instances' liveness (a dead executor is flagged). */
  async executorLiveness(): Promise<ExecutorView[]> {
    const now = this.d.clock.now();
    const pool = this.d.store.pool;
    await pool.query("delete from executor_instances where last_seen_ms < $1", [now - FORGET_INSTANCE_MS]).catch(() => undefined);
    const execs = await this.d.store.listExecutors();
    const rows = (await pool.query<{ executor: string; instance: string; started_ms: number; last_seen_ms: number; in_flight: number; concurrency: number | null; stats: { everyMs?: number } | null }>(
      "select executor, instance, started_ms, last_seen_ms, in_flight, concurrency, stats from executor_instances order by executor, instance")).rows;
    return execs.map((e) => {
      const mine = rows.filter((r) => r.executor === e.name).map((r) => {
        const alive = now - r.last_seen_ms <= MISSED_BEATS * (r.stats?.everyMs ?? 5000);
        return { instance: r.instance, lastSeenAt: new Date(r.last_seen_ms).toISOString(), lastSeenMs: r.last_seen_ms, inFlight: alive ? r.in_flight : 0,
          concurrency: r.concurrency, alive, startedAt: new Date(r.started_ms).toISOString() };
      });
      const live = mine.filter((i) => i.alive);
      const liveness: Liveness = live.length ? "alive" : mine.length ? "dead" : "none";
      const lastSeenMs = Math.max(e.lastSeenMs ?? 0, ...mine.map((i) => i.lastSeenMs)) || null;
      return {
        name: e.name, kind: e.kind, maxInFlight: e.maxInFlight, lastSeenMs, lastSeenAt: iso(lastSeenMs),
        liveness, dead: liveness !== "alive", instances: live.length, inFlight: live.reduce((n, i) => n + i.inFlight, 0),
        instanceList: mine.map(({ lastSeenMs: _l, ...i }) => i),
      };
    });
  }

  /**
   * A run and what follows it: `final` once its chain will not go on (success, or an end with no
   * retry); `next` names the retry that replaced it, `retryPending` says one is scheduled.
   */
  async getRun(a: Record<string, unknown>): Promise<{ run: RunRow; final: boolean; next: string | null; retryPending: boolean }> {
    const id = a.run;
    if (typeof id !== "string" || !id.length || id.length > 128) throw new InvalidInputError("run", id, "required (a run id)");
    const run = await this.d.store.getRun(id);
    if (!run) throw new InvalidInputError("run", id, "no such run (runs are kept for the retention period)", "AX_E_NOT_FOUND");
    if (run.state === "running") return { run, final: false, next: null, retryPending: false };
    const r = await this.d.store.pool.query<{ id: string }>("select id from runs where task_id = $1 and caused_by = $2 and source = 'retry' order by created_ms limit 1", [run.taskId, run.id]);
    const next = r.rows[0]?.id ?? null;
    if (next) return { run, final: false, next, retryPending: false };
    if (run.state === "success" || run.state === "skipped") return { run, final: true, next: null, retryPending: false };
    const t = await this.d.store.pool.query<{ next_source: string | null; next_caused_by: string | null }>("select next_source, next_caused_by from tasks where id = $1", [run.taskId]);
    const pending = t.rows[0]?.next_source === "retry" && t.rows[0]?.next_caused_by === run.id;
    return { run, final: !pending, next: null, retryPending: pending };
  }

  private async cancel(a: Record<string, unknown>, who: string): Promise<{ run: string; instance: string; cancelled: true }> {
    const id = a.run;
    if (typeof id !== "string" || !id.length || id.length > 128) throw new InvalidInputError("run", id, "required (a run id)");
    const run = await this.d.store.getRun(id);
    if (!run) throw new InvalidInputError("run", id, "no such run", "AX_E_NOT_FOUND");
    if (run.state !== "running") throw new AxError("AX_E_CONFLICT", `run ${id} is not running (it ended ${run.state}${run.error ? `: ${run.error}` : ""})`, { field: "run", value: id });
    let reply;
    try {
      reply = await this.d.nc.request(this.d.names.executorCancelSubject(run.executor), encode({ runId: id, who }), { timeout: 3000 });
    } catch {
      throw new AxError("AX_E_CONFLICT", `run ${id} is not running on any live instance of executor ${run.executor} (not started yet, or its instance is gone); it ends at its timeout`, { field: "run", value: id });
    }
    const env = JSON.parse(new TextDecoder().decode(reply.data)) as { value?: { instance?: string } };
    return { run: id, instance: env.value?.instance ?? "?", cancelled: true };
  }
}
