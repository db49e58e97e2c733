import { readFileSync, writeFileSync } from "node:fs";
import { extname } from "node:path";
import { Option, type Command } from "commander";
import { AxError, InvalidInputError } from "../common/index.ts";
import type { AxClient } from "./client.ts";

interface CliKit {
  withClient: <T>(fn: (c: AxClient) => Promise<T>) => Promise<T>;
  print: (json: boolean | undefined, value: unknown, human: () => string) => void;
  out: (s: string) => void;
  parseJson: (field: string, s: string | undefined) => unknown;
}

type Changes = Record<string, { from: unknown; to: unknown }>;
const show = (x: unknown) => (x === null || x === undefined ? "—" : typeof x === "string" ? x : JSON.stringify(x));
const changeLines = (c: Changes | undefined, indent: string) => Object.entries(c ?? {}).map(([k, v]) => `${indent}${k}: ${show(v.from)} → ${show(v.to)}`);

/** The YAML library, loaded only by the commands that read or write files (it is not needed by a node). */
async function yamlLib(): Promise<typeof import("yaml") | null> {
  try { return await import("yaml"); } catch { return null; }
}

/** A jobs file: YAML (JSON is YAML too) or, without the YAML library, JSON. Errors name the line. */
export async function readJobsFile(path: string): Promise<Record<string, unknown>> {
  let text: string;
  try { text = path === "-" ? readFileSync(0, "utf8") : readFileSync(path, "utf8"); } catch (e) { throw new InvalidInputError("-f", path, `cannot be read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`); }
  const y = await yamlLib();
  let doc: unknown;
  if (y && extname(path).toLowerCase() !== ".json") {
    const d = y.parseDocument(text, { prettyErrors: true, uniqueKeys: true });
    if (d.errors.length) {
      const e = d.errors[0]!;
      throw new InvalidInputError("-f", path, `not valid YAML at line ${e.linePos?.[0]?.line ?? "?"}, column ${e.linePos?.[0]?.col ?? "?"}: ${e.message.split("\n")[0]}`);
    }
    doc = d.toJS();
  } else {
    try { doc = JSON.parse(text); } catch (e) { throw new InvalidInputError("-f", path, `not valid JSON (${(e as Error).message})${y ? "" : "; YAML needs the yaml package"}`); }
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) throw new InvalidInputError("-f", path, "must be a mapping with set and tasks (see docs/APPLY.md)");
  return doc as Record<string, unknown>;
}

interface ApplySummary {
  set: string; dryRun: boolean; create: string[]; update: Array<{ name: string; changes: Changes; before?: string[]; after?: string[] }>;
  unchanged: string[]; adopt: string[]; deps: Array<{ task: string; upstream: string; op: "add" | "rm" }>; prune: string[];
}

export function formatApply(r: ApplySummary): string {
  const will = r.dryRun;
  const lines = [`apply set ${r.set}${will ? " (dry run: nothing changed)" : ""}: ${r.create.length} ${will ? "to create" : "created"}, ${r.update.length} ${will ? "to update" : "updated"}, ` +
    `${r.prune.length} ${will ? "to remove" : "removed"}, ${r.unchanged.length} unchanged`];
  for (const n of r.create) lines.push(`+ ${n}`);
  for (const u of r.update) {
    lines.push(`~ ${u.name}`, ...changeLines(u.changes, "    "));
    if (u.before) lines.push(`    next before: ${u.before.join(", ") || "—"}`, `    next after:  ${u.after?.join(", ") || "—"}`);
  }
  for (const n of r.adopt) lines.push(`~ ${n}: taken into set ${r.set}`);
  for (const d of r.deps) lines.push(`${d.op === "add" ? "+" : "-"} ${d.task} after ${d.upstream}`);
  for (const n of r.prune) lines.push(`- ${n}`);
  for (const n of r.unchanged) lines.push(`= ${n} unchanged`);
  return lines.join("\n");
}

/** `ax task update`, `ax task history`, `ax apply`, `ax export`. */
export function registerEditCommands(program: Command, task: Command, k: CliKit): void {
  task.command("update <task>").description("change a task in place (its id and history stay): triggers, zone, DST policy, executor, payload, timeout, retries, backoff, misfire, overlap")
    .option("--executor <e>", "executor that runs it")
    .option("--cron <expr>", "new cron trigger (keeps the zone and DST policy unless given)").option("--tz <zone>", "IANA time zone of the cron trigger")
    .addOption(new Option("--dst-gap <rule>", "cron wall time the clock skips (default: back to the default)").choices(["shift", "skip", "transition", "default"]))
    .addOption(new Option("--dst-repeat <rule>", "cron wall time that happens twice (default: back to the default)").choices(["first", "second", "both", "default"]))
    .option("--every <dur>", "new fixed-rate trigger (slots counted from the update)").option("--fixed-delay <dur>", "new fixed-delay trigger")
    .option("--at <iso>", "new one-shot trigger at an ISO-8601 time").option("--delay <dur>", "new one-shot trigger after DUR")
    .option("--timeout <dur>", "run timeout").option("--retries <n>", "retries after a failure").option("--backoff <dur>", "first retry backoff")
    .option("--backoff-max <dur>", "retry backoff cap")
    .addOption(new Option("--misfire <policy>", "after downtime").choices(["once", "skip", "all"]))
    .addOption(new Option("--overlap <policy>", "a slot due while the previous run is in flight").choices(["forbid", "allow"]))
    .option("--payload <json>", "JSON given to the executor (or @file.json; null clears it)")
    .option("--dry-run", "change nothing: print the changes and the next five times before and after").option("--json")
    .addHelpText("after", "\nThe task's shard applies the change between two fires. A run recorded ahead of its due time\n" +
      "(AX_LEAD) is withdrawn and decided again under the new definition; a running run is not\n" +
      "disturbed. Each change bumps the task's generation, is kept in `ax task history` and the audit\n" +
      "trail, and `ax why` names it for the first run after it.\n" +
      "Examples:\n  ax task update report --cron '30 2 * * *' --tz Europe/Paris --dry-run\n  ax task update report --timeout 5m --retries 3\n")
    .action(async (ref: string, o: Record<string, unknown>) => {
      const args: Record<string, unknown> = { task: ref };
      for (const key of ["executor", "cron", "tz", "every", "fixedDelay", "at", "delay", "timeout", "retries", "backoff", "backoffMax", "misfire", "overlap"]) if (o[key] !== undefined) args[key] = o[key];
      for (const key of ["dstGap", "dstRepeat"]) if (o[key] !== undefined) args[key] = o[key] === "default" ? null : o[key];
      if (o.payload !== undefined) args.payload = o.payload === "null" ? null : k.parseJson("payload", o.payload as string);
      if (Object.keys(args).length === 1) throw new InvalidInputError("task update", ref, "give at least one field to change (see ax task update --help)");
      if (o.dryRun) args.dryRun = true;
      const r = await k.withClient((c) => c.call<{ task: string; changes: Changes; before: string[]; after: string[]; generation: number; unchanged?: boolean; dryRun?: boolean; nextDueAt?: string | null; withdrawn?: string[] }>("task.update", args));
      k.print(o.json as boolean, r, () => {
        const head = r.dryRun ? `task ${r.task} (dry run, generation ${r.generation}): ${r.unchanged ? "nothing would change" : "would change"}`
          : r.unchanged ? `task ${r.task} unchanged (generation ${r.generation})` : `task ${r.task} updated to generation ${r.generation}; next due ${r.nextDueAt ?? "—"}`;
        return [head, ...changeLines(r.changes, "  "), "  next five before:", ...r.before.map((t) => `    ${t}`), "  next five after:", ...r.after.map((t) => `    ${t}`),
          ...(r.withdrawn?.length ? [`  withdrawn and decided again: ${r.withdrawn.join(", ")}`] : [])].join("\n");
      });
    });
  task.command("history <task>").description("changes of a task's definition, newest first").option("--limit <n>", "how many", "50").option("--json")
    .action(async (ref: string, o: { limit: string; json?: boolean }) => {
      const rows = await k.withClient((c) => c.call<Array<{ generation: number; at: string; who: string; kind: string; change: Changes }>>("task.history", { task: ref, limit: o.limit }));
      k.print(o.json, rows, () => rows.length ? rows.map((h) => [`generation ${h.generation} at ${h.at} by ${h.who} (${h.kind})`, ...changeLines(h.change, "  ")].join("\n")).join("\n") : "(no changes since it was created)");
    });

  program.command("apply").description("make the tasks of an apply set what a file declares: create, update in place, and with --prune remove")
    .requiredOption("-f, --file <file>", "YAML or JSON file (- for standard input); schema in docs/APPLY.md")
    .option("--set <name>", "the apply set (overrides the file's `set`)")
    .option("--prune", "remove tasks of this set that the file no longer declares (never tasks of other sets or made by hand)")
    .option("--adopt", "take existing tasks of the same name that no set (or another set) manages into this set")
    .option("--dry-run", "change nothing: print what would change").option("--json")
    .addHelpText("after", "\nIdempotent: applying the same file again reports every task unchanged. Tasks are created and\n" +
      "updated upstreams first; a cycle in the file is refused with the cycle named. Updates keep\n" +
      "each task's id and run history.\nExamples:\n  ax apply -f jobs.yaml --dry-run\n  ax apply -f jobs.yaml --prune\n  ax export --set nightly > jobs.yaml\n")
    .action(async (o: { file: string; set?: string; prune?: boolean; adopt?: boolean; dryRun?: boolean; json?: boolean }) => {
      const doc = await readJobsFile(o.file);
      const args: Record<string, unknown> = { ...doc, ...(o.set ? { set: o.set } : {}), ...(o.prune ? { prune: true } : {}), ...(o.adopt ? { adopt: true } : {}), ...(o.dryRun ? { dryRun: true } : {}) };
      if (args.apiVersion !== undefined) { if (args.apiVersion !== "ax/v1") throw new InvalidInputError("apiVersion", args.apiVersion, "must be ax/v1"); delete args.apiVersion; }
      const r = await k.withClient(async (c) => {
        // Progress of a long apply comes to an inbox of ours, one line per change, on standard error.
        const inbox = c.progressInbox();
        const sub = !inbox || o.dryRun || o.json || !process.stderr.isTTY && process.env.AX_PROGRESS !== "1" ? null : await c.subscribe(inbox, (v: { done: number; total: number; what: string }) => {
          process.stderr.write(`[${v.done}/${v.total}] ${v.what}\n`);
        });
        try { return await c.call<ApplySummary>("apply", { ...args, ...(sub ? { progress: inbox } : {}) }, 600_000); } finally { sub?.(); }
      });
      k.print(o.json, r, () => formatApply(r));
    });

  program.command("export").description("write tasks as an apply file (the same format ax apply reads)")
    .option("--set <name>", "only the tasks of this apply set (default: every task)")
    .addOption(new Option("-o, --output <format>", "yaml or json (default: by the file's extension, else yaml)").choices(["yaml", "json"]))
    .option("-f, --file <file>", "write to FILE instead of standard output")
    .action(async (o: { set?: string; output?: "yaml" | "json"; file?: string }) => {
      const doc = await k.withClient((c) => c.call<{ set?: string; tasks: unknown[] }>("export", o.set ? { set: o.set } : {}, 60_000));
      const format = o.output ?? (o.file && extname(o.file).toLowerCase() === ".json" ? "json" : "yaml");
      let text: string;
      if (format === "json") text = JSON.stringify({ apiVersion: "ax/v1", ...doc }, null, 2) + "\n";
      else {
        const y = await yamlLib();
        if (!y) throw new AxError("AX_E_CONFIG", "YAML output needs the yaml package; use -o json", { field: "-o", value: "yaml" });
        text = y.stringify({ apiVersion: "ax/v1", ...doc }, { lineWidth: 0 });
      }
      if (o.file) writeFileSync(o.file, text); else k.out(text.trimEnd());
    });
}
