export { Store, findCycle, type StoreOptions } from "./store.ts";
export { DueIndex } from "./dueIndex.ts";
export { LATEST_SCHEMA_VERSION } from "./schema.ts";
export type {
  TaskRow, NewTask, BulkNewTask, BulkCreated, RunRow, RunInsert, RunUpdate, TaskUpdate, ShardWrite, ShardRow, TriggerRow, DispatchRecord,
  MisfirePolicy, OverlapPolicy, RunSource, RunState,
} from "./types.ts";
export { putCalendar, listCalendars, loadCalendars, removeCalendar, tasksUsingCalendar, backfilledSlots, type CalendarRow } from "./calendars.ts";
