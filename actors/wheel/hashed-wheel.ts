import { AxError, InvalidInputError, type Clock, type TimerHandle } from "../../common/index.ts";

export interface WheelOptions<T> {
  tickMs: number;
  size: number;
  clock: Clock;
  /** Called once per tick with every entry that came due (possibly empty arrays are NOT delivered). */
  onExpire: (items: Array<{ dueMs: number; item: T }>, info: { tick: number; lateMs: number }) => void;
}

declare const wheelRefBrand: unique symbol;
/**
 * Handle returned by `add()` for `cancel()`. Opaque: at runtime it is a number (entry index plus
 * a generation), so `add()` allocates nothing per entry and a stale handle can never cancel the
 * entry that later reuses its storage. It is only meaningful to the wheel that issued it.
 */
export interface WheelRef { readonly [wheelRefBrand]: true }

const NIL = -1;
// Index and generation share one safe integer: 2^26 entries is far beyond what fits in memory
// anyway, and 2^27 reuses of a single index before a stale handle could alias is negligible.
const INDEX_SPAN = 2 ** 26;
const GEN_SPAN = 2 ** 27;
const MAX_RING = 2 ** 22;
// Clamping is safe: an entry that comes up too early is caught by the wall-clock check and
// re-inserted for its remaining time.
const MAX_ROUNDS = 0x7fffffff;
const INITIAL_CAPACITY = 1024;
const MIN_SLOT_CAPACITY = 4;

type Batch<T> = Array<{ dueMs: number; item: T }>;

/**
 * Hashed wheel timer: `size` slots of `tickMs` each; an entry more than one revolution away
 * carries a `rounds` count that is decremented each time the pointer passes its slot.
 *
 * Storage (no object or closure per entry, ~40 bytes per pending entry): per-entry typed arrays
 * (rounds, generation, slot, position-in-slot, due) plus one plain array of items, and per slot a
 * dense Int32Array of entry indices. `add` appends to its slot; `cancel` swap-removes using the
 * entry's recorded position, so both are O(1). Index arrays rather than linked lists because the
 * slot walk (decrementing `rounds` of far entries) dominates the cost at 1M entries, and reading
 * a contiguous index list issues independent loads the CPU overlaps, where chasing `next`
 * pointers stalls on every cache miss.
 *
 * Modes:
 * - Running (`start()`): one clock timer at a time, armed for the next multiple of `tickMs` on
 *   the MONOTONIC clock. An early callback re-arms without advancing; a late one catches up every
 *   elapsed slot in a single `tickNow()` and reports `lateMs` (how long after the first missed
 *   tick it ran). `stop()` cancels the armed timer; pending entries stay and resume on `start()`.
 *   An empty wheel arms no timer: a node owns 64 of them by default, and an idle shard's wheel
 *   ticking 50 times a second for nothing was about a tenth of an idle node's CPU (perf). `add()` wakes it
 *   (the pointer catches up to now first, as an empty tick would have moved it).
 * - Manual (`tickNow()`): processes every slot whose monotonic time has arrived (zero or more);
 *   it never runs the pointer ahead of the monotonic clock, so calling it early is harmless.
 * - Resync (O(n + size), rare): when the wall clock has moved ahead of the monotonic clock by
 *   more than one tick since the last resync (NTP step forward), or when more than a whole
 *   revolution elapsed between ticks, every entry is either fired (wall-due) or re-placed from its
 *   remaining wall time, instead of walking the ring once per missed tick.
 *
 * Guarantees:
 * - `dueMs` is wall-clock; `add()` converts it once to a monotonic deadline. An entry never fires
 *   while `clock.now() < dueMs`: if its slot comes up early (wall stepped back) it is re-inserted
 *   for the remaining `dueMs - now()`.
 * - Each entry fires at most once, ever (it is freed before delivery), so a wall step back cannot
 *   re-fire anything; a step forward fires what became due exactly once, on the next tick, and
 *   re-places the rest so they are not late by the size of the step.
 * - With a steady wall clock an entry fires on the first tick at or after its due time, i.e.
 *   within one tick late. Entries already due at `add()` fire on the next tick.
 * - `onExpire` is called at most once per `tickNow()`, never with an empty array. The batch is in
 *   storage order, not sorted by `dueMs` (sorting every tick cost a measurable share of fire
 *   throughput; a consumer that needs order can sort). The wheel is consistent before the call,
 *   so the callback may `add`/`cancel`/`stop`; if it throws, the error propagates, the entries
 *   count as fired and the running loop stays armed.
 */
export class HashedWheel<T> {
  private readonly tickMs: number;
  private readonly ring: number;
  private readonly clock: Clock;
  private readonly onExpire: WheelOptions<T>["onExpire"];

  private readonly slots: Int32Array[];
  private readonly slotLen: Int32Array;

  private rounds: Int32Array;
  private gen: Int32Array;
  private slotOf: Int32Array;
  /** Position in the slot's index array; for a free entry, the next free index. */
  private pos: Int32Array;
  private due: Float64Array;
  private items: Array<T | undefined> = [];
  private capacity = INITIAL_CAPACITY;
  private used = 0;
  private freeHead = NIL;
  private pending = 0;

  /** Last tick index processed; tick k is monotonic time k * tickMs. */
  private current: number;
  /** Lowest (wall - monotonic) offset seen since the last resync: the forward-drift baseline. */
  private minOffset: number;

  private running = false;
  private timer: TimerHandle | undefined;
  /** Running with nothing pending and no timer armed (see wake). */
  private asleep = false;

  constructor(opts: WheelOptions<T>) {
    if (typeof opts.tickMs !== "number" || !Number.isFinite(opts.tickMs) || opts.tickMs <= 0) {
      throw new InvalidInputError("tickMs", opts.tickMs, "must be a positive finite number");
    }
    if (!Number.isInteger(opts.size) || opts.size < 1 || opts.size > MAX_RING) {
      throw new InvalidInputError("size", opts.size, `must be an integer in [1, ${MAX_RING}]`);
    }
    if (typeof opts.onExpire !== "function") throw new InvalidInputError("onExpire", typeof opts.onExpire, "must be a function");
    this.tickMs = opts.tickMs;
    this.ring = opts.size;
    this.clock = opts.clock;
    this.onExpire = opts.onExpire;

    this.slots = Array.from({ length: this.ring }, () => new Int32Array(MIN_SLOT_CAPACITY));
    this.slotLen = new Int32Array(this.ring);
    this.rounds = new Int32Array(this.capacity);
    this.gen = new Int32Array(this.capacity);
    this.slotOf = new Int32Array(this.capacity);
    this.pos = new Int32Array(this.capacity);
    this.due = new Float64Array(this.capacity);

    const mono = this.clock.monotonic();
    this.current = this.tickAt(mono);
    this.minOffset = this.clock.now() - mono;
  }

  /** Entries pending (added, not yet fired or cancelled). */
  get size(): number { return this.pending; }

  add(dueMs: number, item: T): WheelRef {
    if (typeof dueMs !== "number" || !Number.isFinite(dueMs)) {
      throw new InvalidInputError("dueMs", dueMs, "must be a finite wall-clock epoch ms");
    }
    const woke = this.asleep;
    if (woke) this.wake();
    const idx = this.alloc();
    this.due[idx] = dueMs;
    this.items[idx] = item;
    this.place(idx, this.clock.monotonic() + (dueMs - this.clock.now()));
    this.pending++;
    if (woke) this.arm();
    return (this.gen[idx]! * INDEX_SPAN + idx) as unknown as WheelRef;
  }

  cancel(ref: WheelRef): boolean {
    const r = ref as unknown;
    if (typeof r !== "number" || !Number.isSafeInteger(r) || r < 0) return false;
    const idx = r % INDEX_SPAN;
    if (idx >= this.used) return false;
    // Fired, cancelled and free entries all had their generation bumped, so a match means pending.
    if (this.gen[idx] !== (r - idx) / INDEX_SPAN) return false;
    this.removeAt(this.slotOf[idx]!, this.pos[idx]!);
    this.release(idx);
    return true;
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    if (this.pending > 0) this.arm(); else this.asleep = true;
  }

  stop(): void {
    this.running = false;
    this.asleep = false;
    if (this.timer !== undefined) {
      this.clock.clearTimeout(this.timer);
      this.timer = undefined;
    }
  }

  tickNow(): void {
    const mono = this.clock.monotonic();
    const wall = this.clock.now();
    const target = this.tickAt(mono);
    const from = this.current + 1;
    const lateMs = target >= from ? Math.max(0, mono - from * this.tickMs) : 0;

    const offset = wall - mono;
    if (offset < this.minOffset) this.minOffset = offset;

    const batch: Batch<T> = [];
    if (this.pending === 0) {
      if (target > this.current) this.current = target;
      this.minOffset = offset;
    } else if (offset - this.minOffset > this.tickMs || target - this.current > this.ring) {
      if (target > this.current) this.current = target;
      this.resync(wall, mono, batch);
      this.minOffset = offset;
    } else {
      for (let t = from; t <= target; t++) {
        this.current = t;
        this.processSlot(t % this.ring, wall, mono, batch);
      }
    }
    if (batch.length > 0) this.onExpire(batch, { tick: this.current, lateMs });
  }

  // ---- loop ----

  private readonly onTimer = (): void => {
    this.timer = undefined;
    if (!this.running) return;
    try {
      if (this.clock.monotonic() >= (this.current + 1) * this.tickMs) this.tickNow();
    } finally {
      if (this.pending > 0) this.arm(); else this.asleep = true;
    }
  };

  /**
   * An empty wheel's pointer waits where it stopped (no timer): moved to now, exactly as the
   * empty ticks it skipped would have moved it (tickNow with nothing pending), before an entry is
   * placed against it. Ticks run again from the next boundary.
   */
  private wake(): void {
    this.asleep = false;
    const mono = this.clock.monotonic();
    const target = this.tickAt(mono);
    if (target > this.current) this.current = target;
    this.minOffset = this.clock.now() - mono;
  }

  private arm(): void {
    if (!this.running || this.timer !== undefined) return;
    const delay = (this.current + 1) * this.tickMs - this.clock.monotonic();
    this.timer = this.clock.setTimeout(this.onTimer, Math.max(0, delay));
  }

  /**
   * The tick whose time has most recently arrived. The correction loop guarantees
   * (t + 1) * tickMs > mono despite float rounding, which keeps the loop from re-arming at
   * zero delay forever without advancing.
   */
  private tickAt(mono: number): number {
    let t = Math.floor(mono / this.tickMs);
    while ((t + 1) * this.tickMs <= mono) t++;
    return t;
  }

  // ---- ring ----

  /**
   * How long until the tick that hands over an entry due at wall time `dueMs`, placed now (as
   * add() places it; the next tick for one already due).
   */
  msUntilTickFor(dueMs: number): number {
    const mono = this.clock.monotonic();
    const t = Math.max(this.tickOf(mono + (dueMs - this.clock.now())), this.tickAt(mono) + 1);
    return Math.max(0, t * this.tickMs - mono);
  }

  /** The tick an entry with this monotonic deadline goes to (see place). */
  private tickOf(monoDeadline: number): number { return Math.ceil(monoDeadline / this.tickMs); }

  private place(idx: number, monoDeadline: number): void {
    let t = this.tickOf(monoDeadline);
    if (!(t > this.current)) t = this.current + 1;
    const s = t % this.ring;
    this.rounds[idx] = Math.min(MAX_ROUNDS, Math.floor((t - this.current - 1) / this.ring));
    let arr = this.slots[s]!;
    const len = this.slotLen[s]!;
    if (len === arr.length) {
      const bigger = new Int32Array(len * 2);
      bigger.set(arr);
      this.slots[s] = arr = bigger;
    }
    arr[len] = idx;
    this.slotLen[s] = len + 1;
    this.slotOf[idx] = s;
    this.pos[idx] = len;
  }

  private removeAt(s: number, k: number): void {
    const arr = this.slots[s]!;
    const last = this.slotLen[s]! - 1;
    if (k !== last) {
      const moved = arr[last]!;
      arr[k] = moved;
      this.pos[moved] = k;
    }
    this.slotLen[s] = last;
  }

  private processSlot(s: number, wall: number, mono: number, batch: Batch<T>): void {
    const rounds = this.rounds;
    const due = this.due;
    let arr = this.slots[s]!;
    // Walking down means a swap-remove only ever pulls in an element already visited (or one
    // re-placed into this slot during the walk), so nothing is visited twice in one pass.
    for (let k = this.slotLen[s]! - 1; k >= 0; k--) {
      const i = arr[k]!;
      const r = rounds[i]!;
      if (r > 0) {
        rounds[i] = r - 1;
        continue;
      }
      this.removeAt(s, k);
      const dueMs = due[i]!;
      if (dueMs <= wall) {
        batch.push({ dueMs, item: this.items[i] as T });
        this.release(i);
      } else {
        this.place(i, mono + (dueMs - wall));
        arr = this.slots[s]!; // place may have grown this very slot
      }
    }
    this.maybeShrink(s);
  }

  /** Fire every wall-due entry and re-place the rest from their remaining wall time. */
  private resync(wall: number, mono: number, batch: Batch<T>): void {
    // Gather first so re-placing cannot revisit an entry; the O(n) scratch is fine for a rare event.
    const all = new Int32Array(this.pending);
    let n = 0;
    for (let s = 0; s < this.ring; s++) {
      const len = this.slotLen[s]!;
      if (len === 0) continue;
      all.set(this.slots[s]!.subarray(0, len), n);
      n += len;
      this.slotLen[s] = 0;
    }
    for (let j = 0; j < n; j++) {
      const i = all[j]!;
      const dueMs = this.due[i]!;
      if (dueMs <= wall) {
        batch.push({ dueMs, item: this.items[i] as T });
        this.release(i);
      } else {
        this.place(i, mono + (dueMs - wall));
      }
    }
    for (let s = 0; s < this.ring; s++) this.maybeShrink(s);
  }

  /** Give back a slot array left oversized by a burst, so memory follows the pending count. */
  private maybeShrink(s: number): void {
    const arr = this.slots[s]!;
    const len = this.slotLen[s]!;
    if (arr.length > MIN_SLOT_CAPACITY && len * 4 <= arr.length) {
      this.slots[s] = arr.slice(0, Math.max(MIN_SLOT_CAPACITY, arr.length >> 1));
    }
  }

  // ---- storage ----

  private alloc(): number {
    if (this.freeHead !== NIL) {
      const idx = this.freeHead;
      this.freeHead = this.pos[idx]!;
      return idx;
    }
    if (this.used === this.capacity) this.grow();
    return this.used++;
  }

  private release(idx: number): void {
    this.items[idx] = undefined;
    this.gen[idx] = (this.gen[idx]! + 1) % GEN_SPAN;
    this.pos[idx] = this.freeHead;
    this.freeHead = idx;
    this.pending--;
  }

  private grow(): void {
    if (this.capacity >= INDEX_SPAN) {
      throw new AxError("AX_E_UNAVAILABLE", `wheel is full (${INDEX_SPAN} entries)`);
    }
    const cap = Math.min(INDEX_SPAN, this.capacity * 2);
    this.rounds = grown(new Int32Array(cap), this.rounds);
    this.gen = grown(new Int32Array(cap), this.gen);
    this.slotOf = grown(new Int32Array(cap), this.slotOf);
    this.pos = grown(new Int32Array(cap), this.pos);
    this.due = grown(new Float64Array(cap), this.due);
    this.capacity = cap;
  }
}

function grown<A extends Int32Array | Float64Array>(into: A, from: A): A {
  into.set(from);
  return into;
}
