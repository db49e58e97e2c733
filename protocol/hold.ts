/**
 * When an executor starts a run it received ahead of its due time (a v2 message with `sentAt`).
 *
 * The safe rule needs no clock agreement: start `firedAt - sentAt` after the message arrived, on
 * the executor's monotonic clock. Since the message cannot arrive before it was sent, that is
 * never before `firedAt` on the sending node's clock. But it also adds the message's transit
 * (JetStream's store and delivery, a few milliseconds under load) to every run, although the
 * message arrived long before the due time.
 *
 * Each message also measures `offset = receivedMono - sentAt` = transit + the (constant) gap
 * between the node's wall clock and this process's monotonic clock. The smallest offset seen
 * lately from a node is that gap plus the quickest transit; a message whose offset is larger
 * spent the difference in transit, and its runs may start that much sooner than the safe rule
 * says, still not before `firedAt` on the node's clock — unless the node's wall clock stepped
 * back since the smallest offset was seen (its `sentAt` then reads low, and the difference is the
 * step, not transit). So the credit is capped at MAX_TRANSIT_CREDIT_MS, and the smallest offset
 * is forgotten after two windows: a step back of the node's clock can make a run start at most
 * MAX_TRANSIT_CREDIT_MS before its due time on the node's new clock, for at most 2 × WINDOW_MS.
 */
export const MAX_TRANSIT_CREDIT_MS = 10;
const WINDOW_MS = 10_000;

interface NodeOffsets { windowStart: number; min: number; prevMin: number }

export class HoldClock {
  private readonly byNode = new Map<string, NodeOffsets>();

  /**
   * Notes a message from `node` sent at `sentAt` (the node's wall clock) and received at
   * `receivedMono` (this process's monotonic clock), and returns its credit: how much sooner
   * than the safe rule its runs may start (see startAt).
   */
  creditFor(node: string, sentAt: number, receivedMono: number): number {
    const offset = receivedMono - sentAt;
    let o = this.byNode.get(node);
    if (!o) { o = { windowStart: receivedMono, min: offset, prevMin: offset }; this.byNode.set(node, o); }
    if (receivedMono - o.windowStart >= WINDOW_MS) {
      // A new window: the one that ended is kept as the previous, unless a whole window passed
      // without a message from this node (then nothing of before is kept).
      o.prevMin = receivedMono - o.windowStart >= 2 * WINDOW_MS ? offset : o.min;
      o.min = offset;
      o.windowStart = receivedMono;
    }
    if (offset < o.min) o.min = offset;
    const least = Math.min(o.min, o.prevMin);
    return Math.min(MAX_TRANSIT_CREDIT_MS, Math.max(0, offset - least));
  }

  /** Forgets what was measured of `node` (its clock stepped: its earlier offsets no longer compare). */
  forget(node: string): void { this.byNode.delete(node); }

  /** The monotonic time at which a run due at `firedAt` (node clock) of a message with this credit may start. */
  static startAt(firedAt: number, sentAt: number, receivedMono: number, credit: number): number {
    return receivedMono + (firedAt - sentAt) - credit;
  }
}
