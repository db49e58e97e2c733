import type { HistoryRow } from "../actors/index.ts";

export type { HistoryRow };

/** The change in words: "timeout 30s → 1m; trigger every 1s → every 2s". */
export function describeChange(change: Record<string, unknown>): string {
  const parts: string[] = [];
  for (const [k, v] of Object.entries(change)) {
    if (k === "withdrawn" || v === null || typeof v !== "object" || !("to" in v)) continue;
    const { from, to } = v as { from: unknown; to: unknown };
    const show = (x: unknown) => (typeof x === "string" ? x : JSON.stringify(x));
    parts.push(`${k} ${show(from)} → ${show(to)}`);
  }
  return parts.join("; ");
}
