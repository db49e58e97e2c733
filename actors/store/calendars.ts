import type { Pool } from "pg";
import { AxError, InvalidInputError } from "../../common/index.ts";
import type { Calendar } from "../triggers/index.ts";

/**
 * Named calendars of excluded dates (migration 12) and the backfill-run lookup. Functions of the
 * namespace's pool (its search_path is the namespace's schema), kept apart from Store.
 */
export interface CalendarRow extends Calendar { createdMs: number; updatedMs: number }

const rowOf = (r: Record<string, unknown>): CalendarRow => ({
  name: r.name as string, tz: (r.tz as string | null) ?? null, dates: (r.dates as string[]) ?? [],
  createdMs: Number(r.created_ms), updatedMs: Number(r.updated_ms),
});

/** Creates a calendar; an existing one is refused (AX_E_CONFLICT) unless `replace`. */
export async function putCalendar(pool: Pool, cal: Calendar, nowMs: number, replace: boolean): Promise<{ row: CalendarRow; replaced: boolean }> {
  const r = await pool.query(
    `insert into calendars (name, tz, dates, created_ms, updated_ms) values ($1, $2, $3, $4, $4)
     on conflict (name) do ${replace ? "update set tz = excluded.tz, dates = excluded.dates, updated_ms = excluded.updated_ms" : "nothing"}
     returning *, (xmax <> 0) as replaced`,
    [cal.name, cal.tz, JSON.stringify(cal.dates), nowMs]);
  if (!r.rows.length) throw new InvalidInputError("name", cal.name, "a calendar with this name exists (use --replace to change it)", "AX_E_CONFLICT");
  return { row: rowOf(r.rows[0]), replaced: r.rows[0].replaced === true };
}

export async function listCalendars(pool: Pool): Promise<CalendarRow[]> {
  return (await pool.query("select * from calendars order by name")).rows.map(rowOf);
}

export async function loadCalendars(pool: Pool, names: string[]): Promise<CalendarRow[]> {
  if (!names.length) return [];
  return (await pool.query("select * from calendars where name = any($1::text[])", [names])).rows.map(rowOf);
}

/** Names of tasks whose triggers exclude this calendar (at most `limit`). */
export async function tasksUsingCalendar(pool: Pool, name: string, limit = 20): Promise<string[]> {
  const r = await pool.query(
    `select distinct t.name from tasks t join task_triggers tt on tt.task_id = t.id join triggers tr on tr.id = tt.trigger_id
     where tr.spec -> 'sched' ->> 'calendar' = $1 order by t.name limit $2`, [name, limit]);
  return r.rows.map((x) => x.name as string);
}

/** Removes a calendar no task uses (one in use is refused, naming the tasks). */
export async function removeCalendar(pool: Pool, name: string): Promise<void> {
  const users = await tasksUsingCalendar(pool, name);
  if (users.length) throw new AxError("AX_E_CONFLICT", `calendar ${name} is used by task(s) ${users.join(", ")}: remove or change those first`, { field: "name", value: name });
  const r = await pool.query("delete from calendars where name = $1", [name]);
  if (!r.rowCount) throw new InvalidInputError("name", name, "no such calendar", "AX_E_NOT_FOUND");
}

/** Slots of the task already backfilled in [fromMs, toMs] (whatever their state). */
export async function backfilledSlots(pool: Pool, taskId: number, fromMs: number, toMs: number): Promise<Set<number>> {
  const r = await pool.query("select slot_ms from runs where task_id = $1 and source = 'backfill' and slot_ms between $2 and $3", [taskId, fromMs, toMs]);
  return new Set(r.rows.map((x) => Number(x.slot_ms)));
}
