import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { AxError, type AxErrorCode } from "../common/index.ts";
import { errEnvelope, okEnvelope } from "./envelope.ts";
import { DASHBOARD_CSS, DASHBOARD_HTML, DASHBOARD_JS } from "./dashboard.ts";
import { parseTokensFile, roleAllows, TokenVerifier, type Role } from "./httpAuth.ts";
import type { AxNode } from "./node.ts";

export interface HttpServer { address: string; close(): Promise<void> }

const READ_OPS = new Set(["task.ls", "task.show", "task.preview", "task.history", "export", "runs", "why", "ledger", "status", "shards.ls", "dag", "audit", "run.get", "calendar.ls", "calendar.show", "forecast", "task.search", "failures", "run.show", "alerts.ls", "executors.inflight", "dead.ls"]);
const ADMIN_OPS = new Set(["shards.move", "shards.unpin", "shards.rebalance", "node.drain", "node.undrain"]);
/** The role an operation needs: reads, task writes (operate), cluster placement (admin). */
export const roleFor = (op: string): Role => (READ_OPS.has(op) ? "read" : ADMIN_OPS.has(op) ? "admin" : "operate");

const LOOPBACK_HOSTS = new Set(["127.0.0.1", "::1", "localhost", "[::1]"]);
export const isLoopback = (host: string) => LOOPBACK_HOSTS.has(host) || /^127\.\d+\.\d+\.\d+$/.test(host);

const STATUS: Partial<Record<AxErrorCode, number>> = {
  AX_E_NOT_FOUND: 404, AX_E_INTERNAL: 500, AX_E_UNAVAILABLE: 503, AX_E_TIMEOUT: 503, AX_E_AUTH: 401, AX_E_FORBIDDEN: 403,
  AX_E_TOO_LARGE: 413, AX_E_TASK_RUNNING: 409, AX_E_CONFLICT: 409,
};
export const httpStatusOf = (code: string) => STATUS[code as AxErrorCode] ?? 400;

class HttpRefusal extends AxError {
  constructor(readonly status: number, code: AxErrorCode, message: string, field?: string) { super(code, message, field === undefined ? {} : { field }); }
}

/** The body, streamed with a cap: a 200 MB upload costs at most `max` bytes of memory before the 413. */
async function readBody(req: IncomingMessage, max: number): Promise<Record<string, unknown>> {
  const declared = Number(req.headers["content-length"] ?? 0);
  const tooLarge = () => new HttpRefusal(413, "AX_E_TOO_LARGE", `body: larger than ${max} bytes (AX_HTTP_MAX_BODY)`, "body");
  if (declared > max) throw tooLarge();
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += (c as Buffer).length;
    if (size > max) throw tooLarge();
    chunks.push(c as Buffer);
  }
  if (!size) return {};
  let v: unknown;
  try { v = JSON.parse(Buffer.concat(chunks).toString("utf8")); } catch (e) { throw new HttpRefusal(400, "AX_E_INVALID", `body: not JSON (${(e as Error).message})`, "body"); }
  if (v === null || typeof v !== "object" || Array.isArray(v)) throw new HttpRefusal(400, "AX_E_INVALID", `body: must be a JSON object (got ${v === null ? "null" : Array.isArray(v) ? "an array" : typeof v})`, "body");
  return v as Record<string, unknown>;
}

export interface HttpOptions {
  host: string;
  tokensFile: string | null;
  maxBodyBytes: number;
}

/**
 * `/healthz` (alive), `/readyz` (503 with the reasons when not ready), `/metrics` (Prometheus), `/api/<op>` (GET for reads with query args, POST JSON
 * for all), `/` the dashboard.
 *
 * Who may do what: with a tokens file, every route but `/healthz`, `/readyz` and the dashboard page needs
 * `Authorization: Bearer <name>.<secret>` of a role that allows it (read: reads and /metrics;
 * operate: task writes; admin: shards and drains). Without one the server listens on loopback
 * only and refuses to start elsewhere, and answers only requests addressed to a loopback name
 * (a page on another site cannot reach it by DNS rebinding). Either way a write must be a POST
 * with `Content-Type: application/json` and no `Origin` or this server's own: a page in the
 * operator's browser cannot send one (a cross-site "simple" POST is text/plain).
 */
export async function startHttp(node: AxNode, port: number, opts: HttpOptions): Promise<HttpServer> {
  const tokens = opts.tokensFile ? new TokenVerifier(parseTokensFile(opts.tokensFile)) : null;
  if (!tokens?.size && !isLoopback(opts.host)) {
    throw new AxError("AX_E_CONFIG", `AX_HTTP_HOST=${JSON.stringify(opts.host)}: refusing to serve the API beyond loopback without tokens; set AX_HTTP_TOKENS_FILE (lines from: ax token hash NAME --role read|operate|admin)`, { field: "AX_HTTP_HOST", value: opts.host });
  }
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const send = (code: number, type: string, data: string, headers: Record<string, string> = {}) => {
      if (res.headersSent) { res.end(); return; }
      res.writeHead(code, { "content-type": type, "cache-control": "no-store", "x-content-type-options": "nosniff", ...headers });
      res.end(data);
    };
    const refuse = (e: unknown) => {
      const env = errEnvelope(e);
      const status = e instanceof HttpRefusal ? e.status : env.ok ? 500 : httpStatusOf(env.error.code);
      const headers: Record<string, string> = status === 401 ? { "www-authenticate": "Bearer realm=\"ax\"" } : {};
      // An unread body is not waited for: close the connection after the answer.
      if (status === 413) { headers.connection = "close"; res.once("finish", () => req.destroy()); }
      send(status, "application/json", JSON.stringify(env), headers);
    };
    void (async () => {
      const url = new URL(req.url ?? "/", "http://localhost");
      const hostHeader = (req.headers.host ?? "").replace(/:\d+$/, "");
      if (!tokens && !isLoopback(hostHeader)) throw new HttpRefusal(403, "AX_E_FORBIDDEN", `Host ${JSON.stringify(req.headers.host ?? "")}: without tokens this server answers only requests to 127.0.0.1 or localhost`, "host");
      if (url.pathname === "/healthz") return send(200, "application/json", JSON.stringify({ ok: true, node: node.id, shards: node.ownedShards().length }));
      if (url.pathname === "/readyz") {
        const r = node.readiness();
        return send(r.ready ? 200 : 503, "application/json", JSON.stringify({ ready: r.ready, node: node.id, shards: node.ownedShards().length, reasons: r.reasons, failing: node.failing() }));
      }
      // The dashboard: its script and style are files of this origin (no inline script runs).
      const page = { "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'", "x-frame-options": "DENY" };
      if (url.pathname === "/" || url.pathname === "/index.html") return send(200, "text/html; charset=utf-8", DASHBOARD_HTML, page);
      if (url.pathname === "/ui/app.js") return send(200, "text/javascript; charset=utf-8", DASHBOARD_JS, page);
      if (url.pathname === "/ui/app.css") return send(200, "text/css; charset=utf-8", DASHBOARD_CSS, page);
      const isApi = url.pathname.startsWith("/api/");
      if (!isApi && url.pathname !== "/metrics") return send(404, "text/plain", "not found");
      const op = isApi ? url.pathname.slice(5).replace(/\//g, ".") : "metrics";
      const need: Role = isApi ? roleFor(op) : "read";
      let who = "local";
      if (tokens) {
        const auth = req.headers.authorization ?? "";
        const m = /^Bearer\s+(\S+)$/i.exec(auth);
        if (!m) throw new HttpRefusal(401, "AX_E_AUTH", "this node requires a bearer token: Authorization: Bearer <name>.<secret> (tokens are made with ax token hash)", "authorization");
        const t = await tokens.verify(m[1]!);
        if (!t) throw new HttpRefusal(401, "AX_E_AUTH", "the bearer token is not valid", "authorization");
        if (!roleAllows(t.role, need)) throw new HttpRefusal(403, "AX_E_FORBIDDEN", `token ${t.name} has role ${t.role}; ${op} needs ${need}`, "authorization");
        who = `token:${t.name}`;
      }
      if (!isApi) return send(200, node.metrics.registry.contentType, await node.metrics.registry.metrics());
      let args: Record<string, unknown>;
      if (req.method === "POST") {
        const type = String(req.headers["content-type"] ?? "").split(";")[0]!.trim().toLowerCase();
        if (type !== "application/json") throw new HttpRefusal(415, "AX_E_INVALID", `content-type: writes must be sent as application/json (got ${JSON.stringify(type || "none")})`, "content-type");
        const origin = req.headers.origin;
        if (origin !== undefined && origin !== "null") {
          let host = "";
          try { host = new URL(origin).host; } catch { /* refused below */ }
          if (host !== req.headers.host) throw new HttpRefusal(403, "AX_E_FORBIDDEN", `origin: ${JSON.stringify(origin)} is not this server; writes from other sites are refused`, "origin");
        } else if (origin === "null") throw new HttpRefusal(403, "AX_E_FORBIDDEN", "origin: an opaque origin (null) may not write", "origin");
        if (req.headers["sec-fetch-site"] === "cross-site") throw new HttpRefusal(403, "AX_E_FORBIDDEN", "sec-fetch-site: cross-site writes are refused", "origin");
        args = await readBody(req, opts.maxBodyBytes);
      } else if (req.method === "GET" || req.method === "HEAD") {
        if (!READ_OPS.has(op)) throw new HttpRefusal(405, "AX_E_INVALID", `${op} needs POST`, "method");
        args = Object.fromEntries(url.searchParams);
      } else throw new HttpRefusal(405, "AX_E_INVALID", `method ${req.method}: use GET for reads, POST for writes`, "method");
      return send(200, "application/json", JSON.stringify(okEnvelope(await node.api.call(op, args, { who }))));
    })().catch(refuse);
  });
  // Headers must arrive within 10 s, a whole request within 60 s: a slow client cannot hold connections open forever.
  server.headersTimeout = 10_000;
  server.requestTimeout = 60_000;
  const host = opts.host;
  await new Promise<void>((resolve, reject) => {
    server.once("error", (e: NodeJS.ErrnoException) => reject(e.code === "EADDRINUSE" || e.code === "EACCES"
      ? new AxError("AX_E_CONFIG", `cannot listen on ${host}:${port} (${e.code === "EADDRINUSE" ? "in use: another ax node or demo?" : "not allowed"}); choose another port (ax node --http PORT, AX_DEMO_PORT for the demo)`, { field: "port", value: port })
      : e));
    server.listen(port, host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  return {
    address: `http://${isLoopback(host) || host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host}:${addr.port}`,
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
}

