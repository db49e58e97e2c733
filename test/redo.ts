import { SimulatedClock, silentLogger } from "../common/index.ts";
import type { TaskRecord } from "../actors/machine/index.ts";
import { InFlightLimiter } from "../actors/limiter.ts";
import { Horizon } from "../actors/shard/horizon.ts";
import { ShardDecisions } from "../actors/shard/decide.ts";
import { liveTask } from "../actors/shard/types.ts";
import type { RunRow, TaskRow } from "../actors/store/index.ts";

/**
 * A shard's decisions (decide.ts) with stand-ins for everything outside them: an in-memory
 * limiter and horizon on `clock`, never refilled, and ports that answer "nothing pending,
 * everything read, delivered". For tests that decide and redo fires without a cluster.
 */
export function stubDecisions(clock: SimulatedClock, o: { shard?: number; epoch?: number; leadMs?: number; horizonMs?: number; spreadAheadMs?: number;
  limit?: number; secret?: Uint8Array; random?: () => number; active?: boolean; deferFireWrites?: boolean } = {}) {
  const shard = o.shard ?? 1;
  const limiter = new InFlightLimiter(o.limit ?? 1000);
  const horizon = new Horizon({
    shard, tickMs: 20, wheelSize: 512, clock, log: silentLogger, horizonMs: o.horizonMs ?? 5000, leadMs: o.leadMs ?? 100,
    due: { rebuildFrom: async () => undefined, takeDue: async () => ({ items: [], nextDueMs: null }) }, store: { dueOfShard: async () => [] },
    onDue: () => undefined, onRefilled: () => undefined, active: () => false,
  });
  const d = new ShardDecisions({
    shard, epoch: o.epoch ?? 2, nodeId: "n1", clock, log: silentLogger, tickMs: 20, limiter, horizon,
    ...(o.spreadAheadMs !== undefined ? { spreadAheadMs: o.spreadAheadMs } : {}),
    calendars: { exclusion: () => null },
    persister: { withdraw: () => false, isPublishing: () => false, landedAt: () => undefined },
    catchUp: { covers: () => true, request: () => undefined },
    delivery: { status: () => "delivered", ask: () => undefined },
    dispatchSecret: o.secret ?? new Uint8Array(32), ...(o.random ? { random: o.random } : {}),
    tell: () => undefined, active: () => o.active ?? false, deferFireWrites: o.deferFireWrites ?? false,
  });
  return { d, horizon, limiter };
}

/**
 * A task row as a shard's next owner loads it (see ShardActor.start): if PostgreSQL holds a fire
 * whose task row was not written yet (AX_TASK_WRITE_DEFER) — a `running` run due at the row's
 * pointer while the row lists nothing in flight — the fire is redone on the row with the
 * product's own ShardDecisions.replayFire. Tests that check invariants of the stored state at an
 * arbitrary instant (the ledger's watermark) read it through this, as a next owner would.
 */
export function asLoaded(row: TaskRow, runs: readonly RunRow[]): { row: TaskRow; redone: RunRow | null } {
  if ((row.record as TaskRecord).context.inFlight.length > 0) return { row, redone: null };
  const pending = runs.filter((r) => r.state === "running" && r.dueMs === row.nextDueMs && r.slotMs === row.nextSlotMs);
  if (!pending.length) return { row, redone: null };
  const run = pending.reduce((a, b) => (b.createdMs > a.createdMs ? b : a));
  const { d } = stubDecisions(new SimulatedClock(run.createdMs), { shard: row.shard, epoch: 0, leadMs: 500, horizonMs: 10_000, limit: 1_000_000 });
  const lt = liveTask(structuredClone(row));
  d.live.set(row.id, lt);
  if (!d.replayFire(d.newRound(), lt, run)) return { row, redone: null };
  return { row: lt.row, redone: run };
}
