/**
 * A task's trigger slots (`tasks.trigger_slots`) as the engine holds them: a flat object of
 * numbers whose keys name the task's own triggers ("<trigger id>" the last slot, "w:<id>" the
 * ledger's watermark, "n:<id>" runs taken, "w:paused").
 *
 * Almost every task has keys no other task has. An ordinary object with such a key (a literal
 * `{ ...slots, [key]: v }`, or JSON.parse of the column) makes V8 build a hidden class for that
 * one object: one per task and per change, and each such object then takes the slow path of
 * every lookup and of JSON.stringify. So slot objects are dictionary-mode objects (made with
 * `Object.create(null)`, which keeps its properties in a hash table from the start), created and
 * copied only here. Measured on 200k task updates of one-shot tasks: serialising the fenced
 * write's task rows took 2.3 µs a row with per-task hidden classes and 0.95 µs with these.
 *
 * The objects are never mutated once given to a row (rounds compare slots by reference, see
 * actors/shard/types.ts): every change goes through withSlot/editSlots and yields a new one.
 */
export type TriggerSlots = Readonly<Record<string, number>>;

function dict(): Record<string, number> { return Object.create(null) as Record<string, number>; }

/** A copy of `slots` (any object: a row read elsewhere, a test's literal) as a dictionary-mode object. */
export function copySlots(slots: TriggerSlots | null | undefined): Record<string, number> {
  const out = dict();
  if (slots) for (const k of Object.keys(slots)) out[k] = slots[k]!;
  return out;
}

/** A copy with `key` set to `value`, or removed when `value` is undefined. */
export function withSlot(slots: TriggerSlots, key: string, value: number | undefined): Record<string, number> {
  const out = copySlots(slots);
  if (value === undefined) delete out[key]; else out[key] = value;
  return out;
}

/** A copy changed by `edit` (several keys at once, one copy). */
export function editSlots(slots: TriggerSlots, edit: (s: Record<string, number>) => void): Record<string, number> {
  const out = copySlots(slots);
  edit(out);
  return out;
}

const NUMBER_RE = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$/;

/**
 * The column as PostgreSQL prints it (`trigger_slots::text`), read without JSON.parse (which
 * would give every row its own hidden class). jsonb prints a flat object as
 * `{"k": 1, "k2": 2}`: keys without escapes are read here directly; anything else (an escaped
 * key, a value that is not a plain number, another layout) takes JSON.parse and is copied.
 */
export function slotsFromText(text: string | null | undefined): Record<string, number> {
  if (text === null || text === undefined || text === "{}") return dict();
  const n = text.length;
  if (text.charCodeAt(0) !== 123 /* { */ || text.charCodeAt(n - 1) !== 125 /* } */) return slotsFromJson(text);
  const out = dict();
  let i = 1;
  for (;;) {
    if (text.charCodeAt(i) !== 34 /* " */) return slotsFromJson(text);
    const keyEnd = text.indexOf('"', i + 1);
    if (keyEnd < 0) return slotsFromJson(text);
    const key = text.slice(i + 1, keyEnd);
    if (key.includes("\\")) return slotsFromJson(text);
    if (text.charCodeAt(keyEnd + 1) !== 58 /* : */ || text.charCodeAt(keyEnd + 2) !== 32) return slotsFromJson(text);
    let end = keyEnd + 3;
    while (end < n && text.charCodeAt(end) !== 44 /* , */ && text.charCodeAt(end) !== 125 /* } */) end++;
    const num = text.slice(keyEnd + 3, end);
    if (!NUMBER_RE.test(num)) return slotsFromJson(text);
    out[key] = Number(num);
    if (end === n - 1) return out;
    if (text.charCodeAt(end) !== 44 || text.charCodeAt(end + 1) !== 32) return slotsFromJson(text);
    i = end + 2;
  }
}

function slotsFromJson(text: string): Record<string, number> {
  const parsed = JSON.parse(text) as unknown;
  return parsed !== null && typeof parsed === "object" && !Array.isArray(parsed) ? copySlots(parsed as TriggerSlots) : dict();
}
