import { formatDuration, InvalidInputError } from "../common/index.ts";
import { compileTrigger, type TaskRow, type TriggerRow, type TriggerSpec } from "../actors/index.ts";

/**
 * A task as it is declared: the body `task.create` takes, with every value explicit and in its
 * canonical written form (durations as `formatDuration` writes them, `once` as an ISO instant, a
 * cron's zone always given). `ax export` writes these, `ax apply` compares a file's specs with
 * them, `ax task update` merges a change into them: one form, so apply → export → apply is a no-op.
 */
export interface DeclaredTask {
  name: string;
  executor: string;
  cron?: string;
  tz?: string;
  dstGap?: string;
  dstRepeat?: string;
  every?: string;
  fixedDelay?: string;
  at?: string;
  after?: string[];
  timeout: string;
  retries: number;
  backoff: string;
  backoffMax: string;
  misfire: string;
  overlap: string;
  payload?: unknown;
}

export const TRIGGER_FIELDS = ["cron", "tz", "dstGap", "dstRepeat", "every", "fixedDelay", "at", "delay"] as const;
/** The fields of a declared task (and of `ax task update`, which takes all but name and after). */
export const SPEC_FIELDS = new Set(["name", "executor", ...TRIGGER_FIELDS, "after", "timeout", "retries", "backoff", "backoffMax", "misfire", "overlap", "payload"]);

/** A stored trigger as the fields that declare it. */
export function declaredTrigger(tr: Pick<TriggerRow, "spec">): Record<string, string> {
  const s = tr.spec as TriggerSpec;
  switch (s.kind) {
    case "cron": return { cron: s.expr, tz: s.tz, ...(s.dstGap ? { dstGap: s.dstGap } : {}), ...(s.dstRepeat ? { dstRepeat: s.dstRepeat } : {}) };
    case "fixed_rate": return { every: formatDuration(s.everyMs) };
    case "fixed_delay": return { fixedDelay: formatDuration(s.delayMs) };
    case "once": return { at: new Date(s.atMs).toISOString() };
  }
}

export function declaredTask(row: TaskRow, upstreamNames: string[]): DeclaredTask {
  const out: DeclaredTask = { name: row.name, executor: row.executor, timeout: "", retries: 0, backoff: "", backoffMax: "", misfire: row.misfire, overlap: row.overlap };
  const tr = row.triggers[0];
  if (tr) Object.assign(out, declaredTrigger(tr));
  if (upstreamNames.length) out.after = [...upstreamNames].sort();
  out.timeout = formatDuration(row.timeoutMs);
  out.retries = row.maxAttempts - 1;
  out.backoff = formatDuration(row.backoffMs);
  out.backoffMax = formatDuration(row.backoffMaxMs);
  out.misfire = row.misfire;
  out.overlap = row.overlap;
  if (row.payload !== null && row.payload !== undefined) out.payload = row.payload;
  return out;
}

/** JSON with object keys sorted (PostgreSQL's jsonb does not keep the order a payload was written in). */
export function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== "object") return JSON.stringify(v) ?? "null";
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(",")}]`;
  const o = v as Record<string, unknown>;
  return `{${Object.keys(o).sort().filter((k) => o[k] !== undefined).map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`).join(",")}}`;
}

/** Two trigger specs are the same schedule (a fixed rate's anchor is when it was declared, not part of it). */
export function sameTrigger(a: unknown, b: unknown): boolean {
  const strip = (s: unknown) => {
    const x = { ...(s as Record<string, unknown>) };
    if (x.kind === "fixed_rate") delete x.anchorMs;
    return canonicalJson(x);
  };
  return strip(a) === strip(b);
}

/** The next `count` times of a trigger set after `fromMs`, merged, in UTC (fixed-delay: as if each run took no time). */
export function nextTimes(triggers: ReadonlyArray<Pick<TriggerRow, "spec">>, fromMs: number, count: number, slots: Record<string, number> = {}, ids: Array<number | null> = []): string[] {
  const all: number[] = [];
  triggers.forEach((tr, i) => {
    const c = compileTrigger(tr.spec as TriggerSpec);
    const id = ids[i];
    let t: number | null = Math.max(fromMs, id !== undefined && id !== null ? slots[String(id)] ?? -Infinity : -Infinity);
    for (let k = 0; k < count && t !== null; k++) {
      t = c.next(t);
      if (t !== null) all.push(t);
    }
  });
  return [...new Set(all)].sort((a, b) => a - b).slice(0, count).map((ms) => new Date(ms).toISOString());
}

/** Only the known fields: a misspelt one is refused, naming it (a silently ignored `retires: 3` is worse). */
export function checkFields(where: string, spec: Record<string, unknown>, allowed: ReadonlySet<string>): void {
  for (const k of Object.keys(spec)) {
    if (!allowed.has(k)) throw new InvalidInputError(where ? `${where}.${k}` : k, spec[k], `unknown field (known: ${[...allowed].join(", ")})`);
  }
}
