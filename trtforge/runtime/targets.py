"""The two things `run` can drive: an ONNX file on ONNX Runtime, an engine on TensorRT."""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.backends.base import RunnerLifecycle
from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.errors import UserError
from trtforge.runtime.loop import (
    StageClock,
)
from trtforge.runtime.options import RunOptions


class OrtTarget(RunnerLifecycle):
    backend = "onnxruntime"
    accepts_parts = False  # feeds must be stacked arrays
    warm_batches = 1  # batches per warm-up round

    def __init__(self, path: Path, providers: list[str], threads: int | None = None):
        self.runner = OrtRunner(path, providers or None, threads)
        self.input_names, self.output_names = self.runner.input_names, self.runner.output_names
        self.label = f"onnxruntime {'/'.join(self.runner.providers)}"
        self.timings: list[tuple[str, float, float | None]] = []

    def run_many(self, batches: list[tuple[Any, dict[str, np.ndarray]]], consume=None):
        """As TrtTarget.run_many; with `consume` the outputs (ORT's own arrays) go to consume(tag, outputs), which
        finishes its work before returning (run overlaps merges only on an engine, whose outputs are a reused slot)."""
        for tag, feeds in batches:
            start = time.perf_counter()
            out = self.runner.run(feeds)
            self.timings.append(("onnxruntime", (time.perf_counter() - start) * 1e3, None))
            yield tag, (out if consume is None else consume(tag, out))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.run(feeds)

    def close(self) -> None:
        self.runner.close()

    def memory(self) -> dict[str, Any]:
        return {"device": "cpu", "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    def reset_host_clock(self) -> None:
        pass  # ONNX Runtime runs in the loop's own thread: its time is the loop's

    def runtime(self) -> dict[str, Any]:
        return {}


class TrtTarget(RunnerLifecycle):
    backend = "tensorrt"
    accepts_parts = True  # a batch's feeds may be its chunks' arrays: stacked straight into pinned memory

    def __init__(
        self,
        engine: Path,
        backend: str,
        slots: int = 3,
        cuda_graphs: bool = True,
        shared_device_memory: bool = True,
        plugin_libraries: list[str] | None = None,
        pad_batches: bool = True,
        gpu_wait: str = "spin",
    ):
        from trtforge.backends.engine_layers import runtime_identity
        from trtforge.backends.tensorrt import load_trt
        from trtforge.backends.tensorrt_runtime import TrtRunner
        from trtforge.build.engine_record import check_engine_compat, read_engine_sidecar
        from trtforge.core.platform import gpu_info

        self.sidecar = read_engine_sidecar(engine, verify=True)
        if plugin_libraries:  # --plugin-library: where the build's plugin libraries are on this machine
            self.sidecar = {**self.sidecar, "plugin_libraries": [{"path": str(p)} for p in plugin_libraries]}
        built = f"{self.sidecar.get('backend')} {self.sidecar.get('tensorrt_version')}"
        try:
            mod = load_trt(backend if backend != "auto" else self.sidecar.get("backend", "auto"))
        except UserError:
            raise UserError(
                f"{engine.name} was built with {built}, which is not installed here; rebuild the engine on this machine."
            ) from None
        check_engine_compat(engine, self.sidecar, runtime_identity(mod))
        if gpu_info() is None:
            raise UserError(
                f"{engine.name} needs a GPU to run and this machine has none; run its ONNX ({self.sidecar.get('built_onnx')}) on ONNX Runtime instead."
            )
        self.runner = TrtRunner(
            mod,
            engine,
            self.sidecar,
            slots=slots,
            cuda_graphs=cuda_graphs,
            shared_device_memory=shared_device_memory,
            pad_batches=pad_batches,
            gpu_wait=gpu_wait,
        )
        self.warm_batches = len(self.runner.slots) + 1  # a plain enqueue, then one graph capture per slot
        self.input_names, self.output_names = self.runner.input_names, self.runner.output_names
        self.label = f"{mod.flavour} {mod.version} ({self.sidecar.get('precision')})"
        self.timings: list[tuple[str, float, float | None]] = []

    @classmethod
    def for_options(cls, engine: Path, options: RunOptions) -> "TrtTarget":
        """The engine as `run`'s options set up its loop (run, scaleout/ray_run.py)."""
        return cls(
            engine,
            options.backend,
            options.slots,
            options.cuda_graphs,
            options.shared_device_memory,
            options.plugin_libraries,
            options.pad_batches,
            options.gpu_wait,
        )

    def run_many(self, batches, consume=None, place=None):
        """consume, place: see TrtRunner.run_many (the outputs are views of pinned memory, valid inside the call)."""
        start = len(self.runner.timings)
        for tag, out in self.runner.run_many(batches, consume=consume, place=place):
            yield tag, out
        for t in self.runner.timings[start:]:
            self.timings.append((f"profile {t.profile}", t.wall_ms, t.gpu_ms))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.run(feeds)

    def close(self) -> None:
        self.runner.close()

    def memory(self) -> dict[str, Any]:
        return {
            "device": "gpu",
            "peak_gpu_mb": self.runner.peak_bytes / 2**20,
            "sampled": "after every batch that was not a CUDA-graph replay (replays allocate nothing)",
        }

    def reset_host_clock(self) -> None:
        self.runner.host = StageClock()

    def runtime(self) -> dict[str, Any]:
        return self.runner.runtime_report()


# -- merging by output kind ----------------------------------------------------------------------
