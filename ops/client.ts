import { userInfo } from "node:os";
import { createInbox, headers, type NatsConnection } from "@nats-io/transport-node";
import { AxError, connectNats, loadNatsSettings, names, type NatsSettings } from "../common/index.ts";
import type { Envelope } from "./envelope.ts";

/** Talks to any node of the cluster over NATS request/reply: the CLI needs only AX_NATS_URL. */
export class AxClient {
  /** Who calls, for the audit trail: the NATS user if there is one, else the OS user (self-declared: NATS permissions are the control). */
  private readonly caller: string;
  private constructor(private readonly nc: NatsConnection, private readonly namespace: string, user?: string, private readonly inboxPrefix?: string) {
    let os = "unknown";
    try { os = userInfo().username; } catch { /* no passwd entry */ }
    this.caller = user ? `nats:${user}` : `os:${os}`;
  }
  /** `nats`: the configuration's NATS settings (credentials, TLS), or a bare URL without credentials. */
  static async connect(nats: NatsSettings | string, namespace: string): Promise<AxClient> {
    const s = typeof nats === "string" ? loadNatsSettings({}, { AX_NATS_URL: nats }) : nats;
    const nc = await connectNats(s, { name: "ax-cli", timeout: 3000, maxReconnectAttempts: 0 });
    return new AxClient(nc, namespace, s.user, s.inboxPrefix);
  }
  /**
   * One operation. A list answer too large for one NATS message comes in pages (the node says
   * where the next one starts); they are fetched here and joined, so callers see one list.
   */
  async call<T = unknown>(op: string, args: Record<string, unknown> = {}, timeoutMs = 15_000): Promise<T> {
    let env = await this.callOnce<T>(op, args, timeoutMs);
    if (!env.ok || !env.next) return this.value(env);
    const all: unknown[] = [...(env.value as unknown[])];
    for (let pages = 1; env.ok && env.next && pages < 10_000; pages++) {
      env = await this.callOnce<T>(op, { ...args, ...env.next }, timeoutMs);
      if (env.ok) all.push(...(env.value as unknown[]));
    }
    return env.ok ? all as T : this.value(env);
  }
  private value<T>(env: Envelope<T> & { next?: Record<string, unknown> }): T {
    if (!env.ok) throw AxError.fromJSON(env.error);
    return env.value;
  }
  private async callOnce<T>(op: string, args: Record<string, unknown>, timeoutMs: number): Promise<Envelope<T> & { next?: Record<string, unknown> }> {
    let reply;
    try {
      const h = headers();
      h.set("Ax-Caller", this.caller);
      reply = await this.nc.request(names(this.namespace).apiSubject(op), JSON.stringify(args), { timeout: timeoutMs, headers: h });
    } catch (e) {
      const msg = String((e as Error).message ?? e);
      if (/permissions? violation/i.test(msg)) throw new AxError("AX_E_FORBIDDEN", `NATS does not allow this user to call ${op} (Permissions Violation on ${names(this.namespace).apiSubject(op)}): ask for a NATS user with operator permissions`, { field: "op", value: op });
      if (/no responders|503/i.test(msg)) throw new AxError("AX_E_UNAVAILABLE", `no ax node is running in namespace "${this.namespace}" (start one with: ax node)`, { field: "AX_NAMESPACE", value: this.namespace });
      throw new AxError("AX_E_TIMEOUT", `the cluster did not answer ${op} in ${timeoutMs}ms: ${msg}`);
    }
    return JSON.parse(new TextDecoder().decode(reply.data)) as Envelope<T> & { next?: Record<string, unknown> };
  }
  /**
   * A fresh inbox for messages a node sends besides its reply (an apply's progress), or null when
   * this connection uses its own inbox prefix (least-privilege NATS users, deploy/nats: a node
   * may only answer those with its one reply).
   */
  progressInbox(): string | null { return this.inboxPrefix ? null : createInbox(); }
  /** Messages on `subject` (JSON) to `fn` until the returned function is called. */
  async subscribe<T>(subject: string, fn: (value: T) => void): Promise<() => void> {
    const sub = this.nc.subscribe(subject, { callback: (err, m) => { if (!err) { try { fn(m.json<T>()); } catch { /* not JSON: ignored */ } } } });
    await this.nc.flush();
    return () => sub.unsubscribe();
  }
  async close(): Promise<void> { await this.nc.drain().catch(() => undefined); }
}
