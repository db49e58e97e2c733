export { Store, findCycle, type StoreOptions } from "./store.ts";
export { DueIndex } from "./dueIndex.ts";
export { LATEST_SCHEMA_VERSION, SCHEMA_VERSIONS } from "./schema.ts";
export type {
  TaskRow, NewTask, BulkNewTask, BulkCreated, RunRow, RunInsert, RunUpdate, TaskUpdate, ShardWrite, ShardRow, TriggerRow, DispatchRecord,
  MisfirePolicy, OverlapPolicy, RunSource, RunState,
} from "./types.ts";
export { LedgerStore, type LedgerInsert, type LedgerRow, type NonRunReason } from "./ledgerStore.ts";
