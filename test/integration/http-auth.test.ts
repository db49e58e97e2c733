import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { AxNode } from "../../ops/node.ts";
import { hashToken, parseTokensFile, TokenVerifier } from "../../ops/httpAuth.ts";
import { TestCluster } from "../cluster.ts";

const dir = mkdtempSync(join(tmpdir(), "ax-tokens-"));
const open = new TestCluster("httpopen");
let tokensFile = "";
let secured: TestCluster;
let a: AxNode; let b: AxNode;
const tok: Record<string, string> = {};

beforeAll(async () => {
  const lines: string[] = [];
  for (const role of ["read", "operate", "admin"] as const) {
    const t = await hashToken(`${role}-user`, role);
    tok[role] = t.token;
    lines.push(t.line);
  }
  tokensFile = join(dir, "tokens");
  writeFileSync(tokensFile, `# ax HTTP tokens\n${lines.join("\n")}\n`);
  secured = new TestCluster("httpsec", { AX_HTTP_TOKENS_FILE: tokensFile, AX_HTTP_MAX_BODY: "64KB" });
  a = await open.startNode("o1", { httpPort: 0 });
  b = await secured.startNode("s1", { httpPort: 0 });
  await Promise.all([open.waitForShards(), secured.waitForShards()]);
  for (const tc of [open, secured]) { const ex = await tc.startExecutor("hx", async () => undefined); await ex.registered; }
});
afterAll(async () => {
  await Promise.allSettled([open.teardown(), secured?.teardown()]);
  rmSync(dir, { recursive: true, force: true });
});

const json = { "content-type": "application/json" };
async function post(base: string, op: string, body: unknown, headers: Record<string, string> = json): Promise<{ status: number; body: { ok: boolean; error?: { code: string; field?: string; message: string }; value?: unknown } }> {
  const r = await fetch(`${base}/api/${op}`, { method: "POST", headers, body: typeof body === "string" ? body : JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

describe("HTTP without tokens (loopback only)", () => {
  it("attack: a text/plain POST from any web page (a forged pause) is refused; so is a foreign Origin and a foreign Host (DNS rebinding)", async () => {
    const base = a.httpAddress!;
    expect((await post(base, "task/create", { name: "victim", executor: "hx", every: "1h" })).status).toBe(200);
    const plain = await post(base, "task/pause", { task: "victim" }, { "content-type": "text/plain" });
    expect(plain.status).toBe(415);
    expect(plain.body.error).toMatchObject({ field: "content-type" });
    const foreign = await post(base, "task/pause", { task: "victim" }, { ...json, origin: "https://evil.example" });
    expect(foreign.status).toBe(403);
    expect(foreign.body.error).toMatchObject({ code: "AX_E_FORBIDDEN", field: "origin" });
    const rebinding = await new Promise<number>((resolve, reject) => {
      const u = new URL(base);
      const r = request({ host: u.hostname, port: u.port, path: "/api/status", headers: { host: `evil.example:${u.port}` } }, (res) => { res.resume(); resolve(res.statusCode!); });
      r.on("error", reject); r.end();
    });
    expect(rebinding).toBe(403);
    const show = await (await fetch(`${base}/api/task/show?task=victim`)).json();
    expect(show.value.state).toBe("pending"); // no forged pause was applied
    const same = await post(base, "task/pause", { task: "victim" }, { ...json, origin: base });
    expect(same.status).toBe(200);
  });

  it("refuses to listen beyond loopback without tokens (no port is opened)", async () => {
    const c = new TestCluster("httpany", { AX_HTTP_HOST: "0.0.0.0" });
    try {
      await expect(c.startNode("x1", { httpPort: 0 })).rejects.toMatchObject({ code: "AX_E_CONFIG", field: "AX_HTTP_HOST" });
    } finally { await c.teardown(); }
  });
});

describe("HTTP with bearer tokens (roles read, operate, admin)", () => {
  it("401 without or with a wrong token, 403 for a role that does not allow the operation, 200 otherwise", async () => {
    const base = b.httpAddress!;
    const none = await fetch(`${base}/api/task/ls`);
    expect(none.status).toBe(401);
    expect(none.headers.get("www-authenticate")).toMatch(/Bearer/);
    expect((await none.json()).error.message).toMatch(/requires a bearer token/);
    const wrong = await fetch(`${base}/api/task/ls`, { headers: { authorization: `Bearer ${tok.admin!.slice(0, -2)}xx` } });
    expect(wrong.status).toBe(401);
    expect((await fetch(`${base}/metrics`)).status).toBe(401);
    expect((await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${tok.read}` } })).status).toBe(200);
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    const page = await (await fetch(`${base}/`)).text();
    expect(page).toContain("Bearer token");

    const auth = (role: string) => ({ ...json, authorization: `Bearer ${tok[role]}` });
    expect((await fetch(`${base}/api/task/ls`, { headers: { authorization: `Bearer ${tok.read}` } })).status).toBe(200);
    const readWrite = await post(base, "task/create", { name: "w1", executor: "hx", every: "1h" }, auth("read"));
    expect(readWrite.status).toBe(403);
    expect(readWrite.body.error!.message).toBe("token read-user has role read; task.create needs operate");
    expect((await post(base, "task/create", { name: "w1", executor: "hx", every: "1h" }, auth("operate"))).status).toBe(200);
    expect((await post(base, "shards/unpin", { shard: 0 }, auth("operate"))).status).toBe(403);
    expect((await post(base, "shards/unpin", { shard: 0 }, auth("admin"))).status).toBe(200);
  });

  it("tokens are stored hashed (scrypt) and verified in constant time; the file is validated at start", async () => {
    const entries = parseTokensFile(tokensFile);
    expect([...entries.keys()]).toEqual(["read-user", "operate-user", "admin-user"]);
    const text = (await import("node:fs")).readFileSync(tokensFile, "utf8");
    for (const t of Object.values(tok)) expect(text).not.toContain(t.split(".")[1]);
    const v = new TokenVerifier(entries);
    expect(await v.verify(tok.operate!)).toEqual({ name: "operate-user", role: "operate" });
    expect(await v.verify("nobody.x")).toBeNull();
    const bad = join(dir, "bad");
    writeFileSync(bad, "alice superuser scrypt$16384$8$1$AAAA$BBBB\n");
    expect(() => parseTokensFile(bad)).toThrow(/line 1: role "superuser"/);
  });

  it("attack: a 200 MB body is not buffered: 413 as soon as the cap (AX_HTTP_MAX_BODY) is passed, declared or streamed", async () => {
    const base = b.httpAddress!;
    const h = { ...json, authorization: `Bearer ${tok.operate}` };
    const declared = await post(base, "task/create", JSON.stringify({ name: "big", executor: "hx", every: "1h", payload: "x".repeat(100_000) }), h);
    expect(declared.status).toBe(413);
    expect(declared.body.error).toMatchObject({ code: "AX_E_TOO_LARGE", field: "body" });
    // Streamed without a length: 200 MB offered chunk by chunk; the server answers 413 after 64 KB.
    const u = new URL(base);
    let sent = 0;
    const status = await new Promise<number>((resolve, reject) => {
      const r = request({ host: u.hostname, port: u.port, path: "/api/task/create", method: "POST", headers: { ...h, "transfer-encoding": "chunked" } }, (res) => { res.resume(); resolve(res.statusCode!); });
      r.on("error", (e) => (sent > 64 * 1024 ? resolve(413) : reject(e)));
      const chunk = Buffer.alloc(64 * 1024, 120);
      const pump = () => { while (sent < 200 * 1024 * 1024) { sent += chunk.length; if (!r.write(chunk)) { r.once("drain", pump); return; } } r.end(); };
      pump();
    });
    expect(status).toBe(413);
    expect(sent).toBeLessThan(200 * 1024 * 1024);
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
  });

  it("attack: a null, array or non-JSON body is a 400 naming the body, not a 500", async () => {
    const h = { ...json, authorization: `Bearer ${tok.operate}` };
    for (const body of ["null", "[1]", "{", "42"]) {
      const r = await post(b.httpAddress!, "task/create", body, h);
      expect(r.status).toBe(400);
      expect(r.body.error).toMatchObject({ code: "AX_E_INVALID", field: "body" });
    }
  });

  it("every write is in the audit trail with who, when and what (HTTP token name, NATS caller); ax audit --task T", async () => {
    const base = b.httpAddress!;
    const client = await secured.client();
    await client.call("task.pause", { task: "w1" });
    const r = await fetch(`${base}/api/audit?task=w1`, { headers: { authorization: `Bearer ${tok.read}` } });
    const rows = (await r.json()).value as Array<{ who: string; op: string; task: string; ok: boolean; at: string; args: Record<string, unknown> }>;
    expect(rows.map((x) => [x.op, x.who.split(":")[0], x.ok])).toEqual([["task.pause", "os", true], ["task.create", "token", true]]);
    expect(rows[1]).toMatchObject({ who: "token:operate-user", task: "w1", args: { name: "w1", executor: "hx", every: "1h" } });
    expect(Date.parse(rows[0]!.at)).toBeGreaterThan(Date.now() - 60_000);
    const refused = await client.call("task.create", { name: "w1", executor: "hx", every: "1h" }).then(() => null, (e: unknown) => e);
    expect(refused).toBeTruthy();
    const cli = await secured.cli(["audit", "--task", "w1", "--json"]);
    expect(cli.code).toBe(0);
    const all = JSON.parse(cli.stdout) as Array<{ op: string; ok: boolean; error: string | null }>;
    expect(all[0]).toMatchObject({ op: "task.create", ok: false });
    expect(all[0]!.error).toBeTruthy();
  }, 60_000);
});
