/**
 * One injectable clock for the wheel, the machines and the lease renewer.
 * `now()` is wall-clock epoch ms and is used only for due times; `monotonic()` only ever
 * increases and is what internal timing (ticks, lease deadlines, timeouts) is measured on,
 * so a wall clock stepping back never makes a timer fire twice.
 */
export interface Clock {
  now(): number;
  monotonic(): number;
  setTimeout(fn: () => void, ms: number): TimerHandle;
  clearTimeout(h: TimerHandle): void;
}
export interface TimerHandle { readonly id: number }

/**
 * Runs `fn` once the wall clock reads `atMs` or later: a timer measured on the monotonic clock
 * may come a little early against the wall clock, and a due time must never be met early.
 */
export function atWallTime(clock: Clock, atMs: number, fn: () => void): void {
  const left = atMs - clock.now();
  if (left > 0) clock.setTimeout(() => atWallTime(clock, atMs, fn), left); else fn();
}

export class SystemClock implements Clock {
  private readonly handles = new Map<number, NodeJS.Timeout>();
  private seq = 0;
  now(): number { return Date.now(); }
  monotonic(): number { return performance.now(); }
  setTimeout(fn: () => void, ms: number): TimerHandle {
    const id = ++this.seq;
    const t = setTimeout(() => { this.handles.delete(id); fn(); }, Math.max(0, ms));
    this.handles.set(id, t);
    return { id };
  }
  clearTimeout(h: TimerHandle): void {
    const t = this.handles.get(h.id);
    if (t) { clearTimeout(t); this.handles.delete(h.id); }
  }
}

/**
 * A clock tests drive by hand. `advance(ms)` moves both readings and runs timers in due order;
 * `stepWall(ms)` moves only the wall clock (NTP step forward or back), as in the clock incident.
 */
export class SimulatedClock implements Clock {
  private wall: number;
  private mono = 0;
  private seq = 0;
  private timers = new Map<number, { at: number; fn: () => void }>();
  constructor(startWallMs = Date.UTC(2026, 0, 1)) { this.wall = startWallMs; }
  now(): number { return this.wall; }
  monotonic(): number { return this.mono; }
  setTimeout(fn: () => void, ms: number): TimerHandle {
    const id = ++this.seq;
    this.timers.set(id, { at: this.mono + Math.max(0, ms), fn });
    return { id };
  }
  clearTimeout(h: TimerHandle): void { this.timers.delete(h.id); }
  stepWall(ms: number): void { this.wall += ms; }
  advance(ms: number): void {
    const target = this.mono + ms;
    for (;;) {
      let nextId = -1; let nextAt = Infinity;
      for (const [id, t] of this.timers) if (t.at <= target && t.at < nextAt) { nextAt = t.at; nextId = id; }
      if (nextId < 0) break;
      const t = this.timers.get(nextId)!;
      this.timers.delete(nextId);
      this.wall += t.at - this.mono;
      this.mono = t.at;
      t.fn();
    }
    this.wall += target - this.mono;
    this.mono = target;
  }
  pendingTimers(): number { return this.timers.size; }
}
