export { IDLE_IN_TRANSACTION_MS, Store, type StoreOptions } from "./store.ts";
export { findCycle } from "./graph.ts";
export { refusedForData } from "./fencedWrite.ts";
export type { BrowseReads, TaskFilter } from "./browseReads.ts";
export type { AlertHooks, AlertHookRow } from "./alertHooks.ts";
export { DueIndex, type TakenDue } from "./dueIndex.ts";
export { copySlots, editSlots, slotsFromText, withSlot, type TriggerSlots } from "./slots.ts";
export type { Edge, Downstream, EdgeTransaction, LostOutcome } from "./edges.ts";
export type { AuditRow, AuditTrail } from "./audit.ts";
export type { HistoryRow, TaskHistory } from "./history.ts";
export type { ExecutorRow } from "./clusterMeta.ts";
export { LATEST_SCHEMA_VERSION, SCHEMA_VERSIONS } from "./schema.ts";
export type {
  TaskRow, NewTask, BulkNewTask, BulkCreated, RunRow, RunInsert, RunUpdate, TaskUpdate, TaskDefUpdate, ShardWrite, ShardRow, TriggerRow, DispatchRecord,
  MisfirePolicy, OverlapPolicy, RunSource, RunState,
} from "./types.ts";
export { LedgerStore, type LedgerInsert, type LedgerRow, type NonRunReason } from "./ledgerStore.ts";
export { putCalendar, listCalendars, loadCalendars, removeCalendar, tasksUsingCalendar, backfilledSlots, type CalendarRow } from "./calendars.ts";
