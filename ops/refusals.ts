import type { Counter } from "prom-client";
import type { Logger } from "../common/index.ts";

/**
 * Refused inputs are counted per cause (ax_refused_total{cause}) and logged at most once per
 * cause per interval with the number seen since: a flood of bad messages costs one log line a
 * minute, not one per message, and never a stack trace.
 */
export class RefusalLog {
  private readonly last = new Map<string, { at: number; suppressed: number }>();
  constructor(private readonly logger: Logger, private readonly counter: Counter<"cause">, private readonly intervalMs = 60_000, private readonly now = () => Date.now(), private readonly msg = "input refused") {}

  note(cause: string, e: unknown): void {
    this.counter.inc({ cause });
    const t = this.now();
    const l = this.last.get(cause);
    if (l && t - l.at < this.intervalMs) { l.suppressed++; return; }
    if (this.last.size > 1000) this.last.clear();
    this.last.set(cause, { at: t, suppressed: 0 });
    this.logger.warn({ cause, reason: e instanceof Error ? e.message : String(e), ...(l?.suppressed ? { alsoSince: l.suppressed } : {}) }, this.msg);
  }
}
