/**
 * A light interpreter of `taskMachine`'s own definition, for the hot path.
 *
 * XState's `transition()` costs ~17-25 µs per call (it builds an actor scope, a snapshot and a
 * microstep for every event); a node firing tens of thousands of runs a second makes two
 * transitions per run. This module reads the machine's config and implementations once —
 * states, the transitions of each event in order, their guards (by name, with params), targets
 * and assign actions — and evaluates exactly those: first transition whose guard passes wins,
 * its assign actions run in order on the context (each sees the previous one's result, merged
 * as XState merges a partial assignment), the value becomes the target or stays. The machine
 * definition remains the single place transitions are decided; this only executes it without
 * the actor machinery.
 *
 * It supports what a flat machine of guarded, assigning transitions uses and checks that at
 * load: no nested/parallel/final states, no entry/exit/always/after/invoke, no root `on`, no
 * wildcard events, only assign actions. Anything else and `compiledTaskMachine` is null, so
 * `applyEvent` keeps using XState. test/unit/machine-compiled.test.ts compares both on every
 * state × context × event combination. `AX_MACHINE=xstate` forces the XState path.
 */
import { taskMachine } from "./task-machine.ts";
import type { TaskContext, TaskEvent, TaskState } from "./types.ts";

type Guard = (args: { context: TaskContext; event: TaskEvent }, params: unknown) => boolean;
type Assigner = ((args: { context: TaskContext; event: TaskEvent }, params: unknown) => Partial<TaskContext>) | Record<string, unknown>;

interface CompiledTransition {
  guard: { fn: Guard; params: unknown } | null;
  target: TaskState | null;
  actions: Array<{ assignment: Assigner; params: unknown }>;
}

export interface CompiledMachine {
  /** null: the event is not accepted in this state with this context (XState would return the same snapshot). */
  transition(value: TaskState, context: TaskContext, event: TaskEvent): { value: TaskState; context: TaskContext } | null;
}

type Unsupported = { reason: string };

function compile(): CompiledMachine | Unsupported {
  const m = taskMachine as unknown as {
    config: Record<string, unknown> & { states?: Record<string, Record<string, unknown>> };
    implementations: { guards: Record<string, Guard>; actions: Record<string, unknown> };
  };
  const cfg = m.config;
  for (const k of Object.keys(cfg)) if (!["id", "initial", "context", "states", "schemas", "types"].includes(k)) return { reason: `machine key ${k}` };
  const states = cfg.states ?? {};
  const table = new Map<string, Map<string, CompiledTransition[]>>();
  const resolveGuard = (g: unknown): CompiledTransition["guard"] | Unsupported => {
    if (g === undefined) return null;
    const name = typeof g === "string" ? g : (g as { type?: unknown }).type;
    if (typeof name !== "string") return { reason: "inline guard" };
    const fn = m.implementations.guards[name];
    if (typeof fn !== "function") return { reason: `guard ${name}` };
    return { fn, params: typeof g === "object" ? (g as { params?: unknown }).params : undefined };
  };
  const resolveAction = (a: unknown): { assignment: Assigner; params: unknown } | Unsupported => {
    const name = typeof a === "string" ? a : (a as { type?: unknown })?.type;
    if (typeof name !== "string") return { reason: "inline action" };
    const impl = m.implementations.actions[name] as { type?: unknown; assignment?: unknown } | undefined;
    if (!impl || impl.type !== "xstate.assign" || (typeof impl.assignment !== "function" && (typeof impl.assignment !== "object" || impl.assignment === null))) {
      return { reason: `action ${name} is not an assign` };
    }
    return { assignment: impl.assignment as Assigner, params: typeof a === "object" ? (a as { params?: unknown }).params : undefined };
  };
  for (const [name, st] of Object.entries(states)) {
    for (const k of Object.keys(st)) if (k !== "on") return { reason: `state ${name} has ${k}` };
    const on = new Map<string, CompiledTransition[]>();
    for (const [ev, def] of Object.entries((st.on ?? {}) as Record<string, unknown>)) {
      if (ev.includes("*")) return { reason: `wildcard event ${ev}` };
      const list: CompiledTransition[] = [];
      for (const t of (Array.isArray(def) ? def : [def]) as Array<Record<string, unknown> | string>) {
        if (typeof t === "string") { if (!(t in states)) return { reason: `target ${t}` }; list.push({ guard: null, target: t as TaskState, actions: [] }); continue; }
        for (const k of Object.keys(t)) if (!["guard", "target", "actions"].includes(k)) return { reason: `transition key ${k}` };
        const guard = resolveGuard(t.guard);
        if (guard && "reason" in guard) return guard;
        const target = t.target;
        if (target !== undefined && (typeof target !== "string" || !(target in states))) return { reason: `target ${String(target)}` };
        const actions: CompiledTransition["actions"] = [];
        for (const a of t.actions === undefined ? [] : Array.isArray(t.actions) ? t.actions : [t.actions]) {
          const r = resolveAction(a);
          if ("reason" in r) return r;
          actions.push(r);
        }
        list.push({ guard, target: (target as TaskState | undefined) ?? null, actions });
      }
      on.set(ev, list);
    }
    table.set(name, on);
  }
  return {
    transition(value, context, event) {
      const list = table.get(value)?.get(event.type);
      if (!list) return null;
      for (const t of list) {
        if (t.guard && !t.guard.fn({ context, event }, t.guard.params)) continue;
        // A transition without target or actions would leave the snapshot as it was: not accepted.
        if (t.target === null && !t.actions.length) return null;
        let ctx = context;
        for (const a of t.actions) {
          let partial: Record<string, unknown>;
          if (typeof a.assignment === "function") partial = a.assignment({ context: ctx, event }, a.params) as Record<string, unknown>;
          else {
            partial = {};
            for (const k of Object.keys(a.assignment)) {
              const v = a.assignment[k];
              partial[k] = typeof v === "function" ? (v as (x: unknown, p: unknown) => unknown)({ context: ctx, event }, a.params) : v;
            }
          }
          ctx = Object.assign({}, ctx, partial);
        }
        return { value: t.target ?? value, context: ctx };
      }
      return null;
    },
  };
}

const result = process.env.AX_MACHINE === "xstate" ? { reason: "AX_MACHINE=xstate" } : compile();

/** The compiled machine, or null when its definition uses something this interpreter does not (then XState runs). */
export const compiledTaskMachine: CompiledMachine | null = "reason" in result ? null : result;
export const compiledTaskMachineUnsupported: string | null = "reason" in result ? result.reason : null;
