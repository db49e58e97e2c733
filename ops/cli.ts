import { readFileSync } from "node:fs";
import { Command, Option, CommanderError } from "commander";
import { AxError, ENV_DEFAULTS, ENV_DOCS, InvalidInputError, NATS_AUTH_DOCS, OPTIONAL_DOCS, createLogger, loadConfig, parseDuration, redact } from "../common/index.ts";
import { Executor } from "../protocol/index.ts";
import { AxClient } from "./client.ts";
import { AxNode } from "./node.ts";
import { parseTaskSpec } from "./api.ts";
import { demoHandler } from "./demoExecutor.ts";
import { packageVersion } from "./version.ts";
import { hashToken, ROLES, type Role } from "./httpAuth.ts";
import { registerEditCommands } from "./editCli.ts";
import { stringify as toYaml } from "yaml";
import { completionScript } from "./completion.ts";
import { httpHandler, parseAllowList } from "./httpJob.ts";

const USAGE_CODES = new Set(["AX_E_INVALID", "AX_E_CRON_FIELD", "AX_E_TIMEZONE", "AX_E_DURATION", "AX_E_TRIGGER", "AX_E_NOT_FOUND", "AX_E_CYCLE", "AX_E_CONFIG"]);
const CONFLICT_CODES = new Set(["AX_E_TASK_RUNNING", "AX_E_CONFLICT"]);
const AUTH_CODES = new Set(["AX_E_AUTH", "AX_E_FORBIDDEN"]);

/**
 * Exit codes: 0 ok, 1 cluster/runtime failure, 2 bad input (which field, why), 3 refused by
 * state (e.g. task is running), 4 credentials missing or refused, or not permitted, 5 the run
 * `ax run --wait` waited for ended without success.
 */
export function exitCodeOf(e: unknown): number {
  if (e instanceof AxError && e.code === "AX_E_RUN_FAILED") return 5;
  if (e instanceof AxError) return USAGE_CODES.has(e.code) || e.code === "AX_E_TOO_LARGE" ? 2 : CONFLICT_CODES.has(e.code) ? 3 : AUTH_CODES.has(e.code) ? 4 : 1;
  return 1;
}

function envHelp(): string {
  // One column for the names, as wide as the longest of the main list (a longer optional one takes a line's room).
  const w = Math.max(...Object.keys(ENV_DOCS).map((k) => k.length));
  return "\nEnvironment (flags override):\n" + Object.keys(ENV_DOCS).map((k) => `  ${k.padEnd(w)} ${ENV_DOCS[k]}${ENV_DEFAULTS[k] === undefined ? "" : ` [${ENV_DEFAULTS[k]}]`}`).join("\n") +
    "\n" + Object.keys({ ...NATS_AUTH_DOCS, ...OPTIONAL_DOCS }).map((k) => `  ${k.padEnd(w)} ${NATS_AUTH_DOCS[k] ?? OPTIONAL_DOCS[k]}`).join("\n") + "\n";
}

/** Global flags → the variables they override. */
const GLOBAL_FLAGS: Array<[flag: string, opt: string, variable: string]> = [
  ["--nats <url>", "nats", "AX_NATS_URL"], ["--namespace <ns>", "namespace", "AX_NAMESPACE"],
  ["--nats-user <user>", "natsUser", "AX_NATS_USER"], ["--nats-password <password>", "natsPassword", "AX_NATS_PASSWORD"],
  ["--nats-token <token>", "natsToken", "AX_NATS_TOKEN"], ["--nats-nkey <seed-or-file>", "natsNkey", "AX_NATS_NKEY"],
  ["--nats-creds <file>", "natsCreds", "AX_NATS_CREDS"], ["--nats-tls-ca <file>", "natsTlsCa", "AX_NATS_TLS_CA"],
  ["--nats-tls-cert <file>", "natsTlsCert", "AX_NATS_TLS_CERT"], ["--nats-tls-key <file>", "natsTlsKey", "AX_NATS_TLS_KEY"],
];

function parseJsonFlag(field: string, s: string | undefined): unknown {
  if (s === undefined) return undefined;
  const text = s.startsWith("@") ? readFileSync(s.slice(1), "utf8") : s;
  try { return JSON.parse(text); } catch (e) { throw new InvalidInputError(field, s, `not valid JSON (${(e as Error).message})`); }
}

const collect = (v: string, prev: string[]) => [...prev, v];

function table(rows: Array<Record<string, unknown>>, cols: string[]): string {
  if (!rows.length) return "(none)";
  const cells = rows.map((r) => cols.map((c) => (r[c] === null || r[c] === undefined ? "-" : typeof r[c] === "object" ? JSON.stringify(r[c]) : String(r[c]))));
  const w = cols.map((c, i) => Math.min(60, Math.max(c.length, ...cells.map((row) => row[i]!.length))));
  const line = (vals: string[]) => vals.map((v, i) => v.slice(0, 60).padEnd(w[i]!)).join("  ").trimEnd();
  return [line(cols.map((c) => c.toUpperCase())), ...cells.map(line)].join("\n");
}

export function buildProgram(out: (s: string) => void = (s) => process.stdout.write(s + "\n")): Command {
  const program = new Command("ax");
  program.description("ax (Auto eXecution): a distributed task scheduler on NATS JetStream, PostgreSQL and Redis.\n" +
    "Tasks say what to run (an executor + payload); triggers say when (cron, fixed rate, fixed delay, once);\n" +
    "nodes fire them exactly once in effect and record every run, so `ax why RUN` can explain it.")
    .version(packageVersion(), "-V, --version", "print the version")
    .showHelpAfterError("(run with --help for usage)")
    .addHelpText("after", envHelp() + "\nExamples:\n  ax node --http 8080\n  ax executor demo --name demo\n  ax task create hello --executor demo --every 10s\n  ax runs hello\n  ax why <run-id>\n");
  for (const [flag, , variable] of GLOBAL_FLAGS) program.addOption(new Option(flag, `${variable.startsWith("AX_NATS_") && variable !== "AX_NATS_URL" ? "NATS " : ""}(${variable})`));
  program.exitOverride();

  const flagOverrides = (): Record<string, string> => {
    const g = program.opts<Record<string, string | undefined>>();
    const out: Record<string, string> = {};
    for (const [, opt, variable] of GLOBAL_FLAGS) if (g[opt]) out[variable] = g[opt];
    return out;
  };
  const cfg = () => loadConfig(process.env, flagOverrides());
  async function withClient<T>(fn: (c: AxClient) => Promise<T>): Promise<T> {
    const c = cfg();
    const client = await AxClient.connect(c.nats, c.namespace);
    try { return await fn(client); } finally { await client.close(); }
  }
  // -o json|yaml|wide (beside --json) of the command being run, captured before its action.
  let output: string | undefined;
  program.hook("preAction", (_p, cmd) => { output = cmd.opts<{ output?: string }>().output; });
  const print = (json: boolean | undefined, value: unknown, human: (wide: boolean) => string) =>
    out(json || output === "json" ? JSON.stringify(value, null, 2) : output === "yaml" ? toYaml(value).trimEnd() : human(output === "wide"));

  // ---- node ---------------------------------------------------------------------------------
  const node = program.command("node").description("start a scheduler node (or: ax node drain NODE)");
  node.option("--id <id>", "node id (default: host-pid)").option("--http <port>", "serve /healthz, /metrics, /api and the dashboard on this port (0 = any)")
    .option("--shards <n>", "shard count if this node creates the cluster (AX_SHARDS)")
    .action(async (o: { id?: string; http?: string; shards?: string }) => {
      const config = loadConfig(process.env, { ...flagOverrides(), ...(o.shards ? { AX_SHARDS: o.shards } : {}) });
      const httpPort = o.http === undefined ? null : Number(o.http);
      if (httpPort !== null && (!Number.isInteger(httpPort) || httpPort < 0 || httpPort > 65535)) throw new InvalidInputError("--http", o.http, "not a port number");
      const n = new AxNode({ config, ...(o.id ? { nodeId: o.id } : {}), httpPort });
      await n.start();
      process.stderr.write(`ax node ${n.id} running (namespace ${config.namespace}${n.httpAddress ? `, dashboard ${n.httpAddress}` : ""}); Ctrl-C to stop\n`);
      await new Promise<void>((resolve) => {
        const stop = () => { process.off("SIGINT", stop); process.off("SIGTERM", stop); void n.stop().then(resolve); };
        process.on("SIGINT", stop); process.on("SIGTERM", stop);
      });
    });
  node.command("drain <node>").description("move every shard off NODE and keep it off").option("--json").action(async (id: string, o: { json?: boolean }) => {
    const r = await withClient((c) => c.call("node.drain", { node: id }));
    print(o.json, r, () => `node ${id} is draining; its shards move to the others (ax shards ls to watch)`);
  });
  node.command("undrain <node>").description("let NODE own shards again").option("--json").action(async (id: string, o: { json?: boolean }) => {
    const r = await withClient((c) => c.call("node.undrain", { node: id }));
    print(o.json, r, () => `node ${id} may own shards again`);
  });

  // ---- executor -------------------------------------------------------------------------------
  const executorCmd = program.command("executor").description("executors");
  executorCmd.command("demo").description("run a demo executor: sleeps, optionally fails, logs each run")
    .requiredOption("--name <name>", "executor name tasks refer to").option("--sleep <ms>", "time each run takes", "100")
    .option("--fail-rate <f>", "probability 0..1 that a run fails", "0").option("--concurrency <n>", "runs at once", "64")
    .option("--record <file>", "append each completed run id to FILE (for tests)")
    .option("--ack-wait <dur>", "redelivery delay of a dispatch whose executor died (set when the consumer is first created)", "30s")
    .option("--heartbeat <dur>", "how often this instance reports its liveness (ax status flags it dead after three missed)", "5s")
    .action(async (o: { name: string; sleep: string; failRate: string; concurrency: string; record?: string; ackWait: string; heartbeat: string }) => {
      const c = cfg();
      const failRate = Number(o.failRate);
      if (!(failRate >= 0 && failRate <= 1)) throw new InvalidInputError("--fail-rate", o.failRate, "must be a number from 0 to 1");
      const sleepMs = parseDuration("--sleep", o.sleep, { allowZero: true });
      const concurrency = Number(o.concurrency);
      if (!Number.isInteger(concurrency) || concurrency < 1) throw new InvalidInputError("--concurrency", o.concurrency, "must be a whole number >= 1");
      const log = createLogger({ level: c.logLevel, name: "ax-executor" });
      const ackWaitMs = parseDuration("--ack-wait", o.ackWait);
      const ex = new Executor({ name: o.name, namespace: c.namespace, nats: c.nats, concurrency, logger: log, ackWaitMs, heartbeatMs: parseDuration("--heartbeat", o.heartbeat),
        handler: demoHandler({ sleepMs, failRate, ...(o.record ? { recordFile: o.record } : {}), log }) });
      await ex.start();
      process.stderr.write(`demo executor ${o.name} (${ex.instance}) waiting for runs; Ctrl-C to stop\n`);
      await new Promise<void>((resolve) => {
        const stop = () => { void ex.stop().then(resolve); };
        process.once("SIGINT", stop); process.once("SIGTERM", stop);
      });
    });

  executorCmd.command("http").description("an HTTP bridge: runs the tasks of this executor by sending their payload as an HTTP request")
    .option("--name <name>", "executor name tasks refer to (registered with kind http)", "http")
    .option("--allow-host <host>", "a host requests may go to (api.example.com, *.example.com, host:port); repeat or comma-separate; others are refused", collect, [] as string[])
    .option("--concurrency <n>", "requests at once", "64").option("--max-body <bytes>", "bytes of each response body kept on the run", "2048")
    .option("--ack-wait <dur>", "redelivery delay of a dispatch whose executor died (set when the consumer is first created)", "30s")
    .option("--heartbeat <dur>", "how often this instance reports its liveness (ax status flags it dead after three missed)", "5s")
    .addHelpText("after", "\nA task of this executor has an HTTP request as its payload (checked when the task is created):\n" +
      "  ax task create ping --executor http --every 1m --retries 2 \\\n" +
      "    --payload '{\"method\":\"POST\",\"url\":\"https://api.example.com/hook\",\"headers\":{\"X-Env\":\"prod\"},\n" +
      "               \"body\":{\"run\":\"{{runId}}\",\"due\":\"{{scheduledAt}}\"},\"timeout\":\"10s\",\"successStatus\":[\"2xx\"]}'\n" +
      "Templates: {{runId}} {{taskId}} {{taskName}} {{attempt}} {{source}} {{scheduledAt}} {{scheduledAtMs}} {{firedAt}} {{firedAtMs}}.\n" +
      "The run keeps the response status and the start of its body (ax runs TASK -o wide, ax why RUN).\n")
    .action(async (o: { name: string; allowHost: string[]; concurrency: string; maxBody: string; ackWait: string; heartbeat: string }) => {
      const c = cfg();
      const allow = parseAllowList(o.allowHost);
      if (!allow.length) throw new InvalidInputError("--allow-host", o.allowHost, "at least one host requests may go to");
      const concurrency = Number(o.concurrency);
      if (!Number.isInteger(concurrency) || concurrency < 1) throw new InvalidInputError("--concurrency", o.concurrency, "must be a whole number >= 1");
      const maxBodyBytes = Number(o.maxBody);
      if (!Number.isInteger(maxBodyBytes) || maxBodyBytes < 0 || maxBodyBytes > 6000) throw new InvalidInputError("--max-body", o.maxBody, "a whole number of bytes from 0 to 6000 (a run's result is at most 8 KB)");
      const log = createLogger({ level: c.logLevel, name: "ax-http" });
      const ex = new Executor({ name: o.name, kind: "http", namespace: c.namespace, nats: c.nats, concurrency, logger: log, ackWaitMs: parseDuration("--ack-wait", o.ackWait), heartbeatMs: parseDuration("--heartbeat", o.heartbeat),
        handler: httpHandler({ allow, maxBodyBytes, log }) });
      await ex.start();
      process.stderr.write(`http executor ${o.name} (${ex.instance}) waiting for runs; allowed hosts: ${o.allowHost.join(",")}; Ctrl-C to stop\n`);
      await new Promise<void>((resolve) => {
        const stop = () => { void ex.stop().then(resolve); };
        process.once("SIGINT", stop); process.once("SIGTERM", stop);
      });
    });

  program.command("completion <shell>").description("print a shell completion script: source <(ax completion bash), or zsh")
    .action((shell: string) => {
      if (shell !== "bash" && shell !== "zsh") throw new InvalidInputError("shell", shell, "bash or zsh");
      out(completionScript(program, shell).trimEnd());
    });

  // ---- HTTP tokens ---------------------------------------------------------------------------
  program.command("token").description("bearer tokens for the HTTP API (AX_HTTP_TOKENS_FILE)").command("hash <name>")
    .description("make a token: prints the token (give it to the client; it is not stored) and the line to add to AX_HTTP_TOKENS_FILE")
    .addOption(new Option("--role <role>", "what the token may do: read (reads, /metrics), operate (task writes), admin (shards, drains)").choices([...ROLES]).default("read"))
    .option("--stdin", "hash the token read from standard input instead of making a new one")
    .action(async (name: string, o: { role: Role; stdin?: boolean }) => {
      let secret: string | undefined;
      if (o.stdin) {
        const chunks: Buffer[] = [];
        for await (const c of process.stdin) chunks.push(c as Buffer);
        const text = Buffer.concat(chunks).toString("utf8").trim();
        secret = text.startsWith(`${name}.`) ? text.slice(name.length + 1) : text;
      }
      const r = await hashToken(name, o.role, secret);
      out(`token: ${r.token}`);
      out(`line:  ${r.line}`);
    });

  // ---- tasks ------------------------------------------------------------------------------------
  const task = program.command("task").description("create, list, inspect and control tasks");
  task.command("create <name>").description("register a task and its trigger")
    .requiredOption("--executor <e>", "executor that runs it")
    .option("--cron <expr>", "cron: 5 fields (min hour dom mon dow) or 6 (seconds first)").option("--tz <zone>", "IANA time zone for --cron", "UTC")
    .addOption(new Option("--dst-gap <rule>", "--cron wall time the clock skips: fire it moved by the jump, not at all, or at the jump (default shift)").choices(["shift", "skip", "transition"]))
    .addOption(new Option("--dst-repeat <rule>", "--cron wall time that happens twice: first, second or both copies (default both if every hour, else first)").choices(["first", "second", "both"]))
    .option("--every <dur>", "fixed rate, e.g. 10s (slots from creation, never drifting)").option("--fixed-delay <dur>", "wait DUR after each run finishes")
    .option("--at <iso>", "once, at an ISO-8601 time with offset").option("--delay <dur>", "once, after DUR")
    .option("--after <task>", "run after TASK succeeds (repeat for fan-in)", collect, [] as string[])
    .option("--timeout <dur>", "run timeout without completion or heartbeat", "30s").option("--retries <n>", "retries after a failure", "0")
    .option("--backoff <dur>", "first retry backoff (doubles, capped, jittered)", "1s")
    .addOption(new Option("--misfire <policy>", "after downtime: one catch-up, none, or every missed slot (bounded)").choices(["once", "skip", "all"]).default("once"))
    .addOption(new Option("--overlap <policy>", "a slot due while the previous run is in flight").choices(["forbid", "allow"]).default("forbid"))
    .option("--payload <json>", "JSON given to the executor (or @file.json)").option("--json", "print the task as JSON")
    .option("--jitter <dur>", "delay each slot's run by 0..DUR, fixed per task and slot (a replay gets the same delay); shorter than the trigger's interval")
    .option("--start <iso>", "fire no slot before this time (ISO-8601 with offset)").option("--end <iso>", "fire no slot after this time; the task completes then")
    .option("--max-runs <n>", "the task completes after N fired slots (catch-ups count; retries, manual and backfill runs do not)")
    .option("--exclude-calendar <name>", "skip slots on the dates of this calendar (ax calendar create), recorded as skipped with the reason excluded")
    .addHelpText("after", "\nExactly one of --cron, --every, --fixed-delay, --at, --delay (or only --after).\nExamples:\n  ax task create report --executor reports --cron '0 2 * * *' --tz Asia/Shanghai --retries 3\n  ax task create push --executor push --after report\n" +
      "  ax task create sync --executor etl --cron '0 * * * *' --jitter 5m --start 2026-12-01T00:00:00Z --end 2027-01-01T00:00:00Z\n" +
      "  ax task create close --executor books --cron '0 18 * * 1-5' --tz Europe/Paris --exclude-calendar fr-holidays --max-runs 20\n")
    .action(async (name: string, o: Record<string, unknown>) => {
      const payload = parseJsonFlag("payload", o.payload as string | undefined);
      const tzGiven = process.argv.includes("--tz");
      const args: Record<string, unknown> = { name, executor: o.executor, timeout: o.timeout, retries: o.retries, backoff: o.backoff, misfire: o.misfire, overlap: o.overlap, after: o.after };
      for (const k of ["cron", "every", "fixedDelay", "at", "delay", "dstGap", "dstRepeat", "jitter", "start", "end", "maxRuns", "excludeCalendar"]) if (o[k] !== undefined) args[k] = o[k];
      if (o.cron !== undefined || tzGiven) args.tz = o.tz;
      if (payload !== undefined) args.payload = payload;
      // Checked here first, by the node's own rules: a bad name, trigger or duration is refused
      // (exit 2, naming the field) even when no node is running, instead of "no ax node is
      // running". The payload's size limits are the node's settings, so only it applies them.
      parseTaskSpec(args, Date.now(), { payloadBytes: Infinity, payloadDepth: Infinity });
      const t = await withClient((c) => c.call<{ id: number; name: string; nextDueAt: string | null; triggers: Array<{ description: string }> }>("task.create", args));
      print(o.json as boolean, t, () => `created task ${t.name} (id ${t.id}): ${t.triggers.map((x) => x.description).join("; ") || "runs after its upstreams"}; next due ${t.nextDueAt ?? "—"}`);
    });
  task.command("ls").description("list tasks").option("--json").option("--limit <n>", "at most N", "1000")
    .option("--state <state>", "only tasks in this state (pending, running, retry, paused, failed, success, cancelled, upstream_failed)")
    .option("--executor <e>", "only tasks of this executor").option("--prefix <text>", "only tasks whose name starts with TEXT")
    .action(async (o: { json?: boolean; limit: string; state?: string; executor?: string; prefix?: string }) => {
      const filters = Object.fromEntries(Object.entries({ state: o.state, executor: o.executor, prefix: o.prefix }).filter(([, v]) => v !== undefined));
      const ts = await withClient((c) => c.call<Array<Record<string, unknown>>>("task.ls", { limit: o.limit, ...filters }));
      print(o.json, ts, (wide) => table(ts.map((t) => ({ ...t, trigger: (t.triggers as Array<{ description: string }>).map((x) => x.description).join("; ") || "after upstreams" })),
        wide ? ["id", "name", "state", "executor", "trigger", "nextDueAt", "shard", "timeout", "retries", "misfire", "overlap", "lastError"] : ["id", "name", "state", "executor", "trigger", "nextDueAt"]));
    });
  task.command("show <task>").description("a task, its triggers, up/downstreams and recent runs").option("--json").action(async (ref: string, o: { json?: boolean }) => {
    const t = await withClient((c) => c.call<Record<string, unknown>>("task.show", { task: ref }));
    print(o.json, t, () => {
      const lines = [`task ${t.name} (id ${t.id}) on shard ${t.shard}: ${t.state}${t.generation ? `, generation ${t.generation} (ax task history)` : ""}${t.applySet ? `, apply set ${t.applySet}` : ""}`, `  executor ${t.executor}, timeout ${t.timeout}, retries ${t.retries}, backoff ${t.backoff}, misfire ${t.misfire}, overlap ${t.overlap}`];
      for (const tr of t.triggers as Array<{ description: string }>) lines.push(`  trigger: ${tr.description}`);
      lines.push(`  next due: ${t.nextDueAt ?? "—"}${t.nextReason ? ` (${t.nextReason})` : ""}`);
      for (const u of t.upstreams as Array<{ name: string; state: string; lastRun: { id: string; state: string } | null }>) lines.push(`  upstream ${u.name}: ${u.state}, last run ${u.lastRun ? `${u.lastRun.id} ${u.lastRun.state}` : "none"}`);
      for (const d of t.downstreams as Array<{ name: string; state: string; lastRun: { id: string; state: string } | null }>) lines.push(`  downstream ${d.name}: ${d.state}, last run ${d.lastRun ? `${d.lastRun.id} ${d.lastRun.state}` : "none"}`);
      lines.push("  recent runs:", ...table(t.recentRuns as Array<Record<string, unknown>>, ["id", "source", "state", "dueAt", "attempt", "error"]).split("\n").map((l) => "    " + l));
      return lines.join("\n");
    });
  });
  task.command("preview <task>").description("the next due times, in the trigger's time zone").option("--count <n>", "how many", "10").option("--json")
    .action(async (ref: string, o: { count: string; json?: boolean }) => {
      type Mark = { at: string | null; utc: string | null; note: string };
      const p = await withClient((c) => c.call<{ task: string; triggers: Array<{ trigger: string; times: string[]; marks?: Mark[] }> }>("task.preview", { task: ref, count: o.count }));
      // A slot a DST rule moved or chose, and a wall time it left out, say so on their line.
      const line = (m: Mark): string => m.at === null ? `  —  ${m.note}` : `  ${m.at}  ${m.utc}${m.note ? `  ← ${m.note}` : ""}`;
      print(o.json, p, () => p.triggers.map((t) => `${t.trigger}:\n${(t.marks ?? t.times.map((at) => ({ at, utc: "", note: "" }))).map(line).join("\n")}`).join("\n") || "(no triggers: runs after its upstreams)");
    });
  for (const [cmd, op, verb] of [["pause", "task.pause", "paused"], ["resume", "task.resume", "resumed"], ["rm", "task.rm", "removed"]] as const) {
    task.command(`${cmd} <task>`).description(cmd === "resume" ? "resume (missed slots follow the misfire policy)" : `${cmd} a task`).option("--json").action(async (ref: string, o: { json?: boolean }) => {
      const r = await withClient((c) => c.call<Record<string, unknown>>(op, { task: ref }));
      print(o.json, r, () => typeof r.message === "string" ? r.message : `task ${ref} ${verb}${r.state ? ` (${r.state}${r.nextDueAt ? `, next due ${r.nextDueAt}` : ""})` : ""}`);
    });
  }
  registerEditCommands(program, task, { withClient, print, out, parseJson: parseJsonFlag });
  task.command("backfill <task>").description("run the task's slots in a past window (source=backfill): each slot once, however often this is run")
    .requiredOption("--from <iso>", "first instant of the window (ISO-8601 with offset)").requiredOption("--to <iso>", "last instant of the window (not in the future)")
    .option("--dry-run", "only list the slots: new, already backfilled, or excluded by the task's calendar").option("--rate <r>", "at most R runs a second", "10").option("--json")
    .addHelpText("after", "\nThe runs are sent in the background by the node that answers; a run still in flight (overlap=forbid) or a full executor\n" +
      "makes it wait. Slots already backfilled are never run again: run the same command to resume an interrupted backfill.\n" +
      "Examples:\n  ax task backfill report --from 2026-11-01T00:00:00Z --to 2026-11-30T23:59:59Z --dry-run\n  ax task backfill report --from 2026-11-01T00:00:00Z --to 2026-11-30T23:59:59Z --rate 2\n")
    .action(async (ref: string, o: { from: string; to: string; dryRun?: boolean; rate: string; json?: boolean }) => {
      type Bf = { task: string; slots: number; toRun: number; alreadyBackfilled: number; excluded: number; rate: number; job: string | null; list?: Array<{ slot: string; status: string; reason?: string }> };
      const r = await withClient((c) => c.call<Bf>("task.backfill", { task: ref, from: o.from, to: o.to, dryRun: !!o.dryRun, rate: o.rate }));
      print(o.json, r, () => [`${r.slots} slot(s) of ${r.task} in the window: ${r.toRun} to run, ${r.alreadyBackfilled} already backfilled, ${r.excluded} excluded`,
        ...(r.list ? r.list.map((x) => `  ${x.slot}  ${x.status}${x.reason ? `  (${x.reason})` : ""}`) : [r.job ? `backfilling ${r.toRun} run(s) at up to ${r.rate}/s (job ${r.job}); ax runs ${r.task} to follow` : "nothing to do"])].join("\n"));
    });
  const deps = task.command("deps").description("dependency edges: TASK runs after UPSTREAM");
  for (const op of ["add", "rm"] as const) {
    deps.command(`${op} <task> <upstream>`).option("--json").action(async (ref: string, up: string, o: { json?: boolean }) => {
      const r = await withClient((c) => c.call(`task.deps.${op}`, { task: ref, upstream: up }));
      print(o.json, r, () => `${ref} ${op === "add" ? "now runs after" : "no longer waits for"} ${up}`);
    });
  }
  program.command("dag <task>").description("the dependency graph around a task").option("--json").action(async (ref: string, o: { json?: boolean }) => {
    const g = await withClient((c) => c.call<{ root: string; nodes: Array<{ id: number; name: string; state: string; lastRun: string | null }>; edges: Array<{ upstream: number; downstream: number }> }>("dag", { task: ref }));
    print(o.json, g, () => {
      const byId = new Map(g.nodes.map((n) => [n.id, n]));
      const label = (id: number) => { const n = byId.get(id)!; return `${n.name} [${n.state}${n.lastRun ? `, last ${n.lastRun}` : ""}]`; };
      const roots = g.nodes.filter((n) => !g.edges.some((e) => e.downstream === n.id));
      const lines: string[] = [];
      const walk = (id: number, depth: number, seen: Set<number>) => {
        lines.push(`${"  ".repeat(depth)}${depth ? "└─ " : ""}${label(id)}`);
        if (seen.has(id)) return;
        seen.add(id);
        for (const e of g.edges.filter((x) => x.upstream === id)) walk(e.downstream, depth + 1, seen);
      };
      for (const r of roots) walk(r.id, 0, new Set());
      return lines.join("\n");
    });
  });

  // ---- calendars -------------------------------------------------------------------------------------
  const calendar = program.command("calendar").description("named calendars of excluded dates (task option --exclude-calendar)");
  calendar.command("create <name>").description("create a calendar (or change one with --replace: the change applies to the slots decided after it)")
    .requiredOption("--dates <list>", "dates YYYY-MM-DD, comma-separated (or @file, one or more a line)")
    .option("--tz <zone>", "read slots' dates in this zone (default: each task's own zone)").option("--replace", "replace the calendar if it exists").option("--json")
    .addHelpText("after", "\nExamples:\n  ax calendar create holidays --dates 2026-12-25,2026-12-26,2027-01-01\n  ax calendar create fr-holidays --dates @fr.txt --tz Europe/Paris --replace\n")
    .action(async (name: string, o: { dates: string; tz?: string; replace?: boolean; json?: boolean }) => {
      const dates = o.dates.startsWith("@") ? readFileSync(o.dates.slice(1), "utf8").split(/[\s,]+/).filter(Boolean).join(",") : o.dates;
      const r = await withClient((c) => c.call<{ name: string; dates: string[]; tz: string | null; replaced: boolean }>("calendar.create", { name, dates, ...(o.tz ? { tz: o.tz } : {}), replace: !!o.replace }));
      print(o.json, r, () => `${r.replaced ? "replaced" : "created"} calendar ${r.name}: ${r.dates.length} date(s)${r.tz ? ` in ${r.tz}` : " (each task's zone)"}`);
    });
  calendar.command("ls").description("list calendars").option("--json").action(async (o: { json?: boolean }) => {
    const rs = await withClient((c) => c.call<Array<Record<string, unknown>>>("calendar.ls"));
    print(o.json, rs, () => table(rs, ["name", "tz", "dates", "updatedAt"]));
  });
  calendar.command("show <name>").description("a calendar's dates").option("--json").action(async (name: string, o: { json?: boolean }) => {
    const r = await withClient((c) => c.call<{ name: string; tz: string | null; dates: string[]; updatedAt: string }>("calendar.show", { name }));
    print(o.json, r, () => `calendar ${r.name}${r.tz ? ` (${r.tz})` : " (each task's zone)"}, updated ${r.updatedAt}:\n${r.dates.map((d) => `  ${d}`).join("\n") || "  (no dates)"}`);
  });
  calendar.command("rm <name>").description("remove a calendar no task uses").option("--json").action(async (name: string, o: { json?: boolean }) => {
    const r = await withClient((c) => c.call("calendar.rm", { name }));
    print(o.json, r, () => `removed calendar ${name}`);
  });

  // ---- forecast --------------------------------------------------------------------------------------
  program.command("forecast").description("runs the schedules will fire in a window, per minute or hour, and the peak; or, with --down-from/--down-to, what an outage would catch up")
    .option("--from <iso>", "start of the window (default now)").option("--to <iso>", "end of the window (default from + 1h; at most 31 days)")
    .option("--executor <e>", "only this executor's tasks").addOption(new Option("--per <unit>", "bucket size").choices(["minute", "hour"]).default("minute"))
    .option("--down-from <iso>", "what-if: the cluster is down from this time").option("--down-to <iso>", "what-if: ... until this time")
    .option("--top <n>", "print the N busiest buckets instead of all", "0").option("--json")
    .addHelpText("after", "\nFixed-delay and dependency-only tasks have no slots of their own and are listed as not forecast; paused tasks are left out.\n" +
      "Examples:\n  ax forecast --from 2026-12-24T00:00:00Z --to 2026-12-25T00:00:00Z --per hour\n  ax forecast --executor etl --to 2026-12-04T00:00:00Z\n" +
      "  ax forecast --down-from 2026-12-24T22:00:00Z --down-to 2026-12-25T02:00:00Z\n")
    .action(async (o: { from?: string; to?: string; executor?: string; per: string; downFrom?: string; downTo?: string; top: string; json?: boolean }) => {
      const args: Record<string, unknown> = { per: o.per };
      for (const k of ["from", "to", "executor", "downFrom", "downTo"] as const) if (o[k] !== undefined) args[k] = o[k];
      type Fc = { from?: string; to?: string; per?: string; total?: number; tasks: number | Array<Record<string, unknown>>; peak?: { at: string; fires: number } | null; buckets?: Array<{ at: string; fires: number }>;
        downFrom?: string; downTo?: string; missed?: number; catchUpRuns?: number; tasksCatchingUp?: number; notForecastCount: number; notForecast: Array<{ task: string; why: string }> };
      const r = await withClient((c) => c.call<Fc>("forecast", args, 120_000));
      const top = Number(o.top);
      print(o.json, r, () => {
        const tail = r.notForecastCount ? [`not forecast: ${r.notForecastCount} task(s), e.g. ${r.notForecast.slice(0, 5).map((x) => `${x.task} (${x.why})`).join("; ")}`] : [];
        if (r.downFrom) {
          return [`down from ${r.downFrom} to ${r.downTo}: ${r.missed} slot(s) missed; ${r.tasksCatchingUp} task(s) would catch up with ${r.catchUpRuns} run(s) at ${r.downTo}, under their misfire policies`,
            table(r.tasks as Array<Record<string, unknown>>, ["task", "executor", "misfire", "missed", "catchUpRuns", "excluded", "firstSlot", "lastSlot"]), ...tail].join("\n");
        }
        const bs = top > 0 ? [...r.buckets!].sort((x, y) => y.fires - x.fires).slice(0, top) : r.buckets!;
        return [`${r.total} run(s) from ${r.from} to ${r.to} (${r.tasks as number} task(s)); peak ${r.peak ? `${r.peak.fires} per ${r.per} at ${r.peak.at}` : "—"}`,
          table(bs.map((b) => ({ ...b, bar: "#".repeat(Math.max(1, Math.round((b.fires / (r.peak?.fires || 1)) * 40))) })), ["at", "fires", "bar"]), ...tail].join("\n");
      });
    });

  // ---- runs ---------------------------------------------------------------------------------------
  program.command("run <task> [run]").description("run a task now (source=manual); refused while it is running unless overlap=allow. `ax run cancel RUN`: cancel a running run")
    .option("--payload <json>", "payload for this run only").option("--force", "run even if the task is paused (never bypasses one-in-flight)")
    .option("--wait", "wait for the outcome (following retries) and exit with it: 0 success, 5 failed / timed out / stale / cancelled")
    .option("--wait-timeout <dur>", "with --wait: give up waiting after DUR (the run goes on)", "1h").option("--json")
    .addHelpText("after", "\nax run cancel RUN aborts the run through its handler's AbortSignal (the run fails for good, no retry).\n" +
      "At an executor with as many runs in flight as its bound, the run is refused (exit 1, recorded `refused`) and nothing runs later on its own: run it again.\n")
    .action(async (ref: string, runArg: string | undefined, o: { payload?: string; force?: boolean; wait?: boolean; waitTimeout: string; json?: boolean }) => {
      if (ref === "cancel" && runArg !== undefined) {
        const r = await withClient((c) => c.call<{ run: string; instance: string }>("run.cancel", { run: runArg }));
        print(o.json, r, () => `run ${r.run} cancelled on instance ${r.instance} (its handler's signal aborted; ax why ${r.run})`);
        return;
      }
      if (runArg !== undefined) throw new InvalidInputError("run", runArg, "unexpected argument (ax run TASK, or ax run cancel RUN)");
      const payload = parseJsonFlag("payload", o.payload);
      const waitMs = o.wait ? parseDuration("--wait-timeout", o.waitTimeout) : 0;
      await withClient(async (c) => {
        const r = await c.call<{ runId: string }>("run", { task: ref, force: !!o.force, ...(payload !== undefined ? { payload } : {}) });
        if (!o.wait) { print(o.json, r, () => `started run ${r.runId} of ${ref} (ax why ${r.runId})`); return; }
        if (!o.json) process.stderr.write(`started run ${r.runId} of ${ref}; waiting for its outcome\n`);
        const end = await waitForRun(c, r.runId, waitMs, (line) => { if (!o.json) process.stderr.write(line + "\n"); });
        print(o.json, end, () => `run ${end.run.id} of ${ref}: ${end.run.state}${end.run.error ? ` (${end.run.error})` : ""}${end.run.result ? ` result ${JSON.stringify(end.run.result).slice(0, 200)}` : ""}`);
        if (end.run.state !== "success") throw new AxError("AX_E_RUN_FAILED", `run ${end.run.id} ended ${end.run.state}${end.run.error ? `: ${end.run.error}` : ""}`, { field: "run", value: end.run.id });
      });
    });
  program.command("runs <task>").description("run history, newest first (--all: with the slots that did not run, and why)").option("--limit <n>", "how many", "20")
    .option("--outcome <states>", "only runs that ended so (comma-separated: success, failed, timed_out, stale, refused, skipped, running)")
    .option("--since <when>", "only runs since an ISO time, or for a duration back (1h)")
    .option("--all", "interleave the slots that did not run (paused, overlap, outage, collapsed, …: recorded intervals) with the runs").option("--json")
    .action(async (ref: string, o: { limit: string; outcome?: string; since?: string; all?: boolean; json?: boolean }) => {
      const rs = await withClient((c) => c.call<Array<Record<string, unknown>>>("runs", { task: ref, limit: o.limit, ...(o.outcome ? { outcome: o.outcome } : {}), ...(o.since ? { since: o.since } : {}), ...(o.all ? { all: true } : {}) }));
      if (o.all) {
        print(o.json, rs, () => table(rs.map((r) => ({ ...r, what: r.kind === "run" ? `${String(r.source)} ${String(r.state)}` : `${String(r.reason)} ×${String(r.slots)}`, id: r.id, from: r.from ?? r.at })), ["at", "kind", "what", "id", "from", "firedAt", "node", "shard", "epoch"]));
        return;
      }
      print(o.json, rs, (wide) => table(rs, wide ? ["id", "source", "state", "dueAt", "firedAt", "startedAt", "finishedAt", "attempt", "node", "shard", "epoch", "executorInstance", "error", "lateOutcome", "result"]
        : ["id", "source", "state", "dueAt", "firedAt", "finishedAt", "attempt", "node", "shard", "epoch", "error"]));
    });
  program.command("why <target>").description("why a run happened and how it ended (ax why RUN); or what happened to a task's slots (ax why TASK --at TIME | --between T1 T2)")
    .option("--at <time>", "an instant (ISO 8601 or epoch ms): the nearest slot of each trigger and its fate")
    .option("--between <times...>", "two instants: every slot in between, by outcome").option("--json")
    .action(async (target: string, o: { at?: string; between?: string[]; json?: boolean }) => {
      if (o.between && o.between.length !== 2) throw new InvalidInputError("between", o.between, "needs two times: --between T1 T2");
      const args = o.at !== undefined ? { task: target, at: o.at } : o.between ? { task: target, from: o.between[0], to: o.between[1] } : { run: target };
      const r = await withClient((c) => c.call<{ sentences: string[] }>("why", args));
      print(o.json, r, () => r.sentences.join("\n"));
    });
  program.command("status").description("nodes, shards, lag, throughput").option("--json").action(async (o: { json?: boolean }) => {
    const s = await withClient((c) => c.call<{ namespace: string; shardCount: number; nodes: Array<{ id: string; http: string | null; shards: number[]; load: { firedPerSec: number; inFlight: number; lagMs: number }; failing?: Record<string, string> }>; unowned: number[]; tasks: number | null; running: number | null; drained: string[]; executors?: ExecutorLine[] }>("status"));
    const failing = s.nodes.flatMap((n) => Object.entries(n.failing ?? {}).map(([d, why]) => `  ${n.id}: ${d} unreachable: ${why}`));
    print(o.json, s, () => [`namespace ${s.namespace}: ${s.nodes.length} node(s), ${s.shardCount} shards (${s.unowned.length} unowned), ${s.tasks ?? "?"} tasks, ${s.running ?? "?"} running${s.drained.length ? `, draining: ${s.drained.join(", ")}` : ""}`,
      table(s.nodes.map((n) => ({ node: n.id, shards: n.shards.length, firesPerSec: n.load.firedPerSec, inFlight: n.load.inFlight, lagMs: n.load.lagMs, failing: Object.keys(n.failing ?? {}).join(",") || "-", http: n.http })), ["node", "shards", "firesPerSec", "inFlight", "lagMs", "failing", "http"]),
      ...(failing.length ? ["failing dependencies:", ...failing] : []),
      ...(s.executors?.length ? ["executors:", table(s.executors.map(executorRow), ["executor", "kind", "live", "instances", "inFlight", "maxInFlight", "lastSeen"])] : [])].join("\n"));
  });

  program.command("audit").description("who changed what, newest first (every write: tasks, runs, executors, shards, drains)")
    .option("--task <task>", "only this task (name or id as it was given)").option("--limit <n>", "how many", "50").option("--json")
    .action(async (o: { task?: string; limit: string; json?: boolean }) => {
      const rows = await withClient((c) => c.call<Array<Record<string, unknown>>>("audit", { limit: o.limit, ...(o.task ? { task: o.task } : {}) }));
      print(o.json, rows, () => table(rows.map((r) => ({ ...r, result: r.ok ? "ok" : `refused: ${String(r.error)}` })), ["at", "who", "op", "task", "args", "result"]));
    });

  // ---- dead letters --------------------------------------------------------------------------------
  const dead = program.command("dead").description("messages no node could process, parked with the reason (dead letters)")
    .addHelpText("after", "\nA node parks an event, outcome or dependency trigger that is malformed, meant for another shard, or failed\n" +
      "on AX_DEAD_AFTER deliveries in a row (default 8) and then alone, while PostgreSQL, Redis and NATS answered: it is copied to the\n" +
      "stream <NS>_DEAD (kept 30 days) with the reason and its original subject, and terminated on its consumer, so it\n" +
      "is not redelivered and no shard restarts on it again. ax_dead_letters_total{cause} counts them.\n" +
      "Examples:\n  ax dead ls\n  ax dead ls --limit 200 --json\n");
  dead.command("ls").description("the parked messages, newest first: when, consumer, cause, reason, original subject and sequence")
    .option("--limit <n>", "how many (1..1000)", "50").option("--json")
    .action(async (o: { limit: string; json?: boolean }) => {
      const rows = await withClient((c) => c.call<Array<Record<string, unknown>>>("dead.ls", { limit: o.limit }));
      print(o.json, rows, () => rows.length ? table(rows, ["seq", "at", "consumer", "cause", "deliveries", "subject", "originalSeq", "reason"]) : "no dead letters");
    });

  // ---- shards --------------------------------------------------------------------------------------
  const shards = program.command("shards").description("shard ownership");
  shards.command("ls").option("--json").action(async (o: { json?: boolean }) => {
    const rs = await withClient((c) => c.call<Array<Record<string, unknown>>>("shards.ls"));
    print(o.json, rs, () => table(rs, ["shard", "owner", "epoch", "pinnedTo", "tasks", "dueSoon", "lagMs"]));
  });
  shards.command("move <shard> <node>").description("pin SHARD to NODE (hands it over)").option("--json").action(async (s: string, n: string, o: { json?: boolean }) => {
    const r = await withClient((c) => c.call("shards.move", { shard: s, node: n }));
    print(o.json, r, () => `shard ${s} pinned to ${n}; hand-over follows within a heartbeat`);
  });
  shards.command("unpin <shard>").option("--json").action(async (s: string, o: { json?: boolean }) => {
    const r = await withClient((c) => c.call("shards.unpin", { shard: s }));
    print(o.json, r, () => `shard ${s} unpinned`);
  });
  shards.command("rebalance").description("move shards to the ring's balanced assignment").option("--dry-run", "only print the plan").option("--json")
    .action(async (o: { dryRun?: boolean; json?: boolean }) => {
      const r = await withClient((c) => c.call<{ moves: Array<{ shard: number; from: string | null; to: string; why: string }> }>("shards.rebalance", { dryRun: !!o.dryRun }));
      print(o.json, r, () => r.moves.length ? `${o.dryRun ? "would move" : "moving"} ${r.moves.length} shard(s):\n` + table(r.moves, ["shard", "from", "to", "why"]) : "balanced: nothing to move");
    });
  // -o json|yaml|wide beside every --json.
  const addOutput = (cmd: Command) => {
    if (cmd.options.some((x) => x.long === "--json")) cmd.addOption(new Option("-o, --output <format>", "json, yaml, or wide (a table with more columns)").choices(["json", "yaml", "wide"]));
    cmd.commands.forEach(addOutput);
  };
  addOutput(program);
  return program;
}

type ExecutorLine = { name: string; kind: string; liveness?: string; dead?: boolean; instances?: number; inFlight?: number; maxInFlight: number | null; maxInFlightFrom?: string; lastSeenAt?: string | null; lastSeenMs: number | null };
function executorRow(e: ExecutorLine): Record<string, unknown> {
  const seen = e.lastSeenMs ?? null;
  const ago = seen === null ? "never" : `${Math.max(0, Math.round((Date.now() - seen) / 1000))}s ago`;
  return { executor: e.name, kind: e.kind, live: e.liveness === "alive" ? "alive" : e.liveness === "dead" ? "DEAD" : "no instance", instances: e.instances ?? "?", inFlight: e.inFlight ?? "?",
    // "(node)": no limit of its own, the node's AX_MAX_IN_FLIGHT applies.
    maxInFlight: e.maxInFlight === null ? "?" : e.maxInFlightFrom === "node" ? `${e.maxInFlight} (node)` : e.maxInFlight, lastSeen: ago };
}

type WaitedRun = { run: { id: string; state: string; error: string | null; result?: unknown }; final: boolean; next: string | null; retryPending: boolean };
/** Polls `run.get` until the run's chain ends (following its retries); gives up after `timeoutMs`. */
async function waitForRun(c: AxClient, runId: string, timeoutMs: number, say: (line: string) => void): Promise<WaitedRun> {
  const until = Date.now() + timeoutMs;
  let id = runId;
  let pause = 200;
  for (;;) {
    const r = await c.call<WaitedRun>("run.get", { run: id });
    if (r.final) return r;
    if (r.next) { say(`run ${id} ended ${r.run.state}${r.run.error ? ` (${r.run.error})` : ""}; retry ${r.next} follows`); id = r.next; pause = 200; continue; }
    if (Date.now() > until) throw new AxError("AX_E_TIMEOUT", `run ${id} has not ended after ${timeoutMs} ms (still ${r.run.state}${r.retryPending ? ", a retry is due" : ""}); it goes on: ax why ${id}`, { field: "run", value: id });
    await new Promise((res) => setTimeout(res, pause));
    pause = Math.min(1000, pause * 2);
  }
}

export async function main(argv: string[]): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync(argv, { from: "user" });
    return 0;
  } catch (e) {
    if (e instanceof CommanderError) {
      if (e.code === "commander.helpDisplayed" || e.code === "commander.help" || e.code === "commander.version") return 0;
      return 2; // commander already printed the reason
    }
    // Whatever the failure quotes (a driver's message, a URL), no configured secret is printed.
    process.stderr.write(`ax: ${redact(e instanceof Error ? e.message : String(e))}\n`);
    return exitCodeOf(e);
  }
}

if (process.argv[1] && /ops[\\/]cli\.[jt]s$|bin[\\/]ax(\.mjs)?$/.test(process.argv[1])) {
  // `ax … | head`: a reader that stops early is not an error; stop quietly instead of a stack trace.
  process.stdout.on("error", (e: NodeJS.ErrnoException) => { if (e.code === "EPIPE") process.exit(0); else throw e; });
  void main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
    // Exit once stdout is flushed: a large answer (ax task ls --limit 100000) was cut off by an early exit.
    if (!process.argv.slice(2).includes("node") && !process.argv.slice(2).includes("executor")) process.stdout.write("", () => setTimeout(() => process.exit(code), 50).unref());
  });
}
