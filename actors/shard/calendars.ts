import type { Clock } from "../../common/index.ts";
import { exclusionOf, scheduleOptionsOf, zoneOfSpec, type Calendar } from "../triggers/index.ts";
import type { TaskRow } from "../store/index.ts";

/**
 * The calendars a shard's due tasks name, read from PostgreSQL at most once a second per
 * calendar (so a changed calendar applies to the slots decided after it, within a second).
 * Tasks without a calendar cost nothing: no query is made for them.
 */
export class CalendarCache {
  private readonly cals = new Map<string, { cal: Calendar | null; at: number }>();
  constructor(private readonly load: (names: string[]) => Promise<Calendar[]>, private readonly clock: Clock, private readonly ttlMs = 1000) {}

  /** Loads (again, if older than the TTL) the calendars these tasks' triggers name. */
  async ensure(rows: Iterable<TaskRow | undefined>): Promise<void> {
    const now = this.clock.monotonic();
    const want = new Set<string>();
    for (const row of rows) {
      if (!row) continue;
      for (const tr of row.triggers) {
        const name = scheduleOptionsOf(tr.spec)?.calendar;
        if (!name) continue;
        const c = this.cals.get(name);
        if (!c || now - c.at >= this.ttlMs) want.add(name);
      }
    }
    if (!want.size) return;
    const found = new Map((await this.load([...want])).map((c) => [c.name, c]));
    for (const name of want) this.cals.set(name, { cal: found.get(name) ?? null, at: now });
  }

  /**
   * Why this slot of the task is excluded by its trigger's calendar (null: it is not, or the
   * calendar is unknown — a removed calendar excludes nothing).
   */
  exclusion(row: TaskRow, triggerId: number | null, slotMs: number | null): string | null {
    if (triggerId === null || slotMs === null) return null;
    const tr = row.triggers.find((t) => t.id === triggerId);
    const name = tr ? scheduleOptionsOf(tr.spec)?.calendar : undefined;
    const cal = name ? this.cals.get(name)?.cal : null;
    return cal && tr ? exclusionOf(slotMs, zoneOfSpec(tr.spec), cal) : null;
  }
}
