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
  /** Where the due index lives and how to reach it (from AX_REDIS_URL, AX_REDIS_MODE, AX_REDIS_SENTINELS, AX_REDIS_MASTER). */
  redis: RedisTarget;
  pgUrl: string;
  namespace: string;
  shardCount: number;
  tickMs: number;
  /** How long before its due time a run is decided and recorded (then published at the due time). */
  leadMs: number;
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
  AX_REDIS_MODE: "single",
  AX_PG_URL: "postgres://postgres@127.0.0.1:5432/ax",
  AX_NAMESPACE: "ax",
  AX_SHARDS: "64",
  AX_TICK: "20ms",
  AX_LEAD: "100ms",
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
  AX_REDIS_URL: "Redis URL (the due index); cluster mode: seed nodes, comma separated; or redis+sentinel://host:port,host:port/master",
  AX_REDIS_MODE: "single (default), cluster (Redis Cluster) or sentinel (a master found through Redis Sentinel)",
  AX_REDIS_SENTINELS: "sentinel mode: sentinel host:port list, comma separated (instead of a redis+sentinel:// URL)",
  AX_REDIS_MASTER: "sentinel mode: the master's name as the sentinels know it",
  AX_REDIS_SENTINEL_PASSWORD: "sentinel mode: password of the sentinels themselves (the URL's password is the master's)",
  AX_PG_URL: "PostgreSQL URL (source of truth)",
  AX_NAMESPACE: "isolates PG schema, Redis keys, NATS subjects/streams/KV ([a-z][a-z0-9_]*, <= 32 chars)",
  AX_SHARDS: "shard count, fixed when the cluster is first created",
  AX_TICK: "wheel tick",
  AX_LEAD: "how long before its due time a run is decided and recorded; it is published at the due time",
  AX_WHEEL_SIZE: "wheel slots (horizon = tick × size; later timers wait in rounds)",
  AX_MAX_IN_FLIGHT: "max runs in flight per executor before new runs are refused to retry",
  AX_LEASE_TTL: "shard lease time-to-live (renewed every TTL/3)",
  AX_HEARTBEAT: "node membership heartbeat interval",
  AX_RETENTION: "how long run history is kept",
  AX_LOG_LEVEL: "pino log level (trace, debug, info, warn, error)",
  AX_REPLICAS: "JetStream replicas of the streams and the lease bucket: 1 for a single server, 3 for a cluster (odd, at most 5)",
};

export const NAMESPACE_RE = /^[a-z][a-z0-9_]{0,31}$/;

/** `scheme://user:secret@host` → `scheme://user:***@host`: refusals are printed and logged. */
export function redactUrl(value: string): string {
  return value.replace(/(\/\/[^/@,]*?:)[^/@,]*@/g, "$1***@");
}

function fail(variable: string, value: string, why: string): never {
  const shown = redactUrl(value);
  throw new AxError("AX_E_CONFIG", `${variable}=${JSON.stringify(shown)}: ${why}`, { field: variable, value: shown });
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

export type RedisMode = "single" | "cluster" | "sentinel";
export interface RedisNode { host: string; port: number }

/**
 * How to reach Redis. `nodes` are the one server (single), the seed nodes (cluster: any
 * masters or replicas; the client learns the rest) or the sentinels (sentinel).
 */
export interface RedisTarget {
  mode: RedisMode;
  nodes: RedisNode[];
  /** sentinel: the master's name as the sentinels know it. */
  masterName?: string;
  username?: string;
  password?: string;
  sentinelPassword?: string;
  /** Database number: single and sentinel only (a Redis Cluster has only database 0). */
  db: number;
  tls: boolean;
  /** For messages: the target with any password replaced by `***`. */
  display: string;
}

const REDIS_MODES: RedisMode[] = ["single", "cluster", "sentinel"];

function hostPort(variable: string, shown: string, part: string, defaultPort: number): RedisNode {
  const m = /^(\[[0-9a-fA-F:.]+\]|[^:/\s[\]]+)(?::(\d+))?$/.exec(part.trim());
  if (!m) fail(variable, shown, `${JSON.stringify(redactUrl(part.trim()))} is not host:port`);
  const port = m[2] === undefined ? defaultPort : Number(m[2]);
  if (!(port >= 1 && port <= 65535)) fail(variable, shown, `port ${m[2]} out of range`);
  return { host: m[1]!.replace(/^\[|\]$/g, ""), port };
}

/**
 * AX_REDIS_URL / AX_REDIS_MODE / AX_REDIS_SENTINELS / AX_REDIS_MASTER → one RedisTarget, or a
 * refusal naming the variable (with any password in the value masked).
 */
function redisTarget(get: (k: string) => string, env: NodeJS.ProcessEnv, overrides: Partial<Record<string, string>>): RedisTarget {
  const opt = (k: string): string | undefined => { const v = overrides[k] ?? env[k]; return v === undefined || v === "" ? undefined : v; };
  const raw = get("AX_REDIS_URL").trim();
  const explicitMode = opt("AX_REDIS_MODE");
  if (explicitMode !== undefined && !REDIS_MODES.includes(explicitMode as RedisMode)) fail("AX_REDIS_MODE", explicitMode, "must be single, cluster or sentinel");
  const sentinels = opt("AX_REDIS_SENTINELS");
  const master = opt("AX_REDIS_MASTER");
  const sentinelPassword = opt("AX_REDIS_SENTINEL_PASSWORD");
  const isSentinelUrl = /^rediss?\+sentinel:\/\//i.test(raw);
  const mode: RedisMode = (explicitMode as RedisMode | undefined) ?? (isSentinelUrl || sentinels ? "sentinel" : "single");
  if (isSentinelUrl && mode !== "sentinel") fail("AX_REDIS_MODE", mode, "AX_REDIS_URL is a redis+sentinel:// URL; set AX_REDIS_MODE=sentinel or leave it unset");
  if (sentinels && mode !== "sentinel") fail("AX_REDIS_MODE", mode, "AX_REDIS_SENTINELS is set; set AX_REDIS_MODE=sentinel or leave it unset");
  if (master && mode !== "sentinel") fail("AX_REDIS_MASTER", master, "only used with AX_REDIS_MODE=sentinel");

  if (mode === "sentinel") {
    if (isSentinelUrl) {
      if (sentinels) fail("AX_REDIS_SENTINELS", sentinels, "give the sentinels either here or in a redis+sentinel:// AX_REDIS_URL, not both");
      // redis+sentinel://[user:password@]host:port,host:port/mastername[/db]
      const m = /^(rediss?)\+sentinel:\/\/(?:([^@/]*)@)?([^/]+)\/([^/?#]+)(?:\/(\d+))?\/?$/i.exec(raw);
      const shown = redactUrl(raw);
      if (!m) fail("AX_REDIS_URL", raw, "expected redis+sentinel://[user:password@]host:port,host:port/mastername[/db]");
      const masterName = decodeURIComponent(m[4]!);
      if (master && master !== masterName) fail("AX_REDIS_MASTER", master, `differs from the master name ${JSON.stringify(masterName)} in AX_REDIS_URL`);
      const nodes = m[3]!.split(",").map((p) => hostPort("AX_REDIS_URL", shown, p, 26379));
      const t: RedisTarget = { mode, nodes, masterName, db: m[5] === undefined ? 0 : Number(m[5]), tls: m[1]!.toLowerCase() === "rediss", display: `${shown}` };
      if (m[2]) {
        const [user, ...pw] = m[2].split(":");
        if (user) t.username = decodeURIComponent(user);
        if (pw.length) t.password = decodeURIComponent(pw.join(":"));
      }
      if (sentinelPassword) t.sentinelPassword = sentinelPassword;
      return t;
    }
    if (!sentinels) fail("AX_REDIS_SENTINELS", "", "sentinel mode needs the sentinels: AX_REDIS_SENTINELS=host:port,host:port and AX_REDIS_MASTER, or AX_REDIS_URL=redis+sentinel://host:port,host:port/mastername");
    if (!master) fail("AX_REDIS_MASTER", "", "sentinel mode needs the master's name (as in the sentinels' `sentinel monitor NAME ...`)");
    const nodes = sentinels.split(",").map((p) => hostPort("AX_REDIS_SENTINELS", sentinels, p, 26379));
    // AX_REDIS_URL then carries only credentials, database and TLS for the master (its host is ignored).
    const base = opt("AX_REDIS_URL") === undefined ? undefined : singleUrl("AX_REDIS_URL", raw);
    const t: RedisTarget = { mode, nodes, masterName: master, db: base?.db ?? 0, tls: base?.tls ?? false,
      display: `sentinels ${nodes.map((n) => `${n.host}:${n.port}`).join(",")} master ${master}` };
    if (base?.username) t.username = base.username;
    if (base?.password) t.password = base.password;
    if (sentinelPassword) t.sentinelPassword = sentinelPassword;
    return t;
  }

  const parts = raw.split(",").map((p) => p.trim()).filter((p) => p !== "");
  if (parts.length === 0) fail("AX_REDIS_URL", raw, "empty");
  if (mode === "single" && parts.length > 1) fail("AX_REDIS_URL", raw, "a list of servers needs AX_REDIS_MODE=cluster (Redis Cluster seeds) or sentinel (use redis+sentinel://...)");
  // Cluster seeds: the first is a full URL; later ones may be bare host:port and share its credentials.
  const first = singleUrl("AX_REDIS_URL", parts[0]!);
  const nodes = [first.node];
  for (const p of parts.slice(1)) nodes.push(/^rediss?:\/\//i.test(p) ? singleUrl("AX_REDIS_URL", p).node : hostPort("AX_REDIS_URL", raw, p, 6379));
  if (mode === "cluster" && first.db !== 0) fail("AX_REDIS_URL", raw, "Redis Cluster has only database 0; remove the /db path");
  const t: RedisTarget = { mode, nodes, db: first.db, tls: first.tls, display: redactUrl(raw) };
  if (first.username) t.username = first.username;
  if (first.password) t.password = first.password;
  return t;
}

function singleUrl(variable: string, value: string): { node: RedisNode; db: number; tls: boolean; username?: string; password?: string } {
  let u: URL;
  try { u = new URL(value); } catch { fail(variable, value, "not a URL"); }
  if (u.protocol !== "redis:" && u.protocol !== "rediss:") fail(variable, value, "expected redis: or rediss: URL");
  if (!u.hostname) fail(variable, value, "no host");
  const path = u.pathname.replace(/^\//, "");
  if (path !== "" && !/^\d+$/.test(path)) fail(variable, value, "the path must be a database number");
  const port = u.port === "" ? 6379 : Number(u.port);
  const out: { node: RedisNode; db: number; tls: boolean; username?: string; password?: string } = {
    node: { host: u.hostname.replace(/^\[|\]$/g, ""), port }, db: path === "" ? 0 : Number(path), tls: u.protocol === "rediss:" };
  if (u.username) out.username = decodeURIComponent(u.username);
  if (u.password) out.password = decodeURIComponent(u.password);
  return out;
}

/** Builds the configuration from the environment with `overrides` (flags) on top. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, overrides: Partial<Record<string, string>> = {}): AxConfig {
  const get = (k: string): string => overrides[k] ?? env[k] ?? ENV_DEFAULTS[k]!;
  const namespace = get("AX_NAMESPACE");
  if (!NAMESPACE_RE.test(namespace)) fail("AX_NAMESPACE", namespace, "must match [a-z][a-z0-9_]* and be at most 32 characters");
  const cfg: AxConfig = {
    natsUrl: url("AX_NATS_URL", get("AX_NATS_URL"), ["nats:", "tls:", "ws:", "wss:"]),
    redisUrl: get("AX_REDIS_URL"),
    redis: redisTarget(get, env, overrides),
    pgUrl: url("AX_PG_URL", get("AX_PG_URL"), ["postgres:", "postgresql:"]),
    namespace,
    shardCount: int("AX_SHARDS", get("AX_SHARDS"), 1, 4096),
    tickMs: dur("AX_TICK", get("AX_TICK")),
    leadMs: dur("AX_LEAD", get("AX_LEAD")),
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
    /** Events of the runs a node dispatched (v2); inside eventsWildcard, outside every per-shard filter. */
    nodeEventsSubject: (nodeId: string) => `${namespace}.events.n.${nodeId}`,
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
