import { accessSync, constants, readFileSync } from "node:fs";
import { AxError } from "./errors.ts";
import { parseDuration } from "./duration.ts";
import { redactUrl, registerSecret } from "./redact.ts";

/**
 * Configuration in three stages: raw strings (environment, then flags over them) →
 * validated values with defaults → plain numbers named `...Ms`. A bad value fails at start-up
 * naming the variable and the value.
 */
/**
 * How to reach and authenticate to NATS. At most one of user/password, token, NKey seed and
 * creds file; TLS (a CA to trust, a client certificate) combines with any of them.
 */
export interface NatsSettings {
  /** Server URLs with any credentials taken out (those are in user/password/token). */
  servers: string[];
  user?: string;
  password?: string;
  token?: string;
  /** An NKey user seed (`SU…`), read from the variable or from the file it names. */
  nkeySeed?: string;
  credsFile?: string;
  tlsCa?: string;
  tlsCert?: string;
  tlsKey?: string;
  /** Reply subjects start with this instead of `_INBOX` (so NATS permissions can give each user its own). */
  inboxPrefix?: string;
}

export interface AxConfig {
  /** AX_NATS_URL without credentials (safe to print); `nats` has everything needed to connect. */
  natsUrl: string;
  nats: NatsSettings;
  redisUrl: string;
  /** Where the due index lives and how to reach it (from AX_REDIS_URL, AX_REDIS_MODE, AX_REDIS_SENTINELS, AX_REDIS_MASTER). */
  redis: RedisTarget;
  pgUrl: string;
  namespace: string;
  shardCount: number;
  tickMs: number;
  /** How long before its due time a run is decided and recorded (then published at the due time). */
  leadMs: number;
  /** Where runs recorded ahead are published at their due time: "thread" (the releaser thread) or "inline" (the node's own thread). */
  releaser: "thread" | "inline";
  wheelSize: number;
  maxInFlightPerExecutor: number;
  /** Runs a second a node decides on one step of its decision grid before it spreads the rest of a burst earlier (0: never). */
  spreadRate: number;
  /** Runs per executor, beyond maxInFlightPerExecutor, that may go out ahead of their due time to an executor that holds them. */
  maxAhead: number;
  /** Deliveries of a message whose processing failed before it is parked as a dead letter. */
  deadAfter: number;
  leaseTtlMs: number;
  /** Longest a run whose dispatch sits undelivered in the stream waits past its timeout (0: not at all). */
  deliveryGraceMs: number;
  /** Longest a fire may leave its task row unwritten, for the run's end to write both changes at once (0: written with each fire). */
  taskWriteDeferMs: number;
  heartbeatMs: number;
  retentionMs: number;
  logLevel: string;
  replicas: number;
  /** HTTP: where to listen; bearer tokens (hashed) file, or null = no tokens (loopback only). */
  httpHost: string;
  httpTokensFile: string | null;
  /** Limits enforced at the edges (HTTP, API): request body, task payload, error text. */
  limits: Limits;
}

export interface Limits {
  httpBodyBytes: number;
  payloadBytes: number;
  payloadDepth: number;
}

export const ENV_DEFAULTS: Record<string, string> = {
  AX_NATS_URL: "nats://127.0.0.1:4222",
  AX_REDIS_URL: "redis://127.0.0.1:6379",
  AX_REDIS_MODE: "single",
  AX_PG_URL: "postgres://postgres@127.0.0.1:5432/ax",
  AX_NAMESPACE: "ax",
  AX_SHARDS: "64",
  AX_TICK: "20ms",
  AX_LEAD: "500ms",
  AX_RELEASER: "inline",
  AX_WHEEL_SIZE: "512",
  AX_MAX_IN_FLIGHT: "20000",
  AX_SPREAD_RATE: "10000",
  AX_MAX_AHEAD: "200000",
  AX_DEAD_AFTER: "8",
  AX_LEASE_TTL: "6s",
  AX_DELIVERY_GRACE: "30s",
  AX_TASK_WRITE_DEFER: "2s",
  AX_HEARTBEAT: "1s",
  AX_RETENTION: "7d",
  AX_LOG_LEVEL: "info",
  AX_REPLICAS: "1",
  AX_HTTP_HOST: "127.0.0.1",
  AX_HTTP_MAX_BODY: "1MB",
  AX_MAX_PAYLOAD: "64KB",
  AX_MAX_PAYLOAD_DEPTH: "32",
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
  AX_RELEASER: "inline (default): the node's main thread releases every run recorded ahead; thread: a run whose release the main thread has not made 4 ms after its due time (a garbage-collection pause) is published by a thread of its own, for 10-40 µs more CPU a run",
  AX_WHEEL_SIZE: "wheel slots (horizon = tick × size; later timers wait in rounds)",
  AX_MAX_IN_FLIGHT: "runs in flight per executor per node; runs due beyond it wait for a place, earliest due first (manual runs are refused)",
  AX_SPREAD_RATE: "runs a second a node decides for one instant before it spreads the rest of a burst over the seconds before it (up to the wheel's horizon, 10 s), so a burst known ahead is recorded ahead; 0: no spreading",
  AX_MAX_AHEAD: "runs per executor, beyond AX_MAX_IN_FLIGHT, that a spread burst may send ahead of their due time to an executor that holds them (each costs the executor about 0.5 KB of heap until it starts); 0: none",
  AX_DEAD_AFTER: "failed deliveries of an event/outcome/trigger message before its last chance (alone), then parked in the dead-letter stream (`ax dead ls`) if that fails",
  AX_LEASE_TTL: "shard lease time-to-live (renewed every TTL/3)",
  AX_DELIVERY_GRACE: "longest a run no executor has taken from the stream (none pulling, all full, a NATS leader election) waits past its timeout before it times out; 0s: not at all",
  AX_TASK_WRITE_DEFER: "longest a fire may leave its task's row unwritten (the run's row is written at once), so that the run's end writes both changes in one update; a node that takes the shard over redoes such a fire from the run's row; 0s: the task row is written with each fire",
  AX_HEARTBEAT: "node membership heartbeat interval",
  AX_RETENTION: "how long run history is kept",
  AX_LOG_LEVEL: "pino log level (trace, debug, info, warn, error)",
  AX_REPLICAS: "JetStream replicas of the streams and the lease bucket: 1 for a single server, 3 for a cluster (odd, at most 5)",
  AX_HTTP_HOST: "HTTP listen address; other than loopback only with AX_HTTP_TOKENS_FILE",
  AX_HTTP_MAX_BODY: "largest HTTP request body (larger: 413)",
  AX_MAX_PAYLOAD: "largest task or run payload, as JSON (a run is dispatched in one NATS message)",
  AX_MAX_PAYLOAD_DEPTH: "deepest nesting of a payload",
};

/** Optional settings without a default. */
export const OPTIONAL_DOCS: Record<string, string> = {
  AX_HTTP_TOKENS_FILE: "bearer tokens for HTTP, one `name role scrypt$…` line each (ax token hash); roles read, operate, admin",
};

/** NATS credentials and TLS (no defaults; credentials in AX_NATS_URL work too: nats://user:pass@host, nats://token@host). */
export const NATS_AUTH_DOCS: Record<string, string> = {
  AX_NATS_USER: "NATS user (with AX_NATS_PASSWORD)",
  AX_NATS_PASSWORD: "NATS password",
  AX_NATS_TOKEN: "NATS authentication token",
  AX_NATS_NKEY: "NATS NKey user seed (SU…) or a file holding it",
  AX_NATS_CREDS: "NATS credentials file (JWT + seed, from nsc)",
  AX_NATS_TLS_CA: "CA certificate file to trust for NATS TLS",
  AX_NATS_TLS_CERT: "client certificate file for NATS TLS (with AX_NATS_TLS_KEY)",
  AX_NATS_TLS_KEY: "client private key file for NATS TLS",
  AX_NATS_INBOX_PREFIX: "reply subject prefix instead of _INBOX (per-user inboxes with NATS permissions, see deploy/nats)",
};
/** Variables whose values are secrets: never printed, not even in a configuration error. */
export const SECRET_VARS = new Set(["AX_NATS_PASSWORD", "AX_NATS_TOKEN", "AX_NATS_NKEY"]);

export const NAMESPACE_RE = /^[a-z][a-z0-9_]{0,31}$/;

/** A refused setting, named with its value, except that secrets (passwords in URLs, tokens, seeds) never appear. */
function fail(variable: string, value: string, why: string): never {
  const shown = SECRET_VARS.has(variable) ? "(secret, not shown)" : redactUrl(value);
  throw new AxError("AX_E_CONFIG", `${variable}=${JSON.stringify(shown)}: ${why}`, { field: variable, value: shown });
}

function url(variable: string, value: string, protocols: string[]): string {
  for (const part of value.split(",")) {
    let u: URL;
    try { u = new URL(part.trim()); } catch { fail(variable, value, "not a URL"); }
    if (!protocols.includes(u.protocol)) fail(variable, value, `expected ${protocols.join(" or ")} URL`);
    // The password of a Redis or PostgreSQL URL goes to its driver as is; it must still never be printed.
    if (u.password) registerSecret(decodeURIComponent(u.password));
  }
  return value;
}

function readableFile(variable: string, path: string): string {
  try { accessSync(path, constants.R_OK); } catch { fail(variable, path, "not a readable file"); }
  return path;
}

/**
 * NATS servers and credentials from AX_NATS_* (and any user:password@ or token@ in the URL,
 * which the NATS client would otherwise drop). Exported alone for the executor SDK.
 */
export function loadNatsSettings(env: NodeJS.ProcessEnv = process.env, overrides: Partial<Record<string, string>> = {}): NatsSettings {
  const get = (k: string): string | undefined => { const v = overrides[k] ?? env[k]; return v === undefined || v === "" ? undefined : v; };
  const raw = get("AX_NATS_URL") ?? ENV_DEFAULTS.AX_NATS_URL!;
  url("AX_NATS_URL", raw, ["nats:", "tls:", "ws:", "wss:"]);
  const out: NatsSettings = { servers: [] };
  let urlUser: string | undefined; let urlPass: string | undefined;
  for (const part of raw.split(",")) {
    const u = new URL(part.trim());
    if (u.username) { urlUser = decodeURIComponent(u.username); urlPass = u.password ? decodeURIComponent(u.password) : undefined; }
    u.username = ""; u.password = "";
    out.servers.push(u.toString().replace(/\/$/, ""));
  }
  // nats://token@host is a token; nats://user:pass@host a user and password (the NATS convention).
  if (urlUser !== undefined && urlPass === undefined) { out.token = urlUser; registerSecret(urlUser); }
  else if (urlUser !== undefined) { out.user = urlUser; out.password = urlPass!; }
  const user = get("AX_NATS_USER"); const password = get("AX_NATS_PASSWORD"); const token = get("AX_NATS_TOKEN");
  if (user !== undefined) out.user = user;
  if (password !== undefined) out.password = password;
  if (token !== undefined) out.token = token;
  if (out.password !== undefined) registerSecret(out.password);
  if (out.token !== undefined) registerSecret(out.token);
  if (out.password !== undefined && out.user === undefined) fail("AX_NATS_USER", "", "AX_NATS_PASSWORD is set but no user");
  if (out.user !== undefined && out.password === undefined) fail("AX_NATS_PASSWORD", "", `AX_NATS_USER is set (${out.user}) but no password`);
  const nkey = get("AX_NATS_NKEY");
  if (nkey !== undefined) {
    registerSecret(nkey);
    let seed = nkey.trim();
    if (!/^S[A-Z2-7]{20,}$/.test(seed)) {
      // Not a seed: a file holding one (its path is not secret; its content is).
      let text: string;
      try { text = readFileSync(nkey, "utf8"); } catch { fail("AX_NATS_NKEY", nkey, "neither an NKey seed (SU…) nor a readable file holding one"); }
      const m = /\bS[A-Z2-7]{20,}\b/.exec(text);
      if (!m) fail("AX_NATS_NKEY", nkey, "the file holds no NKey seed (SU…)");
      seed = m[0];
    }
    registerSecret(seed);
    out.nkeySeed = seed;
  }
  const creds = get("AX_NATS_CREDS");
  if (creds !== undefined) out.credsFile = readableFile("AX_NATS_CREDS", creds);
  const methods = [out.user !== undefined && "user/password", out.token !== undefined && "token", out.nkeySeed !== undefined && "NKey", out.credsFile !== undefined && "creds file"].filter(Boolean);
  if (methods.length > 1) fail(out.token !== undefined ? "AX_NATS_TOKEN" : out.nkeySeed !== undefined ? "AX_NATS_NKEY" : "AX_NATS_CREDS", "", `choose one way to authenticate to NATS (got ${methods.join(", ")})`);
  const ca = get("AX_NATS_TLS_CA"); const cert = get("AX_NATS_TLS_CERT"); const key = get("AX_NATS_TLS_KEY");
  if (ca !== undefined) out.tlsCa = readableFile("AX_NATS_TLS_CA", ca);
  if (cert !== undefined) out.tlsCert = readableFile("AX_NATS_TLS_CERT", cert);
  if (key !== undefined) out.tlsKey = readableFile("AX_NATS_TLS_KEY", key);
  if ((out.tlsCert === undefined) !== (out.tlsKey === undefined)) fail(out.tlsCert === undefined ? "AX_NATS_TLS_CERT" : "AX_NATS_TLS_KEY", "", "a client certificate needs both AX_NATS_TLS_CERT and AX_NATS_TLS_KEY");
  const inbox = get("AX_NATS_INBOX_PREFIX");
  if (inbox !== undefined) {
    if (!/^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/.test(inbox)) fail("AX_NATS_INBOX_PREFIX", inbox, "must be a NATS subject without wildcards");
    out.inboxPrefix = inbox;
  }
  return out;
}


function oneOf<const T extends string>(variable: string, value: string, allowed: readonly T[]): T {
  if (!(allowed as readonly string[]).includes(value)) fail(variable, value, `must be ${allowed.slice(0, -1).join(", ")} or ${allowed[allowed.length - 1]}`);
  return value as T;
}

function int(variable: string, value: string, min: number, max: number): number {
  if (!/^\d+$/.test(value)) fail(variable, value, "not a whole number");
  const n = Number(value);
  if (n < min || n > max) fail(variable, value, `must be between ${min} and ${max}`);
  return n;
}

/** "64KB", "1MB", "512" (bytes); binary multiples. */
function bytes(variable: string, value: string, min: number, max: number): number {
  const m = /^(\d+)\s*(b|kb|kib|k|mb|mib|m|gb|gib|g)?$/i.exec(value.trim());
  if (!m) fail(variable, value, "not a size (e.g. 512, 64KB, 1MB)");
  const unit = (m[2] ?? "b").toLowerCase()[0];
  const n = Number(m[1]) * (unit === "k" ? 1024 : unit === "m" ? 1024 ** 2 : unit === "g" ? 1024 ** 3 : 1);
  if (n < min || n > max) fail(variable, value, `must be between ${min} and ${max} bytes`);
  return n;
}

function dur(variable: string, value: string, opts: { allowZero?: boolean } = {}): number {
  try { return parseDuration(variable, value, opts); } catch { fail(variable, value, `not a duration (e.g. ${opts.allowZero ? "0s, " : ""}500ms, 10s, 5m)`); }
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
  const nats = loadNatsSettings(env, overrides);
  const cfg: AxConfig = {
    natsUrl: nats.servers.join(","),
    nats,
    redisUrl: get("AX_REDIS_URL"),
    redis: redisTarget(get, env, overrides),
    pgUrl: url("AX_PG_URL", get("AX_PG_URL"), ["postgres:", "postgresql:"]),
    namespace,
    shardCount: int("AX_SHARDS", get("AX_SHARDS"), 1, 4096),
    tickMs: dur("AX_TICK", get("AX_TICK")),
    leadMs: dur("AX_LEAD", get("AX_LEAD")),
    releaser: oneOf("AX_RELEASER", get("AX_RELEASER"), ["thread", "inline"] as const),
    wheelSize: int("AX_WHEEL_SIZE", get("AX_WHEEL_SIZE"), 8, 1 << 20),
    maxInFlightPerExecutor: int("AX_MAX_IN_FLIGHT", get("AX_MAX_IN_FLIGHT"), 1, 10_000_000),
    spreadRate: int("AX_SPREAD_RATE", get("AX_SPREAD_RATE"), 0, 10_000_000),
    maxAhead: int("AX_MAX_AHEAD", get("AX_MAX_AHEAD"), 0, 10_000_000),
    deadAfter: int("AX_DEAD_AFTER", get("AX_DEAD_AFTER"), 1, 1000),
    leaseTtlMs: dur("AX_LEASE_TTL", get("AX_LEASE_TTL")),
    deliveryGraceMs: dur("AX_DELIVERY_GRACE", get("AX_DELIVERY_GRACE"), { allowZero: true }),
    taskWriteDeferMs: dur("AX_TASK_WRITE_DEFER", get("AX_TASK_WRITE_DEFER"), { allowZero: true }),
    heartbeatMs: dur("AX_HEARTBEAT", get("AX_HEARTBEAT")),
    retentionMs: dur("AX_RETENTION", get("AX_RETENTION")),
    logLevel: get("AX_LOG_LEVEL"),
    replicas: int("AX_REPLICAS", get("AX_REPLICAS"), 1, 5),
    httpHost: get("AX_HTTP_HOST"),
    httpTokensFile: (overrides.AX_HTTP_TOKENS_FILE ?? env.AX_HTTP_TOKENS_FILE) ? readableFile("AX_HTTP_TOKENS_FILE", (overrides.AX_HTTP_TOKENS_FILE ?? env.AX_HTTP_TOKENS_FILE)!) : null,
    limits: {
      httpBodyBytes: bytes("AX_HTTP_MAX_BODY", get("AX_HTTP_MAX_BODY"), 1024, 1024 ** 3),
      // A run's payload travels in one dispatch message: NATS refuses messages over max_payload (1 MB by default).
      payloadBytes: bytes("AX_MAX_PAYLOAD", get("AX_MAX_PAYLOAD"), 16, 512 * 1024),
      payloadDepth: int("AX_MAX_PAYLOAD_DEPTH", get("AX_MAX_PAYLOAD_DEPTH"), 1, 1000),
    },
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
    /** Messages no node could process, parked with the reason (protocol/deadLetter.ts). */
    deadStream: `${upper}_DEAD`,
    deadSubject: (consumer: string) => `${namespace}.dead.${consumer}`,
    deadWildcard: `${namespace}.dead.>`,
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
    /** Core NATS, every instance of the executor listens: `ax run cancel` asks the one running the run to abort it. */
    executorCancelSubject: (executor: string) => `${namespace}.executor.${executor}.cancel`,
  };
}
export type Names = ReturnType<typeof names>;
