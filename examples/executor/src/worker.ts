// An executor in its own project. It runs the runs of executor "greeter": each run's payload
// names someone to greet; a run without a name fails for good (no retries).
// Then it creates a task for itself through the client, so `npm start` shows a whole round trip
// against a running cluster (AX_NATS_URL and AX_NAMESPACE as for the nodes).
import { Executor, NonRetryableError, type RunContext } from "@ax-scheduler/ax/executor";
import { AxClient } from "@ax-scheduler/ax";

const natsUrl = process.env.AX_NATS_URL ?? "nats://127.0.0.1:4222";
const namespace = process.env.AX_NAMESPACE ?? "ax";

async function greet(ctx: RunContext): Promise<{ greeting: string }> {
  const who = (ctx.payload as { who?: unknown } | null)?.who;
  if (typeof who !== "string") throw new NonRetryableError("payload.who must be a string");
  const greeting = `hello ${who}`;
  process.stdout.write(`ran ${ctx.taskName} ${ctx.runId} attempt ${ctx.attempt}: ${greeting}\n`);
  return { greeting };
}

const executor = new Executor({ name: "greeter", handler: greet, concurrency: 4, natsUrl, namespace });
await executor.start();

const client = await AxClient.connect(natsUrl, namespace);
try {
  const task = await client.call<{ id: number; name: string }>("task.create", {
    name: "greet", executor: "greeter", delay: "200ms", payload: { who: "from the tarball" },
  });
  process.stdout.write(`created task ${task.name} (id ${task.id})\n`);
} finally {
  await client.close();
}

// Keep serving runs until stopped; stop() finishes the runs in hand first.
const stop = () => { void executor.stop().then(() => process.exit(0)); };
process.once("SIGINT", stop);
process.once("SIGTERM", stop);
