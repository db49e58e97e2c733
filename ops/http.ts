import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { AxError } from "../common/index.ts";
import { errEnvelope, okEnvelope } from "./envelope.ts";
import { DASHBOARD_HTML } from "./dashboard.ts";
import type { AxNode } from "./node.ts";

export interface HttpServer { address: string; close(): Promise<void> }

const READ_OPS = new Set(["task.ls", "task.show", "task.preview", "runs", "why", "status", "shards.ls", "dag"]);

async function body(req: IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  if (!chunks.length) return {};
  return JSON.parse(Buffer.concat(chunks).toString("utf8")) as Record<string, unknown>;
}

/** `/healthz` (alive), `/readyz` (503 with the reasons when not ready), `/metrics` (Prometheus), `/api/<op>` (GET for reads with query args, POST JSON for all), `/` the dashboard. */
export async function startHttp(node: AxNode, port: number): Promise<HttpServer> {
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? "/", "http://localhost");
    const send = (code: number, type: string, data: string) => { res.writeHead(code, { "content-type": type }); res.end(data); };
    void (async () => {
      if (url.pathname === "/healthz") return send(200, "application/json", JSON.stringify({ ok: true, node: node.id, shards: node.ownedShards().length }));
      if (url.pathname === "/readyz") {
        const r = node.readiness();
        return send(r.ready ? 200 : 503, "application/json", JSON.stringify({ ready: r.ready, node: node.id, shards: node.ownedShards().length, reasons: r.reasons, failing: node.failing() }));
      }
      if (url.pathname === "/metrics") return send(200, node.metrics.registry.contentType, await node.metrics.registry.metrics());
      if (url.pathname === "/" || url.pathname === "/index.html") return send(200, "text/html; charset=utf-8", DASHBOARD_HTML);
      if (url.pathname.startsWith("/api/")) {
        const op = url.pathname.slice(5).replace(/\//g, ".");
        let args: Record<string, unknown>;
        try {
          args = req.method === "POST" ? await body(req) : Object.fromEntries(url.searchParams);
        } catch { return send(400, "application/json", JSON.stringify(errEnvelope(new Error("body is not JSON")))); }
        if (req.method !== "POST" && !READ_OPS.has(op)) return send(405, "application/json", JSON.stringify(errEnvelope(new Error(`${op} needs POST`))));
        try {
          return send(200, "application/json", JSON.stringify(okEnvelope(await node.api.call(op, args))));
        } catch (e) {
          const env = errEnvelope(e);
          const code = !env.ok && env.error.code === "AX_E_NOT_FOUND" ? 404 : !env.ok && env.error.code === "AX_E_INTERNAL" ? 500 : 400;
          return send(code, "application/json", JSON.stringify(env));
        }
      }
      send(404, "text/plain", "not found");
    })().catch((e) => send(500, "text/plain", String(e)));
  });
  // Loopback unless told otherwise (AX_HTTP_HOST=0.0.0.0 in a container, so a published port reaches it).
  const host = process.env.AX_HTTP_HOST || "127.0.0.1";
  await new Promise<void>((resolve, reject) => {
    server.once("error", (e: NodeJS.ErrnoException) => reject(e.code === "EADDRINUSE" || e.code === "EACCES"
      ? new AxError("AX_E_CONFIG", `cannot listen on ${host}:${port} (${e.code === "EADDRINUSE" ? "in use: another ax node or demo?" : "not allowed"}); choose another port (ax node --http PORT, AX_DEMO_PORT for the demo)`, { field: "port", value: port })
      : e));
    server.listen(port, host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  return {
    address: `http://127.0.0.1:${addr.port}`,
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(() => r()); }),
  };
}
