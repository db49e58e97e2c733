/**
 * Triggers: when a task's runs are due. Specs are plain data (stored, sent over NATS);
 * compiled triggers compute slots; planAfter decides what to run after a gap.
 */
export type { TriggerSpec, TriggerKind, CompiledTrigger, MisfirePolicy, Plan, DstGap, DstRepeat } from "./types.ts";
export { parseTrigger, type TriggerInput } from "./parse.ts";
export { isoUtc } from "./civil.ts";
export { compileTrigger, preview, previewMarks, MAX_TRIGGER_DURATION_MS, MAX_PREVIEW, type PreviewMark } from "./compile.ts";
export { planAfter, CRON_MISSED_COUNT_LIMIT, MAX_CATCH_UP_LIMIT } from "./plan.ts";
export {
  parseScheduleOptions, withScheduleOptions, describeOptions, scheduleOptionsOf, jitterFor, windowed, runsKey, runsTaken, scheduleEnded, planNowOf, shapePointer,
  parseCalendarDates, parseCalendarZone, dateInZone, zoneOfSpec, exclusionOf, CALENDAR_NAME_RE, MAX_JITTER_MS, MAX_RUNS_LIMIT, MAX_CALENDAR_DATES,
  type ScheduleOptions, type ScheduleOptionsInput, type SpecWithOptions, type Calendar,
} from "./options.ts";
export {
  slotsBetween, lastSlotAtOrBefore, forecastDues, bucketize, whatIfDown, TooManySlotsError, MAX_LISTED_SLOTS, PER_MS,
  type ForecastTrigger, type ForecastPer, type WhatIf,
} from "./forecast.ts";
