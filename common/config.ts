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
  AX_HTTP_HOST: "127.0.0.1",
  AX_HTTP_MAX_BODY: "1MB",
  AX_MAX_PAYLOAD: "64KB",
  AX_MAX_PAYLOAD_DEPTH: "32",
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

function dur(variable: string, value: string): number {
  try { return parseDuration(variable, value); } catch { fail(variable, value, "not a duration (e.g. 500ms, 10s, 5m)"); }
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
    httpHost: get("AX_HTTP_HOST"),
    httpTokensFile: (overrides.AX_HTTP_TOKENS_FILE ?? env.AX_HTTP_TOKENS_FILE) ? readableFile("AX_HTTP_TOKENS_FILE", (overrides.AX_HTTP_TOKENS_FILE ?? env.AX_HTTP_TOKENS_FILE)!) : null,
    limits: {
      httpBodyBytes: bytes("AX_HTTP_MAX_BODY", get("AX_HTTP_MAX_BODY"), 1024, 1024 ** 3),
      // A run's payload travels in one dispatch message: NATS refuses messages over max_payload (1 MB by default).
      payloadBytes: bytes("AX_MAX_PAYLOAD", get("AX_MAX_PAYLOAD"), 16, 512 * 1024),
      payloadDepth: int("AX_MAX_PAYLOAD_DEPTH", get("AX_MAX_PAYLOAD_DEPTH"), 1, 1000),
    },
  };
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
