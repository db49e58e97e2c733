/**
 * The fence as a filter, shared by every statement of a round's transaction ($2 = shards,
 * $3 = epochs): `ok` = the batch's shards whose epoch is the current one, and `okShard(col)`
 * keeps the rows of those shards. The filter is `col = any(array(select shard from ok))`,
 * computed once (an InitPlan), not `col in (select shard from ok)`: the planner turned that into
 * a join whose outer side was `ok` (estimated one row) and scanned the batch's rows once per
 * shard, a batch of 934 rows over 12 shards being read 12 times (auto_explain: 54 of the
 * statement's 89 ms), and more often the more shards a batch carried.
 */
export const FENCE_CTE = "with ok as (select s.shard from shards s join unnest($2::int[], $3::bigint[]) f(shard, epoch) on s.shard = f.shard and s.epoch = f.epoch)";
export function okShard(column: string): string { return `${column} = any(array(select shard from ok))`; }
