/**
 * Triggers: when a task's runs are due. Specs are plain data (stored, sent over NATS);
 * compiled triggers compute slots; planAfter decides what to run after a gap.
 */
export type { TriggerSpec, TriggerKind, CompiledTrigger, MisfirePolicy, Plan, DstGap, DstRepeat } from "./types.ts";
export { parseTrigger, type TriggerInput } from "./parse.ts";
export { compileTrigger, preview, previewMarks, MAX_TRIGGER_DURATION_MS, MAX_PREVIEW, type PreviewMark } from "./compile.ts";
export { planAfter, CRON_MISSED_COUNT_LIMIT, MAX_CATCH_UP_LIMIT } from "./plan.ts";
