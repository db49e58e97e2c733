export {
  DispatchBatchSchema, DispatchRunSchema, EventBatchSchema, EventBatchV1Schema, EventBatchV2Schema, RunEventSchema, OutcomeSchema, OutcomeBatchSchema, DependencyTriggerSchema, FailureSchema,
  RunSourceSchema, WIRE_SCHEMAS, MAX_RESULT_BYTES, decode, encode,
  type DispatchBatch, type DispatchBatchV2, type DispatchRun, type EventBatch, type EventBatchV1, type RunEvent, type Outcome, type OutcomeBatch, type DependencyTrigger, type Failure, type Decoded,
  decodeEventBatchV1, decodeEventBatchV2,
} from "./messages.ts";
export { newRunId, derivedRunId, runToken, tokenMatches } from "./ids.ts";
export {
  ensureStreams, missingStreams, ensureExecutorConsumer, ensureShardConsumers, ensureShardConsumer, ensureNodeEventsConsumer, dropStreams,
  shardEventsConsumer, nodeEventsConsumer, NODE_EVENTS_CONSUMER_RE, shardTriggerConsumer, DEPENDENCY_CONSUMER, DEPENDENCY_ACK_WAIT_MS, closeGently, handBack,
} from "./jetstream.ts";
export { DispatchDelivery, type DeliveryView } from "./delivery.ts";
export { ConsumerWatch, EventCatchUp, connectionUptime, consumerStalled, noteJetStreamTrouble, jetStreamProgress, type ConsumerProgress, type ConsumerSample } from "./catchUp.ts";
export { HoldClock, MAX_TRANSIT_CREDIT_MS } from "./hold.ts";
export { Executor, NonRetryableError, CancelledError, type ExecutorOptions, type RunContext, type RunHandler } from "./executor.ts";
export { DeadLetters, DEAD_HEADERS, listDeadLetters, nakLater, redeliveryDelayMs, type DeadCause, type DeadLetter, type DeadLettersOptions, type LastChance } from "./deadLetter.ts";
