import { readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { connectNats, loadNatsSettings } from "../../common/index.ts";
import { TestCluster } from "../cluster.ts";
import { OwnNatsServer } from "../natsServer.ts";
import { testNamespace, waitFor } from "../helpers.ts";

/**
 * deploy/nats/nats.conf as shipped, on a nats-server of this test's own (free loopback port),
 * rewritten only for the test's namespace, port and store: each refusal it promises is tried.
 */
const PW = { AX_NODE_PASSWORD: "node-pw-1234", AX_EXEC_DEMO_PASSWORD: "exec-pw-1234", AX_OPERATOR_PASSWORD: "op-pw-1234" };
let server: OwnNatsServer;
let tc: TestCluster;
let ns = "";
let NS = "";
let execNc: NatsConnection;
let opNc: NatsConnection;

beforeAll(async () => {
  ns = testNamespace("natsperm"); NS = ns.toUpperCase();
  const conf = readFileSync("deploy/nats/nats.conf", "utf8")
    .replace(/^listen: .*$/m, "listen: 127.0.0.1:{{PORT}}")
    .replace(/store_dir: ".*"/, "store_dir: \"{{STORE}}\"")
    .replaceAll("\"ax.", `"${ns}.`)
    .replace(/AX_(DISPATCH|EVENTS|LEASES)/g, `${NS}_$1`);
  server = new OwnNatsServer(conf, PW);
  await server.start();
  const url = server.url;
  const nodeEnv = { AX_NATS_URL: url, AX_NATS_USER: "node", AX_NATS_PASSWORD: PW.AX_NODE_PASSWORD };
  tc = new TestCluster("natsperm", { ...nodeEnv, AX_NAMESPACE: ns });
  await tc.startNode("p1");
  await tc.waitForShards();
  execNc = await connectNats(loadNatsSettings({ AX_NATS_URL: url, AX_NATS_USER: "exec_demo", AX_NATS_PASSWORD: PW.AX_EXEC_DEMO_PASSWORD, AX_NATS_INBOX_PREFIX: "_INBOX_exec_demo" }));
  opNc = await connectNats(loadNatsSettings({ AX_NATS_URL: url, AX_NATS_USER: "operator", AX_NATS_PASSWORD: PW.AX_OPERATOR_PASSWORD, AX_NATS_INBOX_PREFIX: "_INBOX_operator" }));
}, 60_000);
afterAll(async () => {
  await execNc?.close(); await opNc?.close();
  await tc?.teardown().catch(() => undefined);
  await server?.stop();
});

/** The server refuses publishing to `subject` for this user (a request fails at once with a permissions violation). */
async function refused(nc: NatsConnection, subject: string, data = "{}"): Promise<void> {
  const e = await nc.request(subject, data, { timeout: 3000 }).then(() => null, (x: unknown) => x);
  expect(String((e as Error)?.message ?? e), subject).toMatch(/permission/i);
}

describe("deploy/nats: least privilege", () => {
  it("node + executor + CLI (operator) work through it", async () => {
    const envFor = (user: string, pw: string, inbox: string) => ({ AX_NATS_URL: server.url, AX_NAMESPACE: ns, AX_NATS_USER: user, AX_NATS_PASSWORD: pw, AX_NATS_INBOX_PREFIX: inbox });
    const exec = tc.spawn(["executor", "demo", "--name", "demo", "--sleep", "1"], { ...envFor("exec_demo", PW.AX_EXEC_DEMO_PASSWORD, "_INBOX_exec_demo"), AX_NATS_URL: server.url });
    expect(exec.pid).toBeTruthy();
    const op = envFor("operator", PW.AX_OPERATOR_PASSWORD, "_INBOX_operator");
    const cli = (args: string[]) => tc.cli([...args], 60_000).then((r) => r);
    Object.assign(tc.env, op);
    await waitFor(async () => (await cli(["task", "create", "p1", "--executor", "demo", "--every", "1s"])).code === 0, 60_000, "task created by the operator", 500);
    await waitFor(async () => (await cli(["runs", "p1", "--json"])).stdout.includes("\"success\""), 60_000, "a run done by the executor", 500);
  }, 180_000);

  it("an executor may not call the API, forge dispatches, outcomes, triggers, heartbeats, hints, shard commands or leases", async () => {
    for (const s of [`${ns}.api.status`, `${ns}.api.task.rm`, `${ns}.api.executor.register`, `${ns}.api.executor.register.other`, `${ns}.dispatch.demo`,
      `${ns}.outcome.0`, `${ns}.trigger.0`, `${ns}.cluster.heartbeat`, `${ns}.shard.0.cmd`, `${ns}.node.p1.hint`, `$KV.${NS}_LEASES.shard.0`]) await refused(execNc, s);
  });

  it("an executor may not pull or ack another executor's consumer, nor create or delete streams and consumers", async () => {
    for (const s of [`$JS.API.CONSUMER.MSG.NEXT.${NS}_DISPATCH.exec_other`, `$JS.ACK.${NS}_DISPATCH.exec_other.1.1.1.1.1`, `$JS.API.STREAM.DELETE.${NS}_DISPATCH`,
      `$JS.API.CONSUMER.DURABLE.CREATE.${NS}_DISPATCH.exec_demo`, `$JS.API.CONSUMER.CREATE.${NS}_DISPATCH.exec_x.${ns}.dispatch.other`, `$JS.API.CONSUMER.DELETE.${NS}_EVENTS.shard_0_events`,
      `$JS.API.STREAM.PURGE.${NS}_EVENTS`, `$JS.API.CONSUMER.MSG.NEXT.${NS}_EVENTS.shard_0_events`]) await refused(execNc, s);
  });

  it("an executor may not read other users' replies (_INBOX.>)", async () => {
    const sub = execNc.subscribe("_INBOX.>");
    const closed = await Promise.race([sub.closed, new Promise((r) => setTimeout(() => r("still open"), 3000))]);
    expect(String((closed as Error)?.message ?? closed)).toMatch(/permission/i);
  });

  it("an operator may call the API and nothing else: no forged events, shard commands, JetStream or lease writes", async () => {
    const ok = await opNc.request(`${ns}.api.status`, "{}", { timeout: 10_000 });
    expect(JSON.parse(new TextDecoder().decode(ok.data)).ok).toBe(true);
    for (const s of [`${ns}.events.0`, `${ns}.dispatch.demo`, `${ns}.shard.0.cmd`, `${ns}.cluster.heartbeat`, `$JS.API.STREAM.DELETE.${NS}_DISPATCH`, `$KV.${NS}_LEASES.shard.0`]) await refused(opNc, s);
  });
});
