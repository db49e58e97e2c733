export { assignShards, planMoves, HashRing, hash32, type AssignmentInput } from "./ring.ts";
export { LeaseTable, LeaseView, type HeldLease, type LeaseSource } from "./leases.ts";
export { LeaseBucket, EPOCH_SPAN, type LeaseBucketOptions } from "./leaseBucket.ts";
export { Membership, HeartbeatSchema, type Heartbeat, type Member } from "./membership.ts";
export { ShardSupervisor, controlKey, signPlan, type ShardHandle, type SupervisorOptions, type PlannedMove } from "./supervisor.ts";
