import { AxError } from "./errors.ts";
import { parseDuration } from "./duration.ts";

/**
 * Configuration in three stages: raw strings (environment, then flags over them) →
 * validated values with defaults → plain numbers named `...Ms`. A bad value fails at start-up
 * naming the variable and the value.
 */
export interface AxConfig {
  natsUrl: string;
  redisUrl: string;
  pgUrl: string;
  namespace: string;
  shardCount: number;
  tickMs: number;
  wheelSize: number;
  maxInFlightPerExecutor: number;
  leaseTtlMs: number;
  heartbeatMs: number;
  retentionMs: number;
  logLevel: string;
  replicas: number;
}

export const ENV_DEFAULTS: Record<string, string> = {
  AX_NATS_URL: "nats://127.0.0.1:4222",
  AX_REDIS_URL: "redis://127.0.0.1:6379",
  AX_PG_URL: "postgres://postgres@127.0.0.1:5432/ax",
  AX_NAMESPACE: "ax",
  AX_SHARDS: "64",
  AX_TICK: "20ms",
  AX_WHEEL_SIZE: "512",
  AX_MAX_IN_FLIGHT: "5000",
  AX_LEASE_TTL: "6s",
  AX_HEARTBEAT: "1s",
  AX_RETENTION: "7d",
  AX_LOG_LEVEL: "info",
  AX_REPLICAS: "1",
};

export const ENV_DOCS: Record<string, string> = {
  AX_NATS_URL: "NATS server(s), comma separated",
  AX_REDIS_URL: "Redis URL (due index, guards, idempotency keys)",
  AX_PG_URL: "PostgreSQL URL (source of truth)",
  AX_NAMESPACE: "isolates PG schema, Redis keys, NATS subjects/streams/KV ([a-z][a-z0-9_]*, <= 32 chars)",
  AX_SHARDS: "shard count, fixed when the cluster is first created",
  AX_TICK: "wheel tick",
  AX_WHEEL_SIZE: "wheel slots (horizon = tick × size; later timers wait in rounds)",
  AX_MAX_IN_FLIGHT: "max runs in flight per executor before new runs are refused to retry",
  AX_LEASE_TTL: "shard lease time-to-live (renewed every TTL/3)",
  AX_HEARTBEAT: "node membership heartbeat interval",
  AX_RETENTION: "how long run history is kept",
  AX_LOG_LEVEL: "pino log level (trace, debug, info, warn, error)",
  AX_REPLICAS: "JetStream replicas of the streams and the lease bucket: 1 for a single server, 3 for a cluster (odd, at most 5)",
};

export const NAMESPACE_RE = /^[a-z][a-z0-9_]{0,31}$/;

function fail(variable: string, value: string, why: string): never {
  throw new AxError("AX_E_CONFIG", `${variable}=${JSON.stringify(value)}: ${why}`, { field: variable, value });
}

function url(variable: string, value: string, protocols: string[]): string {
  for (const part of value.split(",")) {
    let u: URL;
    try { u = new URL(part.trim()); } catch { fail(variable, value, "not a URL"); }
    if (!protocols.includes(u.protocol)) fail(variable, value, `expected ${protocols.join(" or ")} URL`);
  }
  return value;
}

function int(variable: string, value: string, min: number, max: number): number {
  if (!/^\d+$/.test(value)) fail(variable, value, "not a whole number");
  const n = Number(value);
  if (n < min || n > max) fail(variable, value, `must be between ${min} and ${max}`);
  return n;
}

function dur(variable: string, value: string): number {
  try { return parseDuration(variable, value); } catch { fail(variable, value, "not a duration (e.g. 500ms, 10s, 5m)"); }
}

/** Builds the configuration from the environment with `overrides` (flags) on top. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, overrides: Partial<Record<string, string>> = {}): AxConfig {
  const get = (k: string): string => overrides[k] ?? env[k] ?? ENV_DEFAULTS[k]!;
  const namespace = get("AX_NAMESPACE");
  if (!NAMESPACE_RE.test(namespace)) fail("AX_NAMESPACE", namespace, "must match [a-z][a-z0-9_]* and be at most 32 characters");
  const cfg: AxConfig = {
    natsUrl: url("AX_NATS_URL", get("AX_NATS_URL"), ["nats:", "tls:", "ws:", "wss:"]),
    redisUrl: url("AX_REDIS_URL", get("AX_REDIS_URL"), ["redis:", "rediss:"]),
    pgUrl: url("AX_PG_URL", get("AX_PG_URL"), ["postgres:", "postgresql:"]),
    namespace,
    shardCount: int("AX_SHARDS", get("AX_SHARDS"), 1, 4096),
    tickMs: dur("AX_TICK", get("AX_TICK")),
    wheelSize: int("AX_WHEEL_SIZE", get("AX_WHEEL_SIZE"), 8, 1 << 20),
    maxInFlightPerExecutor: int("AX_MAX_IN_FLIGHT", get("AX_MAX_IN_FLIGHT"), 1, 10_000_000),
    leaseTtlMs: dur("AX_LEASE_TTL", get("AX_LEASE_TTL")),
    heartbeatMs: dur("AX_HEARTBEAT", get("AX_HEARTBEAT")),
    retentionMs: dur("AX_RETENTION", get("AX_RETENTION")),
    logLevel: get("AX_LOG_LEVEL"),
    replicas: int("AX_REPLICAS", get("AX_REPLICAS"), 1, 5),
  };
  // An even count buys no extra failure tolerance over the odd one below it (a RAFT group
  // needs a majority) and nats-server refuses replicas above 5.
  if (cfg.replicas % 2 === 0) fail("AX_REPLICAS", get("AX_REPLICAS"), "must be odd (1, 3 or 5): an even count tolerates no more failures than the odd one below it");
  if (!["trace", "debug", "info", "warn", "error", "fatal", "silent"].includes(cfg.logLevel)) fail("AX_LOG_LEVEL", cfg.logLevel, "unknown level");
  if (cfg.leaseTtlMs < 1000) fail("AX_LEASE_TTL", get("AX_LEASE_TTL"), "must be at least 1s");
  return cfg;
}

/** Every name a namespace owns, derived in one place so nothing spells them twice. */
export function names(namespace: string) {
  const upper = namespace.toUpperCase();
  return {
    schema: namespace,
    redisPrefix: `${namespace}:`,
    dueKey: (shard: number) => `${namespace}:due:{${shard}}`,
    dispatchStream: `${upper}_DISPATCH`,
    eventsStream: `${upper}_EVENTS`,
    leaseBucket: `${upper}_LEASES`,
    dispatchSubject: (executor: string) => `${namespace}.dispatch.${executor}`,
    dispatchWildcard: `${namespace}.dispatch.>`,
    eventsSubject: (shard: number) => `${namespace}.events.${shard}`,
    eventsWildcard: `${namespace}.events.>`,
    outcomeSubject: (shard: number) => `${namespace}.outcome.${shard}`,
    outcomeWildcard: `${namespace}.outcome.>`,
    triggerSubject: (shard: number) => `${namespace}.trigger.${shard}`,
    triggerWildcard: `${namespace}.trigger.>`,
    apiSubject: (op: string) => `${namespace}.api.${op}`,
    nodeSubject: (nodeId: string, op: string) => `${namespace}.node.${nodeId}.${op}`,
    shardSubject: (shard: number, op: string) => `${namespace}.shard.${shard}.${op}`,
    heartbeatSubject: `${namespace}.cluster.heartbeat`,
    executorConsumer: (executor: string) => `exec_${executor}`,
  };
}
export type Names = ReturnType<typeof names>;
