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
export interface RunOpsDeps {
  store: Store; nc: NatsConnection; names: Names; clock: Clock;
  /** The node's AX_MAX_IN_FLIGHT, the limit of an executor that registered none (null: not known here). */
  defaultMaxInFlight: number | null;
}

/** An instance is live while its last heartbeat is younger than this many of its periods. */
const MISSED_BEATS = 3;
/** Instance rows older than this are forgotten (a dead instance stays visible this long). */
const FORGET_INSTANCE_MS = 3_600_000;
const NAME_RE = /^[A-Za-z0-9_-]{1,64}$/;

export type Liveness = "alive" | "dead" | "none";
export interface ExecutorView {
  name: string; kind: string;
  /** The limit of runs in flight per node that applies: its own, or else the node's (null: neither known). */
  maxInFlight: number | null;
  /** Whether that limit is the executor's own (registered) or the node's AX_MAX_IN_FLIGHT. */
  maxInFlightFrom: "executor" | "node";
  lastSeenMs: number | null; lastSeenAt: string | null;
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
    const runs = await this.d.store.runStates(want.map((w) => w.runId));
    const tasks = await this.d.store.taskGenerations(want.map((w) => w.taskId));
    const ended = want.filter((w) => runs.get(w.runId) && runs.get(w.runId)!.state !== "running");
    const retries = ended.length ? await this.d.store.firstCausedBy(ended.map((w) => w.taskId), ended.map((w) => w.runId)) : new Map<string, string>();
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
    const instances = this.d.store.executorInstances;
    if (a.stopping === true) {
      await instances.gone(executor, instance, now);
    } else {
      const stats = { everyMs: num(a.everyMs, 100, 3_600_000) ?? 5000, kind: a.kind === "http" ? "http" : "nats", counters: a.stats ?? null };
      await instances.beat({ executor, instance, startedMs: num(a.startedMs, 0, Number.MAX_SAFE_INTEGER) ?? now, nowMs: now,
        inFlight: num(a.inFlight, 0, 10_000_000) ?? 0, concurrency: num(a.concurrency, 1, 10_000_000), stats });
    }
    return { ok: true };
  }

  /** Every registered executor with its instances' liveness (a dead executor is flagged). */
  async executorLiveness(): Promise<ExecutorView[]> {
    const now = this.d.clock.now();
    await this.d.store.executorInstances.forgetOlderThan(now - FORGET_INSTANCE_MS).catch(() => undefined);
    const execs = await this.d.store.listExecutors();
    const rows = await this.d.store.executorInstances.list();
    return execs.map((e) => {
      const mine = rows.filter((r) => r.executor === e.name).map((r) => {
        const alive = now - r.lastSeenMs <= MISSED_BEATS * (r.stats?.everyMs ?? 5000);
        return { instance: r.instance, lastSeenAt: new Date(r.lastSeenMs).toISOString(), lastSeenMs: r.lastSeenMs, inFlight: alive ? r.inFlight : 0,
          concurrency: r.concurrency, alive, startedAt: new Date(r.startedMs).toISOString() };
      });
      const live = mine.filter((i) => i.alive);
      const liveness: Liveness = live.length ? "alive" : mine.length ? "dead" : "none";
      const lastSeenMs = Math.max(e.lastSeenMs ?? 0, ...mine.map((i) => i.lastSeenMs)) || null;
      return {
        name: e.name, kind: e.kind, maxInFlight: e.maxInFlight ?? this.d.defaultMaxInFlight, maxInFlightFrom: e.maxInFlight === null ? "node" : "executor",
        lastSeenMs, lastSeenAt: iso(lastSeenMs),
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
    const next = await this.d.store.retryOf(run.taskId, run.id);
    if (next) return { run, final: false, next, retryPending: false };
    if (run.state === "success" || run.state === "skipped") return { run, final: true, next: null, retryPending: false };
    const task = await this.d.store.getTask(run.taskId);
    const pending = task?.nextSource === "retry" && task.nextCausedBy === run.id;
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
