/**
 * Task machine benchmark. Run: node --expose-gc --import tsx bench/machine.ts
 * Prints ONE JSON line:
 * - transitionsPerSec: applyEvent on plain records, FIRE → SUCCEEDED loop (~1M transitions);
 * - heapBytesPerIdleRecord: heap growth per idle TaskRecord held as a scheduler would (100k
 *   distinct objects restored from JSON, each with a UUID lastRunId, 1 in 10 with a shared error);
 * - heapBytesPerPackedIdle: the same tasks held as packIdle() values;
 * - heapBytesPerPackedNeverRun: fresh tasks (no run id yet) held packed (a plain number).
 * Each per-task figure includes the holding array's slot.
 */
import { randomUUID } from "node:crypto";
import { applyEvent, initialRecord, packIdle, type PackedIdle, type TaskEvent, type TaskRecord } from "../actors/machine/index.ts";

const gc = (globalThis as { gc?: () => void }).gc;
if (gc === undefined) {
  process.stderr.write("run with node --expose-gc\n");
  process.exit(1);
}

function settle(): number {
  for (let i = 0; i < 4; i++) gc!();
  return process.memoryUsage().heapUsed;
}

function benchTransitions(total: number): number {
  let r: TaskRecord = initialRecord({ maxAttempts: 3, overlap: "forbid" });
  const ids = Array.from({ length: 1024 }, (_, i) => `run-${i}`);
  const fires: TaskEvent[] = ids.map((runId) => ({ type: "FIRE", runId, source: "cron" }));
  const dones: TaskEvent[] = ids.map((runId) => ({ type: "SUCCEEDED", runId }));
  const loop = (n: number): void => {
    for (let i = 0; i < n; i += 2) {
      const k = (i >> 1) & 1023;
      const a = applyEvent(r, fires[k]!);
      if (!a.ok) throw new Error(a.reason);
      const b = applyEvent(a.record, dones[k]!);
      if (!b.ok) throw new Error(b.reason);
      r = b.record;
    }
  };
  loop(50_000); // warm-up
  const t0 = process.hrtime.bigint();
  loop(total);
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  return total / secs;
}

const STATES = ["success", "success", "success", "failed", "retry", "pending", "paused", "upstream_failed"] as const;
const ERRORS = ["timed out", "exit code 1", "connection refused"];

/** The JSON a store would hand back for task i (a realistic idle task that has run before). */
function idleJson(i: number): string {
  const value = STATES[i % STATES.length]!;
  const failedish = value === "failed" || value === "retry" || i % 10 === 0;
  const rec: TaskRecord = {
    value,
    context: {
      attempt: value === "failed" ? 3 : 1,
      maxAttempts: 3,
      overlap: i % 5 === 0 ? "allow" : "forbid",
      inFlight: [],
      lastRunId: randomUUID(),
      lastError: failedish ? ERRORS[i % ERRORS.length]! : null,
      pausedAfterRun: false,
    },
  };
  return JSON.stringify(rec);
}

function measure<T>(n: number, make: (i: number) => T): number {
  const held: T[] = [];
  const before = settle();
  for (let i = 0; i < n; i++) held.push(make(i));
  const after = settle();
  const per = (after - before) / n;
  if (held.length !== n) throw new Error("unreachable");
  return per;
}

const N = 100_000;
const transitionsPerSec = benchTransitions(1_000_000);
// Fill intern tables / code caches once so they are not charged to the first measurement.
packIdle(JSON.parse(idleJson(0)) as TaskRecord);
for (const e of ERRORS) packIdle({ ...initialRecord({ maxAttempts: 1, overlap: "forbid" }), value: "failed", context: { ...initialRecord({ maxAttempts: 1, overlap: "forbid" }).context, lastError: e } });

const heapBytesPerIdleRecord = measure<TaskRecord>(N, (i) => JSON.parse(idleJson(i)) as TaskRecord);
const heapBytesPerPackedIdle = measure<PackedIdle>(N, (i) => packIdle(JSON.parse(idleJson(i)) as TaskRecord));
const heapBytesPerPackedNeverRun = measure<PackedIdle>(N, (i) => packIdle(initialRecord({ maxAttempts: 1 + (i % 5), overlap: i % 2 ? "allow" : "forbid" })));

const round = (x: number): number => Math.round(x * 10) / 10;
process.stdout.write(
  JSON.stringify({
    bench: "machine",
    node: process.version,
    transitions: 1_000_000,
    transitionsPerSec: Math.round(transitionsPerSec),
    idleTasks: N,
    heapBytesPerIdleRecord: round(heapBytesPerIdleRecord),
    heapBytesPerPackedIdle: round(heapBytesPerPackedIdle),
    heapBytesPerPackedNeverRun: round(heapBytesPerPackedNeverRun),
    targetBytesPerIdleTask: 200,
  }) + "\n",
);
