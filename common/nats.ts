import { readFileSync } from "node:fs";
import { connect, credsAuthenticator, nkeyAuthenticator, type ConnectionOptions, type NatsConnection } from "@nats-io/transport-node";
import type { NatsSettings } from "./config.ts";
import { AxError } from "./errors.ts";
import { redact } from "./redact.ts";

const AUTH_HINT = "set AX_NATS_USER/AX_NATS_PASSWORD, AX_NATS_TOKEN, AX_NATS_NKEY or AX_NATS_CREDS (or credentials in AX_NATS_URL)";

/** The one place NATS connect options are built from the configuration (node, CLI, executor SDK, tests). */
export function natsConnectOptions(s: NatsSettings, extra: Partial<ConnectionOptions> = {}): ConnectionOptions {
  // noAsyncTraces: otherwise every request (each JetStream publish and ack) builds an Error for
  // its caller's stack, used only if it fails: ~5 % of a busy node's CPU in profiles. Failures keep
  // their message and cause; only the async caller frames go.
  const o: ConnectionOptions = { servers: s.servers, noAsyncTraces: true, ...extra };
  if (s.inboxPrefix !== undefined) o.inboxPrefix = s.inboxPrefix;
  if (s.user !== undefined) { o.user = s.user; o.pass = s.password ?? ""; }
  if (s.token !== undefined) o.token = s.token;
  if (s.nkeySeed !== undefined) o.authenticator = nkeyAuthenticator(new TextEncoder().encode(s.nkeySeed));
  if (s.credsFile !== undefined) {
    const file = s.credsFile;
    // Read at each (re)connect: a rotated creds file is picked up without a restart.
    o.authenticator = credsAuthenticator(() => new Uint8Array(readFileSync(file)));
  }
  if (s.tlsCa !== undefined || s.tlsCert !== undefined || s.servers.some((u) => /^tls:/i.test(u))) {
    o.tls = {
      ...(s.tlsCa !== undefined ? { caFile: s.tlsCa } : {}),
      ...(s.tlsCert !== undefined ? { certFile: s.tlsCert } : {}),
      ...(s.tlsKey !== undefined ? { keyFile: s.tlsKey } : {}),
    };
  }
  return o;
}

function hasCredentials(s: NatsSettings): boolean {
  return s.user !== undefined || s.token !== undefined || s.nkeySeed !== undefined || s.credsFile !== undefined;
}

/**
 * A connection failure in words an operator can act on, never with a secret in it:
 * refused credentials (AX_E_AUTH: CLI exit code 4), TLS needed or refused (AX_E_AUTH),
 * a server that cannot be reached (AX_E_UNAVAILABLE).
 */
export function natsFailure(e: unknown, s: NatsSettings): AxError {
  const raw = String((e as Error)?.message ?? e);
  const chain = [raw, String(((e as Error)?.cause as Error | undefined)?.message ?? "")].join(" ");
  const where = s.servers.join(",");
  if (/authorization violation|authentication|auth(orization)? (error|failed)|user authentication expired|nkey|signature/i.test(chain)) {
    return new AxError("AX_E_AUTH", hasCredentials(s)
      ? `NATS at ${where} refused the credentials (Authorization Violation): check ${AUTH_HINT.replace(/^set /, "")}`
      : `NATS at ${where} requires credentials (Authorization Violation): ${AUTH_HINT}`, { field: "AX_NATS_USER", cause: e });
  }
  if (/tls|ssl|certificate|self.signed|handshake/i.test(chain)) {
    return new AxError("AX_E_AUTH", `TLS with NATS at ${where} failed (${redact(raw)}): set AX_NATS_TLS_CA (the server's CA) and, if the server asks for a client certificate, AX_NATS_TLS_CERT and AX_NATS_TLS_KEY`, { field: "AX_NATS_TLS_CA", cause: e });
  }
  if (/timeout/i.test(chain) && s.tlsCa !== undefined && s.tlsCert === undefined) {
    // A server that requires a client certificate closes the TLS session without a word: the client only sees a timeout.
    return new AxError("AX_E_AUTH", `NATS at ${where} did not complete the TLS handshake (timeout): if it requires a client certificate, set AX_NATS_TLS_CERT and AX_NATS_TLS_KEY`, { field: "AX_NATS_TLS_CERT", cause: e });
  }
  return new AxError("AX_E_UNAVAILABLE", `cannot reach NATS at ${where} (AX_NATS_URL): ${redact(raw)}`, { field: "AX_NATS_URL", value: where, cause: e });
}

/**
 * Connects with the configured credentials, failing within `timeoutMs` with natsFailure()'s
 * reason instead of waiting forever on a server that refuses or never answers.
 */
export async function connectNats(s: NatsSettings, extra: Partial<ConnectionOptions> = {}): Promise<NatsConnection> {
  try {
    return await connect(natsConnectOptions(s, { timeout: 5000, ...extra }));
  } catch (e) {
    throw natsFailure(e, s);
  }
}
