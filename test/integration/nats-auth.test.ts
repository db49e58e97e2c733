import { execFileSync, spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { nkeys } from "@nats-io/transport-node";
import { connectNats, loadNatsSettings } from "../../common/index.ts";
import { AxClient } from "../../ops/client.ts";
import { exitCodeOf } from "../../ops/cli.ts";
import { TestCluster } from "../cluster.ts";
import { OwnNatsServer } from "../natsServer.ts";
import { waitFor } from "../helpers.ts";

/** Runs the real CLI with exactly `env` on top of a NATS-free copy of this process's environment. */
function cli(args: string[], env: Record<string, string>, timeoutMs = 20_000): Promise<{ code: number; stdout: string; stderr: string }> {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("AX_NATS")));
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, ["bin/ax.mjs", ...args], { env: { ...base, ...env }, cwd: process.cwd() });
    let stdout = ""; let stderr = "";
    p.stdout.on("data", (d) => (stdout += d)); p.stderr.on("data", (d) => (stderr += d));
    const t = setTimeout(() => { p.kill("SIGKILL"); reject(new Error(`ax ${args.join(" ")} hung; stderr: ${stderr}`)); }, timeoutMs);
    p.on("exit", (code) => { clearTimeout(t); resolve({ code: code ?? -1, stdout, stderr }); });
  });
}

const JS = "jetstream { store_dir: \"{{STORE}}\" }";
const servers: OwnNatsServer[] = [];
const clusters: TestCluster[] = [];
afterAll(async () => {
  await Promise.allSettled(clusters.map((c) => c.teardown()));
  await Promise.allSettled(servers.map((s) => s.stop()));
});
async function server(conf: string): Promise<OwnNatsServer> {
  const s = new OwnNatsServer(`listen: 127.0.0.1:{{PORT}}\n${JS}\n${conf}\n`);
  servers.push(s);
  await s.start();
  return s;
}

describe("NATS authentication", () => {
  it("user/password: node, executor and CLI work with AX_NATS_USER/AX_NATS_PASSWORD; a missing or wrong password is a clear error with exit code 4, not a hang", async () => {
    const s = await server(`authorization { users = [ { user: "ax", password: "pw-SECRET-1" } ] }`);
    const auth = { AX_NATS_URL: s.url, AX_NATS_USER: "ax", AX_NATS_PASSWORD: "pw-SECRET-1" };
    const tc = new TestCluster("natsup", auth);
    clusters.push(tc);
    await tc.startNode("u1");
    await tc.waitForShards();
    const ex = await tc.startExecutor("upx", async () => undefined);
    await ex.registered;
    const created = await cli(["task", "create", "t1", "--executor", "upx", "--every", "1s"], { ...tc.env });
    expect(created.stderr).toBe("");
    expect(created.code).toBe(0);
    await waitFor(async () => (await cli(["runs", "t1", "--json"], { ...tc.env })).stdout.includes("\"success\""), 15_000, "a successful run of t1");

    const none = await cli(["status"], { AX_NAMESPACE: tc.ns, AX_NATS_URL: s.url });
    expect(none.code).toBe(4);
    expect(none.stderr).toMatch(/requires credentials \(Authorization Violation\): set AX_NATS_USER\/AX_NATS_PASSWORD/);
    const wrong = await cli(["status"], { AX_NAMESPACE: tc.ns, AX_NATS_URL: s.url, AX_NATS_USER: "ax", AX_NATS_PASSWORD: "nope-SECRET-2" });
    expect(wrong.code).toBe(4);
    expect(wrong.stderr).toMatch(/refused the credentials \(Authorization Violation\)/);
    expect(wrong.stderr).not.toContain("nope-SECRET-2");
    // Credentials in the URL are honoured (and not printed).
    const inUrl = await cli(["status", "--json"], { AX_NAMESPACE: tc.ns, AX_NATS_URL: s.url.replace("//", "//ax:pw-SECRET-1@") });
    expect(inUrl.code).toBe(0);
    // Flags too.
    const flags = await cli(["--nats", s.url, "--nats-user", "ax", "--nats-password", "pw-SECRET-1", "status", "--json"], { AX_NAMESPACE: tc.ns });
    expect(flags.code).toBe(0);
    // A node without credentials refuses to start with the same reason.
    const node = await cli(["node"], { ...tc.env, AX_NATS_USER: "", AX_NATS_PASSWORD: "" });
    expect(node.code).toBe(4);
    expect(node.stderr).toMatch(/requires credentials/);
  }, 240_000);

  it("token: AX_NATS_TOKEN, --nats-token and nats://TOKEN@host", async () => {
    const s = await server(`authorization { token: "tok-SECRET-3" }`);
    const nc = await connectNats(loadNatsSettings({ AX_NATS_URL: s.url, AX_NATS_TOKEN: "tok-SECRET-3" }));
    await nc.close();
    const viaUrl = await connectNats(loadNatsSettings({ AX_NATS_URL: s.url.replace("//", "//tok-SECRET-3@") }));
    await viaUrl.close();
    const bad = await cli(["status"], { AX_NATS_URL: s.url, AX_NATS_TOKEN: "wrong-SECRET-4" });
    expect(bad.code).toBe(4);
    expect(bad.stderr).toMatch(/refused the credentials/);
    expect(bad.stderr).not.toContain("SECRET");
  });

  it("NKey: AX_NATS_NKEY as a seed or as a file holding it; a wrong seed is refused", async () => {
    const user = nkeys.createUser();
    const seed = new TextDecoder().decode(user.getSeed());
    const s = await server(`authorization { users = [ { nkey: "${user.getPublicKey()}" } ] }`);
    const nc = await connectNats(loadNatsSettings({ AX_NATS_URL: s.url, AX_NATS_NKEY: seed }));
    await nc.close();
    const file = s.file("user.nk", seed + "\n");
    const nc2 = await connectNats(loadNatsSettings({ AX_NATS_URL: s.url, AX_NATS_NKEY: file }));
    await nc2.close();
    const other = new TextDecoder().decode(nkeys.createUser().getSeed());
    const bad = await cli(["status"], { AX_NATS_URL: s.url, AX_NATS_NKEY: other });
    expect(bad.code).toBe(4);
    expect(bad.stderr).toMatch(/refused the credentials/);
    expect(bad.stderr).not.toContain(other);
  });

  it("TLS with a private CA and a client certificate (AX_NATS_TLS_CA/_CERT/_KEY); without them a clear TLS error", async () => {
    const s = new OwnNatsServer("");
    const d = s.file("x", "") && s.dir;
    const ossl = (...a: string[]) => execFileSync("openssl", a, { cwd: d, stdio: "pipe" });
    const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    ossl("req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=ax-test-ca");
    writeFileSync(join(d, "san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    for (const who of ["server", "client"]) {
      ossl("req", ...ec, "-keyout", `${who}.key`, "-out", `${who}.csr`, "-subj", `/CN=${who}`);
      ossl("x509", "-req", "-in", `${who}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", `${who}.pem`, "-days", "1", "-extfile", "san.ext");
    }
    const tls = new OwnNatsServer(`listen: 127.0.0.1:{{PORT}}\n${JS}\ntls { cert_file: "${d}/server.pem", key_file: "${d}/server.key", ca_file: "${d}/ca.pem", verify: true, timeout: 2 }\n`);
    servers.push(s, tls);
    await tls.start();
    const env = { AX_NATS_URL: tls.url, AX_NATS_TLS_CA: `${d}/ca.pem`, AX_NATS_TLS_CERT: `${d}/client.pem`, AX_NATS_TLS_KEY: `${d}/client.key` };
    const nc = await connectNats(loadNatsSettings(env));
    expect(nc.info?.tls_required).toBe(true);
    await nc.close();
    const noCa = await cli(["status"], { AX_NATS_URL: tls.url });
    expect(noCa.code).toBe(4);
    expect(noCa.stderr).toMatch(/TLS|tls/);
    expect(noCa.stderr).toMatch(/AX_NATS_TLS_CA/);
    const noCert = await cli(["status"], { AX_NATS_URL: tls.url, AX_NATS_TLS_CA: `${d}/ca.pem` });
    expect(noCert.code).not.toBe(0);
    expect(noCert.stderr).toMatch(/AX_NATS_TLS_CERT|TLS/);
  });

  it("refuses half or contradictory settings at start-up naming the variable", () => {
    expect(() => loadNatsSettings({ AX_NATS_USER: "a" })).toThrow(/AX_NATS_PASSWORD/);
    expect(() => loadNatsSettings({ AX_NATS_USER: "a", AX_NATS_PASSWORD: "b", AX_NATS_TOKEN: "c" })).toThrow(/choose one way/);
    expect(() => loadNatsSettings({ AX_NATS_CREDS: "/nonexistent/x.creds" })).toThrow(/AX_NATS_CREDS.*not a readable file/);
    expect(() => loadNatsSettings({ AX_NATS_TLS_CERT: "/etc/hostname" })).toThrow(/AX_NATS_TLS_KEY/);
    expect(loadNatsSettings({ AX_NATS_URL: "nats://u:p%40ss@h:4222" })).toMatchObject({ servers: ["nats://h:4222"], user: "u", password: "p@ss" });
  });

  it("a user NATS does not permit on the API subjects gets a 'not allowed' error (exit 4), not a timeout", async () => {
    const s = await server(`authorization { users = [ { user: "ro", password: "ro-SECRET-5", permissions: { publish: { deny: ["x.api.>"] } } } ] }`);
    const c = await AxClient.connect(loadNatsSettings({ AX_NATS_URL: s.url, AX_NATS_USER: "ro", AX_NATS_PASSWORD: "ro-SECRET-5" }), "x");
    try {
      const e = await c.call("status", {}, 3000).then(() => null, (err: unknown) => err);
      expect(e).toMatchObject({ code: "AX_E_FORBIDDEN" });
      expect(exitCodeOf(e)).toBe(4);
    } finally { await c.close(); }
  });
});
