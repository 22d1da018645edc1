"""datatrove's MinHash steps, made to give the same output whatever the task layout
(task_layout.py).

The bucket phase runs on more tasks than buckets: datatrove gives each bucket `tasks // num_buckets`
tasks, which share its hash range (each finds the duplicate pairs among the signatures whose first
hash falls in its range). The pairs, read back in the order of their files' names (bucket, then
range), come in the same order as one task per bucket would write them, so the clusters, and which
duplicate each keeps, do not depend on how many tasks there were.

The filter annotates the documents of a task that holds no duplicate too: datatrove's passes them on
without `minhash_cluster_size`, so that whether a document had one would depend on which task read it.
"""

from __future__ import annotations

import struct

from datatrove.pipeline.dedup.minhash import MinhashDedupBuckets, MinhashDedupFilter


def bucket_tasks(num_buckets: int, tasks: int) -> int:
    """The phase's tasks when the others run `tasks`: a whole number of tasks per bucket."""
    return num_buckets * max(1, tasks // num_buckets)


class SharedBuckets(MinhashDedupBuckets):
    """datatrove's bucket step, whose tasks of one bucket split its hash range at the quantiles of
    the bucket's largest signature file. datatrove's own takes the first file, which a task that
    read few documents can leave with fewer signatures than there are tasks (and then stops)."""

    def get_worker_hash_range(self, sig_files, rank, world_size):
        workers = world_size // self.config.num_buckets
        line = struct.calcsize(
            f"{self.config.hashes_per_bucket}{self.config.hash_config.struct_format}I"
        )
        sizes = {name: self.input_folder.size(name) for name in sig_files}
        largest = max(sig_files, key=sizes.get, default=None)
        if largest is not None and sizes[largest] // line >= workers:
            return super().get_worker_hash_range([largest], rank, world_size)
        # Too few signatures to split: the bucket's first task takes the whole range.
        whole = super().get_worker_hash_range([], rank, world_size)
        return whole if rank % workers == 0 else (whole[1], whole[1])


class EveryTaskFilter(MinhashDedupFilter):
    """datatrove's duplicate filter, given empty removal and cluster-size lists for a task that the
    clusters never name, so that its documents get `minhash_cluster_size` 1 like any other."""

    def run(self, data, rank: int = 0, world_size: int = 1):
        for suffix in (".remove", ".sizes"):
            if not self.data_folder.exists(f"{rank:06d}{suffix}"):
                with self.data_folder.open(f"{rank:06d}{suffix}", "wb"):
                    pass
        return super().run(data, rank, world_size)
