/**
 * Compact in-memory encoding of idle task records, for shards holding many tasks.
 *
 * An idle record (nothing in flight) is stored as:
 * - a number when it has no `lastRunId` and no error that must be kept inline — state,
 *   overlap, attempt, maxAttempts and an interned `lastError` all fit one safe integer;
 * - otherwise one flat string `<head base36>.<runId length base36>.<runId><inline error>`.
 *
 * head = flags + 128 * (attempt + 2^16 * (maxAttempts + 2^16 * errorCode)), flags = state
 * index (3 bits) | overlap (1) | has runId (1) | error kind (2: none, inline, interned).
 * `lastError` strings up to 200 chars are interned in a process-wide append-only table
 * (at most 4096 entries; later ones are stored inline), so a shared message such as
 * "timed out" costs nothing per task.
 *
 * Packed values are valid only inside the process that made them (the error table is not
 * persisted): persist `TaskRecord` JSON, never packed values. `unpackIdle(packIdle(r))`
 * deep-equals `r` for every idle record.
 */
import { InvalidInputError } from "../../common/index.ts";
import { isTaskState } from "./apply.ts";
import { TASK_STATES, type TaskRecord } from "./types.ts";

export type PackedIdle = number | string;

const FLAG_SPAN = 128;
const COUNT_SPAN = 65_536;
const ERR_NONE = 0;
const ERR_INLINE = 1;
const ERR_INTERNED = 2;
const MAX_INTERNED = 4096;
const MAX_INTERNED_LENGTH = 200;

const STATE_INDEX = new Map(TASK_STATES.map((s, i) => [s, i] as const));
const errorTexts: string[] = [];
const errorCodes = new Map<string, number>();

function internError(text: string): number | undefined {
  const known = errorCodes.get(text);
  if (known !== undefined) return known;
  if (text.length > MAX_INTERNED_LENGTH || errorTexts.length >= MAX_INTERNED) return undefined;
  // Keep a fresh flat copy, never a slice that could pin a larger parent string.
  const own = JSON.parse(JSON.stringify(text)) as string;
  const code = errorTexts.length;
  errorTexts.push(own);
  errorCodes.set(own, code);
  return code;
}

/** Nothing in flight: the record can be kept packed. */
export function isIdle(record: TaskRecord): boolean {
  return record.context.inFlight.length === 0 && !record.context.pausedAfterRun;
}

export function packIdle(record: TaskRecord): PackedIdle {
  const c = record.context;
  if (!isIdle(record)) throw new InvalidInputError("record.context.inFlight", c.inFlight, "only an idle task (nothing in flight) can be packed");
  const state = STATE_INDEX.get(record.value);
  if (state === undefined) throw new InvalidInputError("record.value", record.value, "not a task state");
  if (!Number.isInteger(c.attempt) || c.attempt < 0 || c.attempt >= COUNT_SPAN) {
    throw new InvalidInputError("record.context.attempt", c.attempt, `must be an integer in 0..${COUNT_SPAN - 1} to pack`);
  }
  if (!Number.isInteger(c.maxAttempts) || c.maxAttempts < 1 || c.maxAttempts >= COUNT_SPAN) {
    throw new InvalidInputError("record.context.maxAttempts", c.maxAttempts, `must be an integer in 1..${COUNT_SPAN - 1} to pack`);
  }
  let errKind = ERR_NONE;
  let errCode = 0;
  if (c.lastError !== null) {
    const code = internError(c.lastError);
    if (code === undefined) errKind = ERR_INLINE;
    else {
      errKind = ERR_INTERNED;
      errCode = code;
    }
  }
  const hasRunId = c.lastRunId !== null;
  const flags = state | (c.overlap === "allow" ? 8 : 0) | (hasRunId ? 16 : 0) | (errKind << 5);
  const head = flags + FLAG_SPAN * (c.attempt + COUNT_SPAN * (c.maxAttempts + COUNT_SPAN * errCode));
  if (!hasRunId && errKind !== ERR_INLINE) return head;
  const runId = c.lastRunId ?? "";
  // join() builds one flat string (a `+` chain would keep a rope of the parts alive).
  return [head.toString(36), ".", runId.length.toString(36), ".", runId, errKind === ERR_INLINE ? (c.lastError ?? "") : ""].join("");
}

export function unpackIdle(packed: PackedIdle): TaskRecord {
  let head: number;
  let runId: string | null = null;
  let inline = "";
  if (typeof packed === "number") {
    head = packed;
  } else {
    const a = packed.indexOf(".");
    const b = a < 0 ? -1 : packed.indexOf(".", a + 1);
    if (b < 0) throw new InvalidInputError("packed", packed, "not a packed idle task");
    head = parseInt(packed.slice(0, a), 36);
    const len = parseInt(packed.slice(a + 1, b), 36);
    runId = packed.slice(b + 1, b + 1 + len);
    inline = packed.slice(b + 1 + len);
  }
  if (!Number.isSafeInteger(head) || head < 0) throw new InvalidInputError("packed", packed, "not a packed idle task");
  const flags = head % FLAG_SPAN;
  let rest = Math.floor(head / FLAG_SPAN);
  const attempt = rest % COUNT_SPAN;
  rest = Math.floor(rest / COUNT_SPAN);
  const maxAttempts = rest % COUNT_SPAN;
  const errCode = Math.floor(rest / COUNT_SPAN);
  const value = TASK_STATES[flags & 7];
  const errKind = flags >> 5;
  let lastError: string | null = null;
  if (errKind === ERR_INLINE) lastError = inline;
  else if (errKind === ERR_INTERNED) {
    const text = errorTexts[errCode];
    if (text === undefined) throw new InvalidInputError("packed", packed, "unknown interned error (packed in another process?)");
    lastError = text;
  }
  if (value === undefined || !isTaskState(value) || maxAttempts < 1) throw new InvalidInputError("packed", packed, "not a packed idle task");
  return {
    value,
    context: {
      attempt,
      maxAttempts,
      overlap: flags & 8 ? "allow" : "forbid",
      inFlight: [],
      lastRunId: flags & 16 ? runId ?? "" : null,
      lastError,
      pausedAfterRun: false,
    },
  };
}
