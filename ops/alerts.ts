import type { NatsConnection } from "@nats-io/transport-node";
import type { AlertHooks } from "../actors/index.ts";
import { InvalidInputError, type Clock, type Logger } from "../common/index.ts";
import type { Metrics } from "./metrics.ts";

/** What an alert is about: a run failed for good, a task marked upstream_failed, a scheduled slot not fired. */
export const ALERT_KINDS = ["failed", "upstream_failed", "missed"] as const;
export type AlertKind = (typeof ALERT_KINDS)[number];

export interface AlertEvent {
  kind: AlertKind;
  task: string;
  executor: string;
  runId: string | null;
  /** The error, the upstream's failure, or why the slot was not fired. */
  reason: string;
  atMs: number;
}

export interface AlertHook {
  scope: "task" | "executor";
  target: string;
  nats: string | null;
  webhook: string | null;
  on: AlertKind[];
}

const SUBJECT_RE = /^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/;
const TARGET_RE = /^[A-Za-z0-9_.-]{1,128}$/;

/** Validates the arguments of `alerts.set`: `{ task | executor, nats?, webhook?, on? }`. */
export function parseHook(a: Record<string, unknown>): AlertHook {
  const hasTask = a.task !== undefined && a.task !== null && a.task !== "";
  const hasExec = a.executor !== undefined && a.executor !== null && a.executor !== "";
  if (hasTask === hasExec) throw new InvalidInputError(hasTask ? "executor" : "task", hasTask ? a.executor : a.task, "give exactly one of task or executor");
  const scope = hasTask ? "task" : "executor";
  const target = String(hasTask ? a.task : a.executor);
  if (!TARGET_RE.test(target)) throw new InvalidInputError(scope, target, "not a task or executor name");
  const nats = a.nats === undefined || a.nats === null || a.nats === "" ? null : String(a.nats);
  if (nats !== null && (!SUBJECT_RE.test(nats) || nats.length > 256)) throw new InvalidInputError("nats", nats, "a NATS subject: tokens of letters, digits, _ or - separated by dots, no wildcards");
  const webhook = a.webhook === undefined || a.webhook === null || a.webhook === "" ? null : String(a.webhook);
  if (webhook !== null) {
    let u: URL | null = null;
    try { u = new URL(webhook); } catch { /* refused below */ }
    if (!u || (u.protocol !== "http:" && u.protocol !== "https:")) throw new InvalidInputError("webhook", webhook, "an http:// or https:// URL");
  }
  if (nats === null && webhook === null) throw new InvalidInputError("nats", a.nats, "give a NATS subject, a webhook URL or both");
  const rawOn = a.on === undefined ? [...ALERT_KINDS] : typeof a.on === "string" ? a.on.split(",").map((s) => s.trim()).filter(Boolean) : a.on;
  if (!Array.isArray(rawOn) || !rawOn.length || !rawOn.every((k) => (ALERT_KINDS as readonly unknown[]).includes(k))) {
    throw new InvalidInputError("on", a.on, `a list of ${ALERT_KINDS.join(", ")}`);
  }
  return { scope, target, nats, webhook, on: [...new Set(rawOn as AlertKind[])] };
}

/** `alerts.set`, `alerts.ls`, `alerts.rm` on the namespace's alert_hooks table. */
export async function alertsOp(hooks: AlertHooks, op: string, a: Record<string, unknown>, nowMs: number): Promise<unknown> {
  if (op === "alerts.ls") return hooks.list();
  if (op === "alerts.rm") {
    const scope = a.task !== undefined ? "task" : "executor";
    const target = String(a.task ?? a.executor ?? "");
    if (!(await hooks.remove(scope, target))) throw new InvalidInputError(scope, target, "no alert hook for it", "AX_E_NOT_FOUND");
    return { removed: { scope, target } };
  }
  const h = parseHook(a);
  await hooks.put(h, nowMs);
  return h;
}

/** The Slack-compatible body of an alert: `text` for Slack (and Mattermost, Teams' Slack mode), `ax` with the fields. */
export function alertMessage(e: AlertEvent, ctx: { namespace: string; node: string }) {
  const what = e.kind === "failed" ? "failed (no retries left)" : e.kind === "upstream_failed" ? "is upstream_failed" : "missed a slot";
  const text = `ax [${ctx.namespace}]: task ${e.task} ${what}${e.runId ? ` — run ${e.runId}` : ""}: ${e.reason}`;
  return { text, ax: { ...e, at: new Date(e.atMs).toISOString(), namespace: ctx.namespace, node: ctx.node } };
}

export interface AlertDeps { hooks: AlertHooks; nc: NatsConnection; log: Logger; metrics: Metrics; clock: Clock; namespace: string; node: string; reloadMs?: number; webhookTimeoutMs?: number }

/**
 * Sends alerts for the events of this node's shards to the hooks configured per task (first)
 * or per executor. Best effort: the hooks are re-read at most every `reloadMs`; at most 64
 * deliveries are outstanding (more are dropped and counted as failed); a webhook gets 5 s.
 * A shard that moves mid-event may alert twice or not at all for that event.
 */
export class AlertDispatcher {
  private hooks = new Map<string, AlertHook>();
  private loadedAt = -Infinity;
  private loading: Promise<void> | null = null;
  private outstanding = 0;
  private readonly reloadMs: number;
  constructor(private readonly d: AlertDeps) { this.reloadMs = d.reloadMs ?? 5000; }

  notify(e: AlertEvent): void {
    void this.deliver(e).catch((err) => this.d.log.warn({ err: String(err), task: e.task }, "alert not delivered"));
  }

  /** Delivers one alert (resolves when both channels have answered or failed). */
  async deliver(e: AlertEvent): Promise<void> {
    await this.refresh();
    const hook = this.hooks.get(`task:${e.task}`) ?? this.hooks.get(`executor:${e.executor}`);
    if (!hook || !hook.on.includes(e.kind)) return;
    if (this.outstanding >= 64) { this.d.metrics.alertsSent.inc({ channel: "any", result: "dropped" }); return; }
    this.outstanding++;
    try {
      const body = JSON.stringify(alertMessage(e, { namespace: this.d.namespace, node: this.d.node }));
      const sends: Array<Promise<void>> = [];
      if (hook.nats) {
        try { this.d.nc.publish(hook.nats, body); this.d.metrics.alertsSent.inc({ channel: "nats", result: "ok" }); } catch (err) {
          this.d.metrics.alertsSent.inc({ channel: "nats", result: "failed" });
          this.d.log.warn({ err: String(err), subject: hook.nats }, "alert to NATS failed");
        }
      }
      if (hook.webhook) {
        const url = hook.webhook;
        sends.push(fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body, signal: AbortSignal.timeout(this.d.webhookTimeoutMs ?? 5000) }).then(async (r) => {
          await r.arrayBuffer().catch(() => undefined);
          if (!r.ok) throw new Error(`HTTP ${r.status}`);
          this.d.metrics.alertsSent.inc({ channel: "webhook", result: "ok" });
        }).catch((err) => {
          this.d.metrics.alertsSent.inc({ channel: "webhook", result: "failed" });
          this.d.log.warn({ err: String(err), url: new URL(url).origin }, "alert webhook failed");
        }));
      }
      await Promise.all(sends);
    } finally { this.outstanding--; }
  }

  private refresh(): Promise<void> {
    if (this.d.clock.monotonic() - this.loadedAt < this.reloadMs) return Promise.resolve();
    this.loading ??= (async () => {
      try {
        this.hooks = new Map((await this.d.hooks.list()).map((x) => [`${x.scope}:${x.target}`, x as AlertHook]));
        this.loadedAt = this.d.clock.monotonic();
      } finally { this.loading = null; }
    })();
    return this.loading;
  }
}
