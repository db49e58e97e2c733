export { NodeEvents, type NodeEventsDeps, type EventSink, type Ackable } from "./nodeEvents.ts";
