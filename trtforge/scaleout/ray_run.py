"""`trtforge run --ray ADDRESS`: the run step sharded by document over Ray actors.

The driver prepares the run exactly as one process does (run.prepare: documents, chunk plans, output
kinds), cuts the documents into units of whole documents (shard.plan_units) and hands units to actors,
one per GPU (an engine) or per CPU slot (an ONNX on ONNX Runtime). Each actor holds its own target and
reference runner, forms its unit's batches (run.make_batches) and merges each document with the
one-process merger (run.Merger): a unit holds its documents whole, so every document's chunk plan and
merge are those of one process. Merging where the outputs are keeps the driver off the critical path
(with fast engines, shipping raw chunk outputs to one driver to merge there would cap the scaling);
merged documents travel to the driver only when they are saved (--save-outputs), and the driver
commits each document once. Two phases, as in one process:
1. inference, on the clock: units through the actors;
2. judging, off the clock: each unit back to the actor that ran it, which runs the reference on the
   very batches it inferred (precision error) and measures the chunking error of its documents.
A worker that dies loses its in-flight units to the ledger, which retries them on another actor
(phase 2 re-infers a unit whose outputs died with its actor). The report is the one-process report
plus `workers` (per actor) and `ray` (the cluster side).
"""

from __future__ import annotations

import gc
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trtforge.core.artifacts import write_json_atomic
from trtforge.core.errors import UserError
from trtforge.runtime.documents import Chunk, Document, length_unit
from trtforge.runtime.interpreter import collect_garbage, interpreter_for_loop
from trtforge.runtime.measure import (
    add_precision,
    chunking_error_of,
    chunking_summary,
    comparator_for,
    gates_for,
    latency_summary,
    precision_summary,
    self_referenced,
)
from trtforge.runtime.merge import Merger
from trtforge.runtime.options import RunOptions
from trtforge.runtime.planning import make_batches, stack
from trtforge.runtime.prepare import Prepared, check_io, check_save_outputs, prepare
from trtforge.scaleout.pool import Pool, connect, require_ray
from trtforge.scaleout.shard import Ledger, plan_units, unit_size, worker_figures
from trtforge.verify.compare import Comparator


@dataclass
class RayOptions:
    address: str = "auto"
    actors: int | None = None  # None: one per GPU (engines) or per CPU (ONNX Runtime) of the cluster
    unit_chunks: int | None = None  # None: shard.unit_size
    depth: int = 2  # units in flight per actor
    die_after_batches: int | None = None  # tests only: worker 0's first incarnation exits after this many batches


class RunWorker:
    """One actor: a target (engine or ONNX) and the reference ONNX, both on this actor's device."""

    def __init__(self, p: Prepared, options: RunOptions, tokenizer_dir: str | None, threads: int | None, die_after: int | None):
        self.p, self.options, self.tokenizer_dir, self.threads, self.die_after = p, options, tokenizer_dir, threads, die_after
        self.batches_run = 0
        self.kept: dict[int, tuple[list[list[Chunk]], list[dict[str, np.ndarray]]]] = {}

    def setup(self, warm: list[list[Chunk]], warmup: int) -> dict[str, Any]:
        from trtforge.backends.onnxruntime import OrtRunner
        from trtforge.runtime.targets import OrtTarget, TrtTarget
        from trtforge.runtime.tokenize import TextTokenizer

        p, options = self.p, self.options
        self.target = (
            TrtTarget.for_options(p.target_path, options) if p.is_engine else OrtTarget(p.target_path, options.providers, self.threads)
        )
        reference = OrtRunner(p.reference_path, threads=self.threads)
        check_io(self.target, reference, p.target_path, p.reference_path)
        self.p = replace(p, reference=reference, tokenizer=TextTokenizer(self.tokenizer_dir) if self.tokenizer_dir else None)
        for _ in range(warmup):
            list(self.target.run_many([(None, stack(b)) for b in warm]))
        self.target.timings.clear()
        if options.gc_pause:  # off from here until judging, as one process's loop keeps it off over its whole clock
            collect_garbage()
            gc.disable()
        return {
            "label": self.target.label,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def _infer(self, chunks: list[Chunk], merger: Merger | None = None) -> tuple[list[list[Chunk]], list[dict[str, np.ndarray]], float]:
        batches = make_batches(chunks, self.p.batch_cap, self.options.naive)
        outs: list[dict[str, np.ndarray]] = []
        start = time.perf_counter()
        # As in one process: merging on one thread overlaps the inference of the next batches, under the loop's GIL
        # switch interval (the collector is already off with --gc-pause: setup).
        with interpreter_for_loop(self.options), ThreadPoolExecutor(max_workers=1) as pool:
            pending = []
            for tag, out in self.target.run_many((i, stack(b)) for i, b in enumerate(batches)):
                outs.append(out)
                if merger is not None:
                    pending.append(pool.submit(merger.add, batches[tag], out))
                self.batches_run += 1
                if self.die_after is not None and self.batches_run >= self.die_after:
                    os._exit(1)  # the killed-actor test: a crash mid-unit, as a segfault or an OOM kill would be
            for future in pending:
                future.result()
        return batches, outs, time.perf_counter() - start

    def infer(self, unit: int, chunks: list[Chunk], docs: list[tuple[int, Document]]) -> dict[str, Any]:
        """Phase 1: the unit's documents through the target, merged per document here (the documents are
        whole in a unit, so the merge is the one-process merge) and returned only when they are saved."""
        local = {d: i for i, (d, _) in enumerate(docs)}
        chunks = [replace(c, doc=local[c.doc]) for c in chunks]  # the merger indexes documents from 0
        merger = Merger([doc for _, doc in docs], chunks, self.p.kinds, self.options)
        mark = len(self.target.timings)
        batches, outs, busy = self._infer(chunks, merger)
        merged = merger.results()
        if not self.skips_precision:
            self.kept[unit] = (batches, outs)
        return {
            "docs": [d for d, _ in docs],
            "merged": merged if self.options.save_outputs else None,
            "busy_s": busy,
            "timings": self.target.timings[mark:],
            "batches": len(batches),
        }

    @property
    def skips_precision(self) -> bool:
        """No ONNX Runtime comparison: the target is its own reference, or --no-precision-check."""
        return self_referenced(self.p) or not self.options.precision_check

    def judge(self, unit: int, chunks: list[Chunk], docs: list[tuple[Document, int]]) -> dict[str, Any]:
        """Phase 2: precision on the batches this actor inferred (re-inferred if they were lost), chunking
        error of the unit's documents (one comparator per document, merged in document order by the driver)."""
        if self.options.gc_pause:
            gc.enable()  # judging is off the clock: the collector back on, as after one process's loop
        precision = None
        if not self.skips_precision:
            if unit in self.kept:
                batches, outs = self.kept.pop(unit)
            else:
                batches, outs, _ = self._infer(chunks)
            precision = comparator_for(self.p.kinds, self.p.tolerances)
            for b, out in zip(batches, outs):
                add_precision(precision, self.p.reference, b, out)
        return {"precision": precision, "chunking": [chunking_error_of(doc, count, self.p, self.options) for doc, count in docs]}

    def memory(self) -> dict[str, Any]:
        return self.target.memory()


def _actor_plan(ray: Any, is_engine: bool, wanted: int | None, address: str) -> tuple[int, dict[str, Any], int | None]:
    """How many actors, their Ray resources, and ONNX Runtime threads each."""
    resources = ray.cluster_resources()
    cpus, gpus = int(resources.get("CPU", 0)), int(resources.get("GPU", 0))
    if is_engine:
        if gpus == 0:
            raise UserError(
                f"the Ray cluster at '{address}' has no GPUs, and each engine actor needs one; "
                "run the engine's ONNX instead, or join a cluster with GPUs."
            )
        count = wanted or gpus
        if count > gpus:
            raise UserError(f"--ray-actors {count} asks for more engine actors than the Ray cluster's {gpus} GPUs; lower it.")
        return count, {"num_gpus": 1, "num_cpus": max(1, min(2, cpus // count))}, max(1, cpus // count)
    count = wanted or max(1, cpus)
    if count > max(1, cpus):
        raise UserError(f"--ray-actors {count} asks for more ONNX Runtime actors than the Ray cluster's {cpus} CPUs; lower it.")
    per = max(1, cpus // count)
    return count, {"num_cpus": per}, per


def run_ray(
    target_path: Path, options: RunOptions, ray_options: RayOptions, progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    if options.save_reference or options.load_reference:
        raise UserError(
            "--save-reference/--load-reference do not combine with --ray yet (the reference runs inside each "
            "actor); run without --ray to save or use a stored reference."
        )
    ray = require_ray()
    p = prepare(target_path, options)
    check_save_outputs(p.docs, options.save_outputs)  # inputs sharing a name would overwrite each other's keys
    joined = connect(ray_options.address)
    try:
        return _run(ray, p, options, ray_options, progress)
    finally:
        if joined:
            ray.shutdown()


def _run(ray: Any, p: Prepared, options: RunOptions, ray_options: RayOptions, progress: Callable[[str], None]) -> dict[str, Any]:
    actors = _Actors(*_actor_plan(ray, p.is_engine, ray_options.actors, ray_options.address))
    driver = _Driver(p, options, ray_options, actors)
    pool = _start_actors(ray, p, options, ray_options, actors, _warm_batches(p, options), progress)
    label = pool.workers[0].info["label"]
    progress(
        f"{len(p.docs)} inputs -> {len(p.chunks)} chunks -> {len(driver.units)} units on {actors.count} Ray actors ({label}); outputs "
        + ", ".join(f"{k.name} ({k.kind})" for k in p.kinds.values())
    )
    infer_ledger, wall = driver.infer(pool)
    memory = {w.id: ray.get(w.handle.memory.remote()) for w in pool.live()}
    driver.judge(pool, infer_ledger)
    precision = driver.precision_of(list(range(len(driver.units))))
    if options.save_outputs:
        _save_merged(options.save_outputs, p.docs, driver.merged)
    workers = [driver.worker_report(w, infer_ledger, memory) for w in pool.workers]
    report = driver.report(pool, label, wall, precision, memory, workers)
    report["gates"] = gates_for(report, p, options)
    if options.report:
        write_json_atomic(options.report, report)
    return report


@dataclass
class _Actors:
    """How many actors, their Ray resources, and ONNX Runtime threads each (_actor_plan)."""

    count: int
    resources: dict[str, Any]
    threads: int | None


def _warm_batches(p: Prepared, options: RunOptions) -> list[list[Chunk]]:
    """Warm-up as one process does it: the first batch of every shape of the whole run, on every actor."""
    seen, warm = set(), []
    for b in make_batches(p.chunks, p.batch_cap, options.naive):
        key = (len(b), tuple(v.shape for v in b[0].feeds.values()))
        if key not in seen:
            seen.add(key)
            warm.append(b)
    return warm


def _start_actors(
    ray: Any,
    p: Prepared,
    options: RunOptions,
    ray_options: RayOptions,
    actors: _Actors,
    warm: list[list[Chunk]],
    progress: Callable[[str], None],
) -> Pool:
    """The actors, each set up and warmed up; the prepared run goes to them once, without its documents and runners."""
    actor_cls = ray.remote(**actors.resources, max_restarts=0)(RunWorker)
    shared = replace(p, docs=[], chunks=[], reference=None, tokenizer=None)
    tokenizer_dir = _tokenizer_dir(p)
    shared_ref, warm_ref = ray.put(shared), ray.put(warm)

    def make(worker: int) -> Any:
        die = ray_options.die_after_batches if worker == 0 else None
        return actor_cls.remote(shared_ref, options, tokenizer_dir, actors.threads, die)

    pool = Pool(make, lambda h: h.setup.remote(warm_ref, options.warmup), actors.count, progress=progress)
    pool.wait_ready()
    return pool


def _tokenizer_dir(p: Prepared) -> str | None:
    """The folder each actor loads the tokenizer from (tokenizers travel as their folder)."""
    return str(p.tokenizer.directory) if p.tokenizer else None


def _save_merged(path: Path, docs: list[Document], merged: list[dict[str, np.ndarray] | None]) -> None:
    """--save-outputs: every input's merged outputs as INPUT/OUTPUT keys of one .npz, written atomically."""
    from trtforge.core.artifacts import atomic_path

    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **{f"{d.name}/{name}": value for d, outs in zip(docs, merged) for name, value in outs.items()})


def _no_stats() -> dict[str, Any]:
    """A worker's figures before any unit of it is committed."""
    return {"documents": 0, "chunks": 0, "batches": 0, "tokens": 0, "busy_s": 0.0, "timings": []}


class _Driver:
    """The driver's side of a Ray run: the documents cut into units of whole documents, what the actors send back
    for each unit (committed once per unit), and the report made of it."""

    def __init__(self, p: Prepared, options: RunOptions, ray_options: RayOptions, actors: _Actors):
        self.p, self.options, self.ray_options, self.actors = p, options, ray_options, actors
        by_doc: dict[int, list[Chunk]] = {}
        for c in p.chunks:
            by_doc.setdefault(c.doc, []).append(c)
        self.doc_chunks = [len(by_doc[d]) for d in range(len(p.docs))]
        self.size = ray_options.unit_chunks or unit_size(len(p.chunks), actors.count, p.batch_cap)
        self.units = plan_units(self.doc_chunks, self.size)
        self.unit_chunks = [[c for d in u for c in by_doc[d]] for u in self.units]
        self.merged: list[dict[str, np.ndarray] | None] = [None] * len(p.docs)
        self.committed = [0] * len(p.docs)
        self.per_worker: dict[int, dict[str, Any]] = {}
        self.timings: list[tuple[str, float, float | None]] = []
        self.batches_total = 0
        self.precision_parts: dict[int, Comparator | None] = {}
        self.chunking_parts: dict[int, Any] = {}
        self.judged_by: dict[int, list[int]] = {}  # worker -> units it judged, for its own figures

    def infer(self, pool: Pool) -> tuple[Ledger, float]:
        """Phase 1, on the clock: every unit through the actors; returns its ledger and the wall seconds."""
        p, units, unit_chunks = self.p, self.units, self.unit_chunks
        infer_ledger = Ledger(len(units))
        start = time.perf_counter()
        pool.run(
            infer_ledger,
            lambda h, u: h.infer.remote(u, unit_chunks[u], [(d, p.docs[d]) for d in units[u]]),
            self.commit_infer,
            self.ray_options.depth,
        )
        wall = time.perf_counter() - start
        if self.committed != [1] * len(p.docs):  # the ledger's promise, checked on what came back
            raise RuntimeError(f"documents merged other than once: {[d for d, n in enumerate(self.committed) if n != 1][:10]}")
        return infer_ledger, wall

    def commit_infer(self, unit: int, worker: Any, result: dict[str, Any]) -> None:
        """A unit's inference result, once: its documents' merged outputs (when saved) and the worker's figures."""
        for i, d in enumerate(result["docs"]):
            self.committed[d] += 1
            if result["merged"] is not None:
                self.merged[d] = result["merged"][i]
        stats = self.per_worker.setdefault(worker.id, _no_stats())
        stats["documents"] += len(self.units[unit])
        stats["chunks"] += len(self.unit_chunks[unit])
        stats["batches"] += result["batches"]
        stats["tokens"] += sum(self.p.docs[d].length for d in self.units[unit])
        stats["busy_s"] += result["busy_s"]
        stats["timings"] += result["timings"]
        self.timings.extend(result["timings"])
        self.batches_total += result["batches"]

    def judge(self, pool: Pool, infer_ledger: Ledger) -> None:
        """Phase 2, off the clock: each unit judged by the actor that inferred it (another where that one died)."""
        p, units, unit_chunks, doc_chunks = self.p, self.units, self.unit_chunks, self.doc_chunks
        judge_ledger = Ledger(len(units), affinity=dict(infer_ledger.done))
        judge_ledger.dead |= {w.id for w in pool.workers if not w.alive}
        pool.run(
            judge_ledger,
            lambda h, u: h.judge.remote(u, unit_chunks[u], [(p.docs[d], doc_chunks[d]) for d in units[u]]),
            self.commit_judge,
            self.ray_options.depth,
        )

    def commit_judge(self, unit: int, worker: Any, result: dict[str, Any]) -> None:
        """A unit's judging result: its precision comparator and its documents' chunking errors."""
        self.precision_parts[unit] = result["precision"]
        for d, part in zip(self.units[unit], result["chunking"]):
            self.chunking_parts[d] = part
        self.judged_by.setdefault(worker.id, []).append(unit)

    def precision_of(self, chosen: list[int]) -> dict[str, Any]:
        """The precision error over the chosen units (in unit order), or why it was not measured."""
        if not self.options.precision_check:
            return {"measured": False, "reason": "--no-precision-check"}
        if self_referenced(self.p):
            return {"measured": False, "reason": "target is its own reference; pass --reference or run an engine"}
        if not chosen:
            return {"measured": False, "reason": "no units judged on this worker"}
        total = comparator_for(self.p.kinds, self.p.tolerances)
        for u in sorted(chosen):
            total.merge(self.precision_parts[u])
        return precision_summary(total)

    def chunking_of(self, chosen: list[int]) -> dict[str, Any]:
        """The chunking error over the chosen units' documents (in document order)."""
        docs = sorted(d for u in chosen for d in self.units[u])
        return (
            chunking_summary([self.chunking_parts[d] for d in docs], self.p.kinds)
            if docs
            else {"measured": False, "reason": "no documents"}
        )

    def worker_report(self, w: Any, infer_ledger: Ledger, memory: dict[int, Any]) -> dict[str, Any]:
        """One actor's entry under `workers`: where it ran, what it inferred and judged, its speed and memory."""
        stats = self.per_worker.get(w.id, _no_stats())
        return {
            "worker": w.id,
            **{k: w.info.get(k) for k in ("host", "pid", "devices")},
            "alive": w.alive,
            "units": sum(1 for owner in infer_ledger.done.values() if owner == w.id),
            "documents": stats["documents"],
            **worker_figures(stats["tokens"], stats["busy_s"], stats["chunks"], stats["batches"]),
            "retried_units": w.retried_units,
            "latency": latency_summary(stats["timings"]),
            "memory": memory.get(w.id),
            "judged_units": len(self.judged_by.get(w.id, [])),
            "precision_error": self.precision_of(self.judged_by.get(w.id, [])),
            "chunking_error": self.chunking_of(self.judged_by.get(w.id, [])),
        }

    def report(
        self, pool: Pool, label: str, wall: float, precision: dict[str, Any], memory: dict[int, Any], workers: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The one-process report (without its gates) plus `workers` and `ray`."""
        p, options = self.p, self.options
        mems = [m for m in memory.values() if m]
        memory_all = {k: (max(m[k] for m in mems) if isinstance(mems[0][k], (int, float)) else mems[0][k]) for k in mems[0]} if mems else {}
        tokens = sum(d.length for d in p.docs)
        return {
            **p.report_head(options, label, self.doc_chunks),
            "batches": self.batches_total,
            "precision_error": precision,
            "chunking_error": chunking_summary([self.chunking_parts[d] for d in range(len(p.docs))], p.kinds),
            "latency": latency_summary(self.timings),
            "throughput": {
                "seconds": wall,
                "inputs_per_s": len(p.docs) / wall,
                "tokens_per_s": tokens / wall,
                "unit": length_unit({d.kind for d in p.docs}),
                "chunks_per_s": len(p.chunks) / wall,
            },
            "memory": memory_all,
            "workers": workers,
            "ray": {
                "address": self.ray_options.address,
                "actors": self.actors.count,
                "resources_per_actor": self.actors.resources,
                "onnxruntime_threads": self.actors.threads,
                "units": len(self.units),
                "unit_chunks": self.size,
                "lost_workers": sum(1 for w in pool.workers if not w.alive),
                "gc_paused_in_units": options.gc_pause,
                "switch_interval_us": options.switch_interval_us,
                "retried_units": sum(w.retried_units for w in pool.workers),
            },
        }
