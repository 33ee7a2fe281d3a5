"""`trtforge calibrate --ray ADDRESS`: activation statistics collected on Ray actors.

The driver forms the calibration batches exactly as one process does (data.batches), cuts them into
units of whole batches and sends units to actors (one per CPU slot; each holds an ONNX Runtime session
of the model with the measured tensors exposed). Each unit comes back as collect.Statistics, and
Statistics.merge is exact and order-independent (power-of-two histogram ranges, maxima, counts), so
the merged statistics, and so the scales and the cache, are byte for byte those of one process.
Everything after collection (amax per method, fallback search, the cache) runs in the driver as usual.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from trtforge.calibrate.collect import Statistics, collect_with, exposing_runner
from trtforge.calibrate.methods import StreamingHistogram
from trtforge.core.errors import UserError
from trtforge.graph.index import expose_tensors
from trtforge.scaleout.pool import Pool, connect, require_ray
from trtforge.scaleout.shard import Ledger, split_evenly


class CollectWorker:
    def __init__(
        self, model: bytes, tensors: list[str], channel_tensors: list[str], num_bins: int, threads: int | None, die_after: int | None = None
    ):
        self.model, self.tensors, self.channel_tensors, self.num_bins = model, tensors, channel_tensors, num_bins
        self.threads, self.die_after, self.batches_run = threads, die_after, 0

    def setup(self) -> dict[str, Any]:
        import os
        import socket

        self.runner = exposing_runner(self.model, self.tensors, self.channel_tensors, self.threads)
        self.model = None
        return {"host": socket.gethostname(), "pid": os.getpid()}

    def collect(self, *batches: dict[str, np.ndarray]) -> Statistics:
        if self.die_after is not None and self.batches_run + len(batches) >= self.die_after:
            import os

            os._exit(1)  # tests: a crash mid-collection
        self.batches_run += len(batches)
        return collect_with(self.runner, batches, self.tensors, self.channel_tensors, self.num_bins)


def collect_ray(
    model: onnx.ModelProto,
    batches: list[dict[str, np.ndarray]],
    tensors: list[str],
    channel_tensors: list[str] | None = None,
    num_bins: int = 2048,
    progress: Any = None,
    *,
    address: str = "auto",
    actors: int | None = None,
    die_after_batches: int | None = None,
    log: Any = lambda _: None,
) -> Statistics:
    """collect() with the batches sharded over Ray actors; the result equals collect()'s exactly."""
    ray = require_ray()
    channel_tensors = channel_tensors or []
    batches = list(batches)
    joined = connect(address)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 0))
        count = actors or max(1, cpus)
        if count > max(1, cpus):
            raise UserError(f"--ray-actors {count} asks for more calibration actors than the Ray cluster's {cpus} CPUs; lower it.")
        per = max(1, cpus // count)
        wanted = list(dict.fromkeys(tensors + channel_tensors))
        model_ref = ray.put(expose_tensors(model, wanted).SerializeToString())
        actor_cls = ray.remote(num_cpus=per, max_restarts=0)(CollectWorker)
        pool = Pool(
            lambda w: actor_cls.remote(model_ref, tensors, channel_tensors, num_bins, per, die_after_batches if w == 0 else None),
            lambda h: h.setup.remote(),
            count,
            progress=log,
        )
        pool.wait_ready()
        units = split_evenly(len(batches), count * 4)
        refs = [ray.put(batches[i]) for i in range(len(batches))]
        total = Statistics({t: StreamingHistogram(num_bins) for t in tensors}, {})

        def commit(unit: int, worker: Any, stats: Statistics) -> None:
            total.merge(stats)
            if progress is not None:
                progress.advance(len(units[unit]))

        # A list of refs as the argument: the actor gets the batches themselves (Ray resolves nested refs
        # only at top level, so they are passed as *args).
        pool.run(Ledger(len(units)), lambda h, u: h.collect.remote(*[refs[i] for i in units[u]]), commit)
        return total
    finally:
        if joined:
            ray.shutdown()
