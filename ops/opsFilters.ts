import { InvalidInputError, parseDuration } from "../common/index.ts";

/** Task states an operator filters on (the machine's states). */
export const TASK_STATES = ["pending", "running", "success", "failed", "retry", "paused", "cancelled", "upstream_failed"] as const;
/** Run outcomes (runs.state). */
export const RUN_STATES = ["running", "success", "failed", "timed_out", "refused", "skipped", "stale"] as const;

const EXECUTOR_RE = /^[A-Za-z0-9_-]{1,64}$/;

/** `task.ls` filters: `state`, `executor` (equal), `prefix` (the name starts with it). */
export function taskListFilters(a: Record<string, unknown>): { state?: string; executor?: string; namePrefix?: string } {
  const out: { state?: string; executor?: string; namePrefix?: string } = {};
  if (a.state !== undefined) {
    if (typeof a.state !== "string" || !(TASK_STATES as readonly string[]).includes(a.state)) throw new InvalidInputError("state", a.state, `one of ${TASK_STATES.join(", ")}`);
    out.state = a.state;
  }
  if (a.executor !== undefined) {
    if (typeof a.executor !== "string" || !EXECUTOR_RE.test(a.executor)) throw new InvalidInputError("executor", a.executor, "an executor name (letters, digits, _ or -)");
    out.executor = a.executor;
  }
  if (a.prefix !== undefined) {
    if (typeof a.prefix !== "string" || !a.prefix.length || a.prefix.length > 128) throw new InvalidInputError("prefix", a.prefix, "1 to 128 characters");
    out.namePrefix = a.prefix;
  }
  return out;
}

/**
 * `runs` filters: `outcome` (one or more run states, comma-separated or a list), `since` (an
 * ISO-8601 time, or a duration meaning that long ago: `1h`).
 */
export function runListFilters(a: Record<string, unknown>, nowMs: number): { states?: string[]; sinceMs?: number } {
  const out: { states?: string[]; sinceMs?: number } = {};
  if (a.outcome !== undefined) {
    const list = Array.isArray(a.outcome) ? a.outcome : typeof a.outcome === "string" ? a.outcome.split(",").map((x) => x.trim()).filter(Boolean) : null;
    if (!list?.length || !list.every((x) => typeof x === "string" && (RUN_STATES as readonly string[]).includes(x))) {
      throw new InvalidInputError("outcome", a.outcome, `one or more of ${RUN_STATES.join(", ")} (comma-separated)`);
    }
    out.states = list as string[];
  }
  if (a.since !== undefined) {
    const v = a.since;
    if (typeof v !== "string" || !v.length) throw new InvalidInputError("since", v, "an ISO-8601 time or a duration (1h: an hour ago)");
    if (/^(\d+(\.\d+)?(ms|s|m|h|d|w))+$/.test(v)) out.sinceMs = nowMs - parseDuration("since", v);
    else {
      const t = Date.parse(v);
      if (!/^\d{4}-\d{2}-\d{2}/.test(v) || Number.isNaN(t)) throw new InvalidInputError("since", v, "an ISO-8601 time (2026-12-01T00:00:00Z) or a duration (1h: an hour ago)");
      out.sinceMs = t;
    }
  }
  return out;
}
