// Does the installed nats-server lose acknowledged messages of an interest-retention stream on a
// clean restart? (nats-server 2.9.10 does: see protocol/republish.ts, which is what ax does about it.)
//   node --import tsx scripts/nats-interest-restart.ts [interest|limits|workqueue] [--rounds 3]
// Starts its own nats-server (loopback, free port, temp store), a durable pull consumer that acks
// 20 ms after delivery (as ax's readers do, after their write) and a publisher at ~300 msg/s,
// SIGTERMs the server mid-stream, starts it again on the same store, then publishes the last
// messages acknowledged before the stop again under their ids. Prints one JSON line per round:
// `missing` = acknowledged, never delivered; `landedAgain` = re-published and stored anew (lost by
// the server, or consumed before the stop and forgotten by the restarted server's duplicate
// table); the rest answered `duplicate` (still held). Exit code 1 if any round lost a message.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "@nats-io/transport-node";
import { AckPolicy, DeliverPolicy, RetentionPolicy, StorageType, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { freePort } from "../test/natsServer.ts";

const args = process.argv.slice(2);
const retention = args.includes("limits") ? RetentionPolicy.Limits : args.includes("workqueue") ? RetentionPolicy.Workqueue : RetentionPolicy.Interest;
const ri = args.indexOf("--rounds");
const rounds = ri >= 0 ? Number(args[ri + 1]) : 3;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function round(): Promise<boolean> {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), "ax-nats-interest-"));
  let proc: ChildProcess | null = null;
  const start = async () => {
    proc = spawn("nats-server", ["-a", "127.0.0.1", "-p", String(port), "-js", "-sd", dir], { stdio: "ignore" });
    for (let i = 0; i < 100; i++) { try { const c = await connect({ servers: `127.0.0.1:${port}`, reconnect: false }); await c.close(); return; } catch { await sleep(100); } }
    throw new Error("nats-server did not start");
  };
  const stop = async () => { const p = proc!; if (p.exitCode !== null || p.signalCode !== null) return; const exited = new Promise((r) => p.once("exit", r)); p.kill("SIGTERM"); await exited; };
  await start();
  const opts = { servers: `127.0.0.1:${port}`, maxReconnectAttempts: -1, reconnectTimeWait: 250 };
  const nc = await connect(opts);
  const pubNc = await connect(opts);
  try {
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name: "S", subjects: ["s.>"], retention, storage: StorageType.File, duplicate_window: 120e9 });
    // As on ax's events stream: several durables, each on its own subject.
    for (const f of ["a", "b", "c"]) {
      await jsm.consumers.add("S", { durable_name: f, filter_subject: `s.${f}`, ack_policy: AckPolicy.Explicit, deliver_policy: DeliverPolicy.All, ack_wait: 3e9, max_deliver: -1 });
    }
    const delivered = new Set<number>();
    const messages = await (await jetstream(nc).consumers.get("S", "a")).consume({ max_messages: 256, expires: 2000 });
    void (async () => { for await (const m of messages) { delivered.add(m.seq); setTimeout(() => m.ack(), 20); } })();
    const js = jetstream(pubNc);
    const acked: Array<{ id: string; seq: number }> = [];
    let publishing = true;
    const publisher = (async () => {
      for (let i = 0; publishing; i++) {
        for (;;) {
          try { acked.push({ id: `p${i}`, seq: (await js.publish("s.a", "x", { msgID: `p${i}`, timeout: 1000 })).seq }); break; } catch { if (!publishing) return; await sleep(100); }
        }
        await sleep(3);
      }
    })();
    await sleep(300);
    await stop();
    const beforeStop = acked.length;
    await sleep(1000);
    await start();
    await sleep(5000); // unacked deliveries come back after the 3 s ack wait
    publishing = false;
    await publisher;
    const missing = acked.slice(0, beforeStop).filter((a) => !delivered.has(a.seq)).map((a) => a.seq);
    const landedAgain: number[] = [];
    for (const a of acked.slice(Math.max(0, beforeStop - 8), beforeStop)) {
      const ack = await js.publish("s.a", "x", { msgID: a.id });
      if (!ack.duplicate) landedAgain.push(a.seq);
    }
    process.stdout.write(`${JSON.stringify({ retention, acknowledgedBeforeStop: beforeStop, missing, landedAgain })}\n`);
    return missing.length === 0;
  } finally {
    await nc.close().catch(() => undefined);
    await pubNc.close().catch(() => undefined);
    await stop().catch(() => undefined);
    rmSync(dir, { recursive: true, force: true });
  }
}

let ok = true;
for (let i = 0; i < rounds; i++) ok = (await round()) && ok;
process.exit(ok ? 0 : 1);
