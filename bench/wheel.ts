/**
 * Micro-benchmark for the hashed wheel: 1M timers spread over one hour, tickMs 20, 4096 slots,
 * driven by a SimulatedClock so the numbers measure the wheel, not the event loop.
 * Prints one JSON line. Run: node --import tsx bench/wheel.ts
 */
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { SimulatedClock } from "../common/index.ts";
import { HashedWheel, type WheelRef } from "../actors/wheel/index.ts";

const TIMERS = 1_000_000;
const CANCELS = 100_000;
const SPAN_MS = 3_600_000;
const TICK_MS = 20;
const SIZE = 4096;

// `--expose-gc` cannot be passed through the documented command line, so turn it on at runtime;
// without a forced GC the heap figure would include garbage from the insert loop.
function findGc(): (() => void) | undefined {
  const g = (globalThis as { gc?: () => void }).gc;
  if (typeof g === "function") return g;
  try {
    setFlagsFromString("--expose-gc");
    const fn = runInNewContext("gc") as unknown;
    return typeof fn === "function" ? (fn as () => void) : undefined;
  } catch {
    return undefined;
  }
}
const gc = findGc();

// Typed-array backing stores live outside the JS heap, so count both.
function heapBytes(): number {
  if (gc) { gc(); gc(); }
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
}

let seed = 0x9e3779b9;
function rnd(): number {
  seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
  return seed / 2 ** 32;
}

const clock = new SimulatedClock();
let fired = 0;
const t0 = clock.now();

const heapBefore = heapBytes();
const wheel = new HashedWheel<number>({
  tickMs: TICK_MS,
  size: SIZE,
  clock,
  onExpire: (items) => { fired += items.length; },
});

let start = performance.now();
// Due times are generated inline (an LCG step is a few ns) so no 8 MB input array distorts the heap figure.
for (let i = 0; i < TIMERS; i++) wheel.add(t0 + 1 + rnd() * SPAN_MS, i);
const insertMs = performance.now() - start;

const heapAfter = heapBytes();
const heapBytesPerEntry = (heapAfter - heapBefore) / wheel.size;

wheel.start();
start = performance.now();
clock.advance(SPAN_MS + 2 * TICK_MS);
const fireMs = performance.now() - start;
wheel.stop();
if (fired !== TIMERS || wheel.size !== 0) throw new Error(`fired ${fired} of ${TIMERS}, ${wheel.size} left`);

const refs: WheelRef[] = new Array<WheelRef>(CANCELS);
for (let i = 0; i < CANCELS; i++) refs[i] = wheel.add(clock.now() + 1 + rnd() * SPAN_MS, i);
// Cancel in random order so the bench does not reward walking memory sequentially.
for (let i = CANCELS - 1; i > 0; i--) {
  const j = Math.floor(rnd() * (i + 1));
  const tmp = refs[i]!; refs[i] = refs[j]!; refs[j] = tmp;
}
start = performance.now();
let cancelled = 0;
for (let i = 0; i < CANCELS; i++) if (wheel.cancel(refs[i]!)) cancelled++;
const cancelMs = performance.now() - start;
if (cancelled !== CANCELS || wheel.size !== 0) throw new Error(`cancelled ${cancelled} of ${CANCELS}`);

const out: Record<string, unknown> = {
  bench: "wheel",
  timers: TIMERS,
  insertsPerSec: Math.round(TIMERS / (insertMs / 1000)),
  firesPerSec: Math.round(TIMERS / (fireMs / 1000)),
  cancelsPerSec: Math.round(CANCELS / (cancelMs / 1000)),
  heapBytesPerEntry: Math.round(heapBytesPerEntry * 10) / 10,
  tickMs: TICK_MS,
  size: SIZE,
  spanMs: SPAN_MS,
};
if (!gc) out.heapNote = "gc unavailable: heap figure includes uncollected garbage";
console.log(JSON.stringify(out));
