export {
  DispatchBatchSchema, DispatchRunSchema, EventBatchSchema, RunEventSchema, OutcomeSchema, OutcomeBatchSchema, DependencyTriggerSchema, FailureSchema,
  RunSourceSchema, WIRE_SCHEMAS, decode, encode,
  type DispatchBatch, type DispatchRun, type EventBatch, type RunEvent, type Outcome, type OutcomeBatch, type DependencyTrigger, type Failure, type Decoded,
} from "./messages.ts";
export { newRunId, derivedRunId } from "./ids.ts";
export {
  ensureStreams, ensureExecutorConsumer, ensureShardConsumers, dropStreams,
  shardEventsConsumer, shardTriggerConsumer, DEPENDENCY_CONSUMER,
} from "./jetstream.ts";
export { ConsumerWatch, EventCatchUp, connectionUptime, consumerStalled, jetStreamProgress, type ConsumerProgress, type ConsumerSample } from "./catchUp.ts";
export { Executor, NonRetryableError, type ExecutorOptions, type RunContext, type RunHandler } from "./executor.ts";
