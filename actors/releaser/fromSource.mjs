// Starts the releaser thread from the TypeScript sources (tests, a source checkout run through
// tsx): a worker thread does not inherit the process's tsx loader, so it registers its own, then
// loads the thread's module. The compiled package (dist/) starts releaseWorker.js directly.
import { workerData } from "node:worker_threads";
import { register } from "tsx/esm/api";

register();
await import(workerData.entry);
