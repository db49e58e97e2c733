import type { RunRow, TaskRow } from "../actors/index.ts";

const iso = (ms: number | null | undefined) => (ms === null || ms === undefined ? "?" : new Date(ms).toISOString());

/** "Why did this run at that time, and did it succeed?" — the lineage record read back as sentences. */
export function explainRun(run: RunRow, task: TaskRow | null, cause: RunRow | null, upstreams: RunRow[]): string[] {
  const s: string[] = [];
  const name = task?.name ?? run.taskName;
  switch (run.source) {
    case "manual": s.push(`Run ${run.id} of task ${name} was started by hand (ax run) at ${iso(run.firedMs)}${run.dueReason?.includes("force") ? " with --force" : ""}.`); break;
    case "dependency": s.push(`Run ${run.id} of task ${name} became due at ${iso(run.dueMs)} because its upstreams succeeded: ${run.dueReason ?? ""}.`); break;
    case "retry": s.push(`Run ${run.id} of task ${name} is attempt ${run.attempt}, a retry due at ${iso(run.dueMs)}: ${run.dueReason ?? ""}.`); break;
    case "backfill": s.push(`Run ${run.id} of task ${name} is a backfill run for the past slot ${iso(run.slotMs)}, started at ${iso(run.dueMs)}: ${run.dueReason ?? ""}.`); break;
    case "misfire": s.push(`Run ${run.id} of task ${name} was a catch-up run due at ${iso(run.dueMs)}: ${run.dueReason ?? ""}.`); break;
    default: s.push(`Run ${run.id} of task ${name} was due at ${iso(run.dueMs)} (slot ${iso(run.slotMs)}): ${run.dueReason ?? run.source}.`);
  }
  if (cause) s.push(`It was caused by run ${cause.id} (attempt ${cause.attempt}, ${cause.state}${cause.error ? `: ${cause.error}` : ""}).`);
  for (const u of upstreams) s.push(`Upstream run ${u.id} of ${u.taskName} ended ${u.state} at ${iso(u.finishedMs)}.`);
  if (run.state === "skipped") { s.push(`It was not fired: ${run.error ?? "skipped"}.`); return s; }
  if (run.state === "refused") { s.push(`It was not dispatched: ${run.error ?? "refused"}.`); return s; }
  if (run.state === "stale") {
    s.push(`Node ${run.node} fired it at ${iso(run.firedMs)} to executor ${run.executor}, but the executor did not run it: ${run.error ?? "stale"} (at ${iso(run.finishedMs)}).`);
    return s;
  }
  s.push(`Node ${run.node} fired it at ${iso(run.firedMs)} (${run.firedMs !== null ? run.firedMs - run.dueMs : "?"} ms after due) from shard ${run.shard} under lease epoch ${run.epoch}, attempt ${run.attempt}, to executor ${run.executor}.`);
  if (run.executorInstance) s.push(`Executor instance ${run.executorInstance} started it at ${iso(run.startedMs)}.`);
  else if (run.state !== "running") s.push("No executor instance reported starting it.");
  switch (run.state) {
    case "running": s.push("It is still running."); break;
    case "success": s.push(`It succeeded at ${iso(run.finishedMs)}${run.startedMs ? ` after ${(run.finishedMs ?? 0) - run.startedMs} ms` : ""}.`); break;
    case "failed": s.push(`It failed at ${iso(run.finishedMs)}: ${run.error ?? "error"}.`); break;
    case "timed_out": s.push(`It timed out at ${iso(run.finishedMs)}: ${run.error ?? ""}.`); break;
  }
  if (run.lateOutcome?.startsWith("stale: ")) s.push(`When it was finally delivered, the executor did not run it: ${run.lateOutcome.slice(7)}.`);
  else if (run.lateOutcome) s.push(`A completion arrived after the timeout (${run.lateOutcome}); it was recorded but did not change the task.`);
  if (run.result !== null && run.result !== undefined) s.push(`Its result: ${JSON.stringify(run.result).slice(0, 300)}.`);
  return s;
}
