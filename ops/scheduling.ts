import { AxError, InvalidInputError, formatDuration, type Clock } from "../common/index.ts";
import {
  CALENDAR_NAME_RE, MAX_LISTED_SLOTS, bucketize, compileTrigger, exclusionOf, forecastDues, parseCalendarDates, parseCalendarZone, parseScheduleOptions,
  runsTaken, scheduleOptionsOf, slotsBetween, whatIfDown, withScheduleOptions, zoneOfSpec,
  type Calendar, type CompiledTrigger, type ForecastPer, type ForecastTrigger, type TriggerSpec,
} from "../actors/triggers/index.ts";
import { parseIsoInstant } from "../actors/triggers/parse.ts";
import {
  backfilledSlots, listCalendars, loadCalendars, putCalendar, removeCalendar, type CalendarRow, type Store, type TaskRow,
} from "../actors/store/index.ts";
import type { CommandReply, ShardCommand } from "../actors/index.ts";

/**
 * The API side of jitter, windows, max runs, calendars, backfill and forecast (issue 13 items 7
 * and 8; docs/TRIGGERS.md). The arithmetic is actors/triggers'; this module reads and writes the
 * store and talks to the shards.
 */

const iso = (ms: number) => new Date(ms).toISOString();
const given = (v: unknown): boolean => v !== undefined && v !== null && v !== "";

/** Most slots one backfill takes (a larger window is refused: split it). */
export const MAX_BACKFILL_SLOTS = 10_000;
/** Longest forecast window. */
export const MAX_FORECAST_WINDOW_MS = 31 * 86_400_000;
/** A backfill waits this long at most for one slot (its task's run in flight, its executor full) before it gives up. */
const BACKFILL_SLOT_PATIENCE_MS = 10 * 60_000;

const OPTION_FIELDS = ["jitter", "start", "end", "maxRuns", "excludeCalendar"] as const;

/**
 * The spec to store for a new task: its trigger plus the options given (`jitter`, `start`,
 * `end`, `maxRuns`, `excludeCalendar`). Options without a trigger are refused.
 */
export function specWithOptions(a: Record<string, unknown>, spec: TriggerSpec | null, nowMs: number): TriggerSpec | null {
  if (!spec) {
    for (const f of OPTION_FIELDS) if (given(a[f])) throw new InvalidInputError(f, a[f], "only with a trigger (--cron, --every, --fixed-delay, --at or --delay)");
    return null;
  }
  // Named loads, not a loop over OPTION_FIELDS: `a[f]` with a varying key is a megamorphic load,
  // ~0.15 µs each, on every task a bulk create parses.
  if (!given(a.jitter) && !given(a.start) && !given(a.end) && !given(a.maxRuns) && !given(a.excludeCalendar)) return spec;
  const o = parseScheduleOptions({ jitter: a.jitter, start: a.start, end: a.end, maxRuns: a.maxRuns, excludeCalendar: a.excludeCalendar }, spec, compileTrigger(spec), nowMs);
  return withScheduleOptions(spec, o) as TriggerSpec;
}

/** Refuses specs naming a calendar that does not exist (one query for all of them). */
export async function checkCalendarsExist(store: Store, specs: Array<TriggerSpec | null | undefined>, field = "excludeCalendar"): Promise<void> {
  const names = new Set<string>();
  for (const s of specs) { const c = s ? scheduleOptionsOf(s)?.calendar : undefined; if (c) names.add(c); }
  if (!names.size) return;
  const found = new Set((await loadCalendars(store.pool, [...names])).map((c) => c.name));
  for (const n of names) if (!found.has(n)) throw new InvalidInputError(field, n, "no such calendar (ax calendar create NAME --dates ...)", "AX_E_NOT_FOUND");
}

function instantArg(field: string, v: unknown): number {
  if (typeof v === "number" && Number.isSafeInteger(v)) return v;
  if (!given(v)) throw new InvalidInputError(field, v, "required (an ISO-8601 time such as 2026-12-01T00:00:00Z)");
  return parseIsoInstant(field, v);
}

function publicCalendar(c: CalendarRow) {
  return { name: c.name, tz: c.tz, dates: c.dates, createdAt: iso(c.createdMs), updatedAt: iso(c.updatedMs) };
}

export interface SchedulingDeps {
  store: Store;
  clock: Clock;
  /** A command to the owner of a shard (retried by the API while the shard has no owner). */
  shardCommand: (shard: number, cmd: ShardCommand) => Promise<CommandReply>;
  /** Where a background backfill reports how it ended. */
  log?: (msg: string, fields: Record<string, unknown>) => void;
}

interface BackfillSlot { slotMs: number; triggerId: number; status: "new" | "exists" | "excluded"; reason?: string }

export class SchedulingOps {
  /** Backfills running on this node, by id. */
  readonly jobs = new Map<string, { task: string; total: number; done: number; existed: number; failed: string | null; finished: boolean }>();
  private seq = 0;
  constructor(private readonly d: SchedulingDeps) {}

  // ---- calendars -------------------------------------------------------------------------------

  async calendarCreate(a: Record<string, unknown>): Promise<unknown> {
    const name = a.name;
    if (typeof name !== "string" || !CALENDAR_NAME_RE.test(name)) throw new InvalidInputError("name", name, "use letters, digits, '.', '_' or '-' (at most 64)");
    const cal: Calendar = { name, tz: parseCalendarZone(a.tz), dates: parseCalendarDates("dates", a.dates) };
    const { row, replaced } = await putCalendar(this.d.store.pool, cal, this.d.clock.now(), a.replace === true);
    return { ...publicCalendar(row), replaced };
  }

  async calendarLs(): Promise<unknown> {
    return (await listCalendars(this.d.store.pool)).map((c) => ({ ...publicCalendar(c), dates: c.dates.length }));
  }

  async calendarShow(a: Record<string, unknown>): Promise<unknown> {
    const name = String(a.name ?? "");
    const [c] = await loadCalendars(this.d.store.pool, [name]);
    if (!c) throw new InvalidInputError("name", name, "no such calendar", "AX_E_NOT_FOUND");
    return publicCalendar(c);
  }

  async calendarRm(a: Record<string, unknown>): Promise<unknown> {
    const name = String(a.name ?? "");
    await removeCalendar(this.d.store.pool, name);
    return { removed: name };
  }

  // ---- backfill --------------------------------------------------------------------------------

  /**
   * `task.backfill { task, from, to, dryRun?, rate? }`: one run (source=backfill) for every slot
   * of the task's triggers in [from, to] not on an excluded date and not backfilled before. A
   * dry run lists them. Otherwise the runs are sent to the task's shard in the background, at
   * most `rate` a second (default 10), and the call answers at once with what it started.
   */
  async backfill(task: TaskRow, a: Record<string, unknown>): Promise<unknown> {
    const now = this.d.clock.now();
    const fromMs = instantArg("from", a.from);
    const toMs = instantArg("to", a.to);
    if (toMs < fromMs) throw new InvalidInputError("to", a.to, "must not be before from");
    if (toMs > now) throw new InvalidInputError("to", a.to, `is in the future (now ${iso(now)}): the schedule fires those slots itself`);
    const rate = a.rate === undefined || a.rate === null ? 10 : typeof a.rate === "string" ? Number(a.rate) : a.rate;
    if (typeof rate !== "number" || !Number.isFinite(rate) || rate <= 0 || rate > 1000) throw new InvalidInputError("rate", a.rate, "must be a number of runs per second, above 0 and at most 1000");
    const triggers = task.triggers.filter((tr) => tr.enabled && tr.kind !== "fixed_delay");
    if (!triggers.length) throw new InvalidInputError("task", task.name, "has no trigger with slots of its own to backfill (fixed-delay and dependency-only tasks have none)", "AX_E_CONFLICT");
    const bySlot = new Map<number, BackfillSlot>();
    const cals = await this.calendarsOf(triggers.map((tr) => tr.spec));
    for (const tr of triggers) {
      const c = compileTrigger(tr.spec as TriggerSpec);
      const cal = calendarOf(tr.spec, cals);
      for (const s of slotsBetween(c, fromMs, toMs, MAX_BACKFILL_SLOTS + 1, "to")) {
        if (bySlot.has(s)) continue;
        const ex = cal ? exclusionOf(s, zoneOfSpec(tr.spec), cal) : null;
        bySlot.set(s, ex ? { slotMs: s, triggerId: tr.id, status: "excluded", reason: ex } : { slotMs: s, triggerId: tr.id, status: "new" });
      }
    }
    if (bySlot.size > MAX_BACKFILL_SLOTS) throw new InvalidInputError("to", a.to, `the window holds more than ${MAX_BACKFILL_SLOTS} slots; split it`);
    const done = await backfilledSlots(this.d.store.pool, task.id, fromMs, toMs);
    const slots = [...bySlot.values()].sort((x, y) => x.slotMs - y.slotMs);
    for (const s of slots) if (s.status === "new" && done.has(s.slotMs)) s.status = "exists";
    const fresh = slots.filter((s) => s.status === "new");
    const summary = {
      task: task.name, from: iso(fromMs), to: iso(toMs), rate, slots: slots.length, toRun: fresh.length,
      alreadyBackfilled: slots.filter((s) => s.status === "exists").length, excluded: slots.filter((s) => s.status === "excluded").length,
    };
    if (a.dryRun === true) {
      return { ...summary, dryRun: true, list: slots.map((s) => ({ slot: iso(s.slotMs), status: s.status, ...(s.reason ? { reason: s.reason } : {}) })) };
    }
    const jobId = `bf-${task.id}-${now.toString(36)}-${++this.seq}`;
    if (fresh.length) void this.runBackfill(jobId, task, fresh, rate, fromMs, toMs);
    return { ...summary, dryRun: false, job: fresh.length ? jobId : null };
  }

  private async runBackfill(jobId: string, task: TaskRow, slots: BackfillSlot[], rate: number, fromMs: number, toMs: number): Promise<void> {
    const job = { task: task.name, total: slots.length, done: 0, existed: 0, failed: null as string | null, finished: false };
    this.jobs.set(jobId, job);
    const interval = 1000 / rate;
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
    try {
      let next = Date.now();
      for (const s of slots) {
        const started = Date.now();
        for (;;) {
          const wait = next - Date.now();
          if (wait > 0) await sleep(wait);
          next = Date.now() + interval;
          const r = await this.d.shardCommand(task.shard, {
            type: "backfill", taskId: task.id, triggerId: s.triggerId, slotMs: s.slotMs,
            reason: `backfill of the slot ${iso(s.slotMs)} (ax task backfill ${task.name} --from ${iso(fromMs)} --to ${iso(toMs)}, job ${jobId})`,
          }).catch((e: unknown) => ({ ok: false as const, error: (e instanceof AxError ? e : new AxError("AX_E_UNAVAILABLE", String(e))).toJSON() }));
          if (r.ok) { if ((r.value as { existed?: boolean } | undefined)?.existed) job.existed++; else job.done++; break; }
          // Its previous run still in flight (overlap=forbid), its executor full, its shard moving: wait, then the same slot again.
          const transient = r.error.code === "AX_E_TASK_RUNNING" || r.error.code === "AX_E_UNAVAILABLE" || r.error.code === "AX_E_TIMEOUT";
          if (!transient || Date.now() - started > BACKFILL_SLOT_PATIENCE_MS) throw new AxError(r.error.code, `slot ${iso(s.slotMs)}: ${r.error.message}`);
          next = Math.max(next, Date.now() + 200);
        }
      }
    } catch (e) {
      job.failed = e instanceof Error ? e.message : String(e);
      this.d.log?.("backfill stopped; run the same command again to go on (slots done are not repeated)", { job: jobId, task: task.name, err: job.failed, done: job.done });
    } finally {
      job.finished = true;
      this.d.log?.("backfill ended", { job: jobId, task: task.name, done: job.done, existed: job.existed, total: job.total, failed: job.failed });
    }
  }

  // ---- forecast --------------------------------------------------------------------------------

  /**
   * `forecast { from?, to?, executor?, per?, downFrom?, downTo? }`. Without downFrom/downTo: the
   * runs every task (or the executor's) will fire in [from, to), per minute or hour, and the peak.
   * With them: what each task would catch up if the cluster were down from downFrom to downTo.
   */
  async forecast(a: Record<string, unknown>): Promise<unknown> {
    const now = this.d.clock.now();
    const executor = given(a.executor) ? String(a.executor) : null;
    const whatIf = given(a.downFrom) || given(a.downTo);
    const tasks: TaskRow[] = [];
    for (let after = 0; ;) {
      const page = await this.d.store.listTasks({ limit: 10_000, afterId: after });
      for (const t of page) if ((!executor || t.executor === executor) && t.state !== "paused" && t.state !== "cancelled") tasks.push(t);
      if (page.length < 10_000) break;
      after = page[page.length - 1]!.id;
    }
    const cals = await this.calendarsOf(tasks.flatMap((t) => t.triggers.map((tr) => tr.spec)));
    const notForecast: Array<{ task: string; why: string }> = [];
    const entries: Array<{ task: TaskRow; f: ForecastTrigger }> = [];
    for (const t of tasks) {
      const trs = t.triggers.filter((tr) => tr.enabled);
      if (!trs.length) { notForecast.push({ task: t.name, why: "no trigger: runs after its upstreams" }); continue; }
      for (const tr of trs) {
        if (tr.kind === "fixed_delay" && !whatIf) { notForecast.push({ task: t.name, why: "fixed delay: its slots follow run completions" }); continue; }
        let compiled: CompiledTrigger;
        try { compiled = compileTrigger(tr.spec as TriggerSpec); } catch (e) { notForecast.push({ task: t.name, why: `trigger cannot be read: ${(e as Error).message}` }); continue; }
        entries.push({ task: t, f: {
          task: t.name, triggerId: tr.id, spec: tr.spec as TriggerSpec, compiled, options: scheduleOptionsOf(tr.spec), calendar: calendarOf(tr.spec, cals),
          taken: runsTaken(t.triggerSlots, tr.id), lastSlotMs: t.triggerSlots[String(tr.id)] ?? null, createdMs: t.createdMs,
        } });
      }
    }
    const notes = { notForecast: notForecast.slice(0, 50), notForecastCount: notForecast.length };
    if (whatIf) {
      const downFrom = instantArg("downFrom", a.downFrom);
      const downTo = instantArg("downTo", a.downTo);
      if (downTo <= downFrom) throw new InvalidInputError("downTo", a.downTo, "must be after downFrom");
      const rows: Array<{ task: string; executor: string; misfire: string; missed: number; catchUpRuns: number; excluded: number; firstSlot: string | null; lastSlot: string | null }> = [];
      for (const { task, f } of entries) {
        const w = whatIfDown(f, task.misfire, downFrom, downTo);
        if (!w.missed && !w.catchUp.length) continue;
        rows.push({ task: task.name, executor: task.executor, misfire: task.misfire, missed: w.missed, catchUpRuns: w.catchUp.length, excluded: w.excluded,
          firstSlot: w.catchUp.length ? iso(w.catchUp[0]!) : null, lastSlot: w.catchUp.length ? iso(w.catchUp[w.catchUp.length - 1]!) : null });
      }
      rows.sort((x, y) => y.catchUpRuns - x.catchUpRuns || x.task.localeCompare(y.task));
      return {
        downFrom: iso(downFrom), downTo: iso(downTo), executor, tasksConsidered: tasks.length, tasksCatchingUp: rows.filter((r) => r.catchUpRuns > 0).length,
        missed: rows.reduce((n, r) => n + r.missed, 0), catchUpRuns: rows.reduce((n, r) => n + r.catchUpRuns, 0), tasks: rows, ...notes,
      };
    }
    const fromMs = given(a.from) ? instantArg("from", a.from) : now;
    const toMs = given(a.to) ? instantArg("to", a.to) : fromMs + 3_600_000;
    if (toMs <= fromMs) throw new InvalidInputError("to", a.to, "must be after from");
    if (toMs - fromMs > MAX_FORECAST_WINDOW_MS) throw new InvalidInputError("to", a.to, `the window is longer than ${formatDuration(MAX_FORECAST_WINDOW_MS)}`);
    const per = (a.per ?? "minute") as ForecastPer;
    if (per !== "minute" && per !== "hour") throw new InvalidInputError("per", a.per, "must be minute or hour");
    const budget = { left: MAX_LISTED_SLOTS };
    const dues: number[] = [];
    for (const { f } of entries) for (const d of forecastDues(f, fromMs, toMs, budget)) dues.push(d);
    const b = bucketize(dues, per);
    return {
      from: iso(fromMs), to: iso(toMs), per, executor, tasks: new Set(entries.map((e) => e.task.id)).size, total: b.total,
      peak: b.peak ? { at: iso(b.peak.atMs), fires: b.peak.fires } : null,
      buckets: b.buckets.map((x) => ({ at: iso(x.atMs), fires: x.fires })), ...notes,
    };
  }

  private async calendarsOf(specs: unknown[]): Promise<Map<string, Calendar>> {
    const names = new Set<string>();
    for (const s of specs) { const c = scheduleOptionsOf(s)?.calendar; if (c) names.add(c); }
    return new Map((await loadCalendars(this.d.store.pool, [...names])).map((c) => [c.name, c]));
  }
}

function calendarOf(spec: unknown, cals: Map<string, Calendar>): Calendar | null {
  const n = scheduleOptionsOf(spec)?.calendar;
  return n ? cals.get(n) ?? null : null;
}
