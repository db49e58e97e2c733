/**
 * The max-rate sweep's next step, shared by ax and the BullMQ peer so both are searched alike:
 * grow by 1.5x until a step fails, halve until one passes, then bisect until the bracket is
 * within 10 %. null = done.
 */
export function nextSweepRate(rate: number, lo: number, hi: number): number | null {
  if (hi === Infinity) return Math.round(rate * 1.5);
  if (lo === 0) return Math.round(rate / 2);
  if (hi / lo > 1.1) return Math.round((lo + hi) / 2);
  return null;
}
