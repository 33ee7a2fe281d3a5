"""`trtforge run`: chunked inference on an engine (or ONNX), checked against ONNX Runtime, timed.

Every output has a kind (outputs.py: declared in the export sidecar, or inferred where the shapes
leave no doubt), and the kind decides everything after inference:
- slicing follows each INPUT's axes: the chunk axis ('seq', or the image's height/width) is cut at
  whatever dim it sits in that input; inputs without it go whole to every chunk. Text is windowed by
  the model's own tokenizer (tokenize.py), with its own special tokens;
- merging follows each OUTPUT's kind: token -> windows along its sequence dim; pooled -> token-weighted
  mean (never softmaxed); logits -> token-weighted mean softmax; dense -> tiles at the output's scale;
- metrics follow the kind too (verify/compare.py). Two errors are measured, each only where it exists:
  precision (the target vs ONNX Runtime fp32 on the reference ONNX, on the very same chunks; not
  measured when the target is its own reference) and chunking (chunked-and-merged vs one whole pass,
  both ONNX Runtime fp32, on the longest prefix the model takes whole; measured only where that prefix
  is itself chunked). Gates: report.evaluate_gates.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np

from trtforge.core.artifacts import (
    write_json_atomic,
)
from trtforge.core.errors import UserError
from trtforge.runtime.copymerge import CopyEngineMerge, Placed, reserve_bytes
from trtforge.runtime.documents import Batch, Chunk, length_unit
from trtforge.runtime.interpreter import collect_garbage, interpreter_for_loop, minor_faults
from trtforge.runtime.loop import (
    Batcher,
    StageClock,
    batch_timeline,
    stream_batches,
)
from trtforge.runtime.measure import chunking_error, gates_for, latency_summary, precision_error
from trtforge.runtime.merge import Merger, chunk_part
from trtforge.runtime.options import RunOptions
from trtforge.runtime.outpool import OutputPool, ReservedMemory
from trtforge.runtime.outwriter import OutputWriter
from trtforge.runtime.planning import batch_parts, plan_document, shape_key, stack
from trtforge.runtime.prepare import Prepared, check_io, check_save_outputs, prepare
from trtforge.runtime.targets import OrtTarget, TrtTarget

if TYPE_CHECKING:
    from trtforge.runtime.planning_processes import PlanningProcesses


def run(target_path: Path, options: RunOptions, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    p = prepare(target_path, options, plan=False)
    check_save_outputs(p.docs, options.save_outputs)
    # Overlapping pays only where a batch's outputs are a pinned slot the next batches wait for (an engine without
    # the precision check); ONNX Runtime's outputs are the batch's own, so its rows are split over the threads.
    overlap = options.overlap_merges and not options.precision_check and p.is_engine
    if options.merge_workers == 0 and not overlap:
        raise UserError(
            "--merge-workers 0 (merging on the collecting thread) needs an engine run without the precision "
            "check and with --overlap-merges; give 1 or more merge workers."
        )
    if p.is_engine:
        target: Any = TrtTarget.for_options(p.target_path, options)
    else:
        target = OrtTarget(p.target_path, options.providers)
    with target:  # the engine's contexts, buffers and CUDA graphs are freed when the run ends, failed or not
        return run_on(target, p, options, overlap, progress)


def run_on(target: Any, p: Prepared, options: RunOptions, overlap: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    """The run itself on an open target: warm-up, the loop, merges, then what is measured after it."""
    check_io(target, p.reference, p.target_path, p.reference_path)
    progress(
        f"{len(p.docs)} inputs on {target.label}; outputs "
        + ", ".join(f"{k.name} ({k.kind}{f' x{k.scale:g}' if k.scale not in (None, 1.0) else ''})" for k in p.kinds.values())
    )
    warm = _warm_up(p, options, target)
    texts = {d: doc for d, doc in enumerate(p.docs) if doc.kind == "text"}
    planning = _start_planning(p, options, texts)
    copy_names, copy_off = _copy_merge_outputs(p, options, warm, overlap)
    sinks = _open_sinks(p, options, warm, copy_names, planning)

    # Timed: tokenizing and planning (worker threads, document by document), batching as chunks arrive,
    # running (the target's pipelined loop) and merging (worker threads) all overlap under one clock.
    gc_before_s = collect_garbage() if options.gc_pause else None  # before the clock: the loop then starts with none
    start, cpu_start, faults_start = time.perf_counter(), time.process_time(), minor_faults()
    loop = _TimedLoop(target, p, options, overlap, planning, texts, sinks, warm, copy_names)
    stream = loop.feeds()
    try:
        try:
            loop.run(stream)
        finally:
            stream.close()  # on an error: no document is planned after this
            if planning is not None:
                planning.close()
        if loop.merger.finished != len(p.docs):
            raise RuntimeError(f"{len(p.docs) - loop.merger.finished} of {len(p.docs)} inputs were never finished by the merge")
        clock = _LoopClock(time.perf_counter() - start, time.process_time() - cpu_start, minor_faults() - faults_start, gc_before_s)
        sinks.finish_writer()
    except BaseException:
        sinks.abort_writer()
        raise
    finally:
        sinks.close()
    progress(f"{len(p.docs)} inputs -> {sum(loop.merger.counts)} chunks -> {len(loop.batches)} batches")
    report = _report(target, p, options, loop, clock, sinks, copy_off)
    report["gates"] = gates_for(report, p, options)
    if options.report:
        write_json_atomic(options.report, report)
    return report


def _start_planning(p: Prepared, options: RunOptions, texts: dict[int, Any]) -> PlanningProcesses | None:
    """Planning processes for the text inputs where --plan-processes asks for them: spawned and loaded before the
    clock, like the engine."""
    if not (options.plan_processes and texts and p.tokenizer is not None):
        return None
    from trtforge.runtime.planning_processes import PlanningProcesses, PlanSettings

    planning = PlanningProcesses(
        p.tokenizer.directory,
        options.plan_processes,
        PlanSettings(p.specs, p.layout, options.chunk, options.overlap, p.limits, options.full_last),
    )
    planning.start()  # closes itself if it fails
    return planning


@dataclass
class _OutputSinks:
    """Where merged outputs go, opened before the clock and closed after the loop, failed or not: the pool whose
    memory serves later inputs (page-locked for the copy-engine merge) and the --save-outputs writer."""

    pool: OutputPool
    reserved: ReservedMemory | None
    reserve_s: float
    writer: OutputWriter | None
    save_outputs: Path | None
    saving: dict[str, Any] = field(default_factory=lambda: {"path": None})

    def finish_writer(self) -> None:
        """Publishes the saved outputs after the loop and records how long that took."""
        if self.writer is None:
            return
        close_start = time.perf_counter()
        closing, self.writer = self.writer, None  # close() removes the file itself if it fails
        closing.close()
        self.saving = {
            "path": str(self.save_outputs),
            "write_s": round(closing.seconds, 6),
            "after_loop_s": round(time.perf_counter() - close_start, 6),
        }

    def abort_writer(self) -> None:
        """On a failed run: the temp file removed; what was queued is released, not written."""
        if self.writer is not None:
            self.writer.abort()

    def close(self) -> None:
        """Page-locked memory freed (nothing reads the merged outputs any more); numpy's: left to GC."""
        self.pool.close()
        if self.reserved is not None:
            self.reserved.close()


def _open_sinks(
    p: Prepared,
    options: RunOptions,
    warm: dict[str, tuple[tuple[int, ...], np.dtype]] | None,
    copy_names: list[str],
    planning: PlanningProcesses | None,
) -> _OutputSinks:
    """Each input's merged outputs are handed on as soon as it is finished (written by --save-outputs, else dropped),
    and their memory serves later inputs (outpool.py): a run holds the inputs in flight, not the corpus. With the
    copy-engine merge that memory is page-locked (the GPU writes into it). On a failure the planning processes close."""
    reserved: ReservedMemory | None = None
    reserve_s = 0.0
    try:
        if copy_names:  # page-locked once here, before the clock: page-locking inside the loop stalled it (copymerge.py)
            from trtforge.backends.cuda_memory import allocate_pinned

            reserve_start = time.perf_counter()
            reserved = ReservedMemory(_pinned_reserve(p, options, warm, copy_names), allocate_pinned)
            reserve_s = time.perf_counter() - reserve_start
            output_pool = OutputPool(allocate=reserved)
        else:
            output_pool = OutputPool()
        writer = OutputWriter(Path(options.save_outputs)) if options.save_outputs else None
    except BaseException:
        if planning is not None:
            planning.close()
        if reserved is not None:
            reserved.close()
        raise
    return _OutputSinks(output_pool, reserved, reserve_s, writer, options.save_outputs)


@dataclass
class _LoopClock:
    """What the timed loop cost: its wall and this process's CPU seconds, minor page faults, and the collection before it."""

    wall: float
    cpu: float
    faults: int
    gc_before_s: float | None


class _TimedLoop:
    """The timed loop's shared state and the callbacks its threads call: planning threads plan documents, the
    submitting thread batches them, the target runs them and merging threads merge each batch's outputs."""

    def __init__(
        self,
        target: Any,
        p: Prepared,
        options: RunOptions,
        overlap: bool,
        planning: PlanningProcesses | None,
        texts: dict[int, Any],
        sinks: _OutputSinks,
        warm: dict[str, tuple[tuple[int, ...], np.dtype]] | None,
        copy_names: list[str],
    ):
        self.target, self.p, self.options, self.overlap = target, p, options, overlap
        self.planning, self.texts, self.sinks = planning, texts, sinks
        self.merger = Merger(p.docs, [], p.kinds, options, templates=warm, pool=sinks.pool, on_done=self.hand_on)
        self.host = StageClock()  # this loop's stages; the target reports its own (staging, GPU waits, copies)
        # 2 by default: BERT-base and MiniLM ran fastest with 2, ahead of 4 (figures: docs/performance.md#run-loop-defaults)
        # 0: on the thread that collects each batch (no merging threads); valid only where merging overlaps (below)
        self.merge_workers = options.merge_workers if options.merge_workers is not None else min(2, os.cpu_count() or 2)
        self.copy_merge = (
            CopyEngineMerge(
                copy_names,
                {n: warm[n][1] for n in copy_names},
                lambda d, n: self.merger.streams.get((d, n)),
                lambda d: self.merger.counts[d],
            )
            if copy_names and warm is not None
            else None
        )
        self.placements: dict[int, dict[str, Placed]] = {}
        self.batches: list[list[Chunk] | None] = []  # by tag; without the precision check each is dropped once merged (consume)
        self.results: dict[int, dict[str, np.ndarray]] = {}
        self.parts = getattr(target, "accepts_parts", False)
        untokenized = {d for d, doc in enumerate(p.docs) if doc.kind == "text" and doc.ids is None}
        # Tokenizing releases the GIL: documents in parallel. With plans from worker processes as well (the threads wait
        # for them): 2 planning threads starved the loop (their page-in of merged outputs under GIL contention, with ids
        # from tokenizing processes; figures: docs/performance.md#run-loop-defaults).
        self.workers = (
            options.plan_workers
            if options.plan_workers is not None
            else default_plan_workers(bool(untokenized) or planning is not None, os.cpu_count() or 2, p.is_engine)
        )

    def hand_on(self, d: int, outputs: dict[str, np.ndarray], release: Callable[[], None]) -> None:
        """A finished input's merged outputs: written where --save-outputs asks, else their memory released."""
        if self.sinks.writer is None:
            release()
        else:
            self.sinks.writer.put(self.p.docs[d].name, outputs, release)

    def plan(self, d: int) -> list[Chunk]:
        """One document's chunks, from a planning process or planned here, with its merged outputs allocated ahead."""
        p, options, host = self.p, self.options, self.host
        if self.planning is not None and d in self.texts:
            with host.stage("wait_plans"):  # a planning thread waiting for a worker process's plan
                chunks, ids, seconds, cpu_seconds = self.planning.plan(d)
            host.add("plan_in_workers", seconds, cpu_seconds)  # the worker's own time on it (not this process's)
            if ids is not None:  # tokenized there
                p.docs[d].ids, p.docs[d].length = ids, int(ids.size)
        else:
            with host.stage("plan"):  # tokenize + chunk one document (worker threads: summed over them)
                chunks = plan_document(
                    d,
                    p.docs[d],
                    p.specs,
                    p.layout,
                    options.chunk,
                    options.overlap,
                    p.limits,
                    p.tokenizer,
                    p.scales,
                    options.full_last,
                    p.slices,
                )
        if not chunks:  # it would never be finished (nor merged)
            raise UserError(f"input '{p.docs[d].name}' is empty (no tokens or positions); remove it or give it content.")
        if self.merger.templates:
            with host.stage("prepare_outputs"):  # its merged outputs allocated and paged in, off the merge's path
                self.merger.prepare(chunks)
        return chunks

    def merge(
        self,
        batch: list[Chunk],
        out: dict[str, np.ndarray],
        rows: Iterable[int] | None = None,
        copy: bool = False,
        placed: dict[str, Placed] | None = None,
    ) -> None:
        """Merges a batch's outputs (or some of its rows), timed as the loop's merge stage."""
        with self.host.stage("merge"):  # worker threads: summed over them
            self.merger.add(batch, out, rows, copy, placed)

    def place(self, tag: int, shapes: dict[str, tuple[int, ...]]) -> Any:
        """On the submitting thread, before the batch's copies are queued: which rows the copy engine writes."""
        assert self.copy_merge is not None
        copies, self.placements[tag] = self.copy_merge.place(self.batches[tag], shapes)
        return copies

    def on_plan(self, d: int, chunks: list[Chunk]) -> None:
        """Counts a planned document's chunks (merger.counts); the chunks themselves are not kept (see `consume`)."""
        self.merger.add_plan(chunks)

    def feeds(self) -> Any:
        """The target's feeds, batch by batch as planned chunks arrive, each tagged with its index in `batches`."""
        options, workers = self.options, self.workers
        stream = stream_batches(
            len(self.p.docs),
            self.plan,
            Batcher(self.p.batch_cap, shape_key, options.naive, Batch),
            workers,
            self.on_plan,
            options.plan_ahead,
        )
        while True:
            # the submitting thread waiting for planned chunks; planning here instead, its time is the plan stages'
            with self.host.stage("wait_plan") if workers else nullcontext():
                b = next(stream, None)
            if b is None:
                return
            self.batches.append(b)
            yield len(self.batches) - 1, (batch_parts(b) if self.parts else stack(b))

    def run(self, stream: Any) -> None:
        """The loop: the target runs the stream's batches while `merge_workers` threads merge their outputs.

        Merging runs on `merge_workers` threads (numpy copies release the GIL), overlapping the submission and
        inference of the next batches. Without the precision check nothing keeps a batch's outputs, so they
        are merged straight out of the target's pinned output memory, each batch's rows split over the
        threads (no per-batch copy or allocation: copying out and merging on one thread left the loop several
        times the GPU's time; docs/performance.md#run-loop-defaults). With planning, merging and collecting threads about,
        the thread feeding the GPU must not wait Python's default 5 ms for the GIL: a shorter switch
        interval while the loop runs."""
        with interpreter_for_loop(self.options):  # the GIL switch interval, the collector paused
            if self.planning is not None:
                self.planning.submit(self.texts)
            with ThreadPoolExecutor(max_workers=max(1, self.merge_workers), thread_name_prefix="trtforge-merge") as pool:
                if not self.options.precision_check:
                    consume = partial(self.consume, pool)
                    for _ in (
                        self.target.run_many(stream, consume=consume, place=self.place)
                        if self.copy_merge is not None
                        else self.target.run_many(stream, consume=consume)
                    ):
                        pass
                else:
                    pending = []
                    for tag, out in self.target.run_many(stream):
                        self.results[tag] = out  # kept for the ONNX Runtime comparison after the loop
                        pending.append(pool.submit(self.merge, self.batches[tag], out))
                    for future in pending:
                        future.result()

    def consume(self, pool: ThreadPoolExecutor, tag: int, views: dict[str, np.ndarray]) -> Any:
        """Merges a batch straight out of the target's output memory (no precision check keeps it)."""
        # release: nothing reads a batch's chunks after its merge here, so the list lets go of them
        # and their windows' arrays are freed once merged. Kept to the end of the loop, every input's
        # planned arrays were fresh memory, page-faulted in by the planning threads: 1.2-1.6 faults
        # and ~2-3 us of planning CPU per window on the dev machine (4.9-5.8 against 2.8-3.2 us).
        b, self.batches[tag] = self.batches[tag], None
        if self.overlap and self.merge_workers == 0:  # here, on the collecting thread, before the slot is restaged
            self.merge(b, views, None, True, self.placements.pop(tag, None))
            return None
        if self.overlap:  # one merge thread per batch; the slot waits for it, the collector does not
            return pool.submit(self.merge, b, views, None, True, self.placements.pop(tag, None))
        groups = [g for g in np.array_split(np.arange(len(b)), self.merge_workers) if len(g)]
        for future in [pool.submit(self.merge, b, views, g.tolist(), True) for g in groups]:
            future.result()
        return None


def _report(
    target: Any, p: Prepared, options: RunOptions, loop: _TimedLoop, clock: _LoopClock, sinks: _OutputSinks, copy_off: str | None
) -> dict[str, Any]:
    """The run's report (without its gates): what ran, the two errors, latency, throughput and the loop's runtime."""
    chunk_counts = list(loop.merger.counts)
    wall = clock.wall
    return {
        **p.report_head(options, target.label, chunk_counts),
        "batches": len(loop.batches),
        "precision_error": precision_error(p, loop.batches, loop.results, options)
        if options.precision_check
        else {"measured": False, "reason": "--no-precision-check"},
        "chunking_error": chunking_error(p, options, chunk_counts),
        "latency": latency_summary(target.timings),
        "throughput": {
            "seconds": wall,
            "inputs_per_s": len(p.docs) / wall,
            "tokens_per_s": sum(d.length for d in p.docs) / wall,
            "unit": length_unit({d.kind for d in p.docs}),
            "chunks_per_s": sum(chunk_counts) / wall,
            "clock": "tokenize, chunk, batch, run, merge (warm-up excluded; --save-outputs writes overlap it, the rest after the loop is runtime.saved_outputs.after_loop_s)",
        },
        "memory": target.memory(),
        "runtime": _runtime_report(target, options, loop, clock, sinks, copy_off),
    }


def _runtime_report(
    target: Any, options: RunOptions, loop: _TimedLoop, clock: _LoopClock, sinks: _OutputSinks, copy_off: str | None
) -> dict[str, Any]:
    """The report's runtime section: how the loop was set up and where its time and memory went."""
    reserved = sinks.reserved
    return {
        **_runtime(loop.workers, loop.merge_workers, target.runtime(), loop.host, clock.wall, clock.cpu, target.timings, clock.faults),
        "plan_processes": loop.planning.processes if loop.planning is not None else 0,
        "plan_ahead": options.plan_ahead,
        "overlap_merges": loop.overlap,
        "switch_interval_us": options.switch_interval_us,
        "gc": {"paused_in_loop": options.gc_pause, "collect_before_loop_s": clock.gc_before_s},
        "copy_engine_merge": loop.copy_merge.report() if loop.copy_merge is not None else {"enabled": False, "reason": copy_off},
        "output_pool": {
            **sinks.pool.report(),
            **(
                {"reserved": {**reserved.report(), "seconds": round(sinks.reserve_s, 6), "note": "page-locked before the clock"}}
                if reserved is not None
                else {}
            ),
        },
        "saved_outputs": sinks.saving,
    }


def default_plan_workers(mostly_waiting: bool, cpus: int, engine: bool = False) -> int:
    """Planning threads when --plan-workers is not given: min(8, CPUs) where they mostly wait without the GIL, on the
    tokenizer (it releases the GIL, so documents tokenize in parallel) or on planning processes (which plan even
    pre-tokenized ids; with tokenizing processes 2 planning threads starved the loop). Else planning is
    Python that contends for the GIL with the thread feeding the GPU: on an engine none (0: each input planned on that
    thread when its batches are needed), for ONNX Runtime 2 (its run releases the GIL, and the threads plan meanwhile).
    Planning on the thread feeding the GPU beat 2 planning threads on MiniLM and BERT-base from ids (figures:
    docs/performance.md#run-loop-defaults)."""
    if mostly_waiting:
        return min(8, max(1, cpus))
    return 0 if engine else min(2, max(1, cpus))


def _copy_merge_outputs(
    p: Prepared, options: RunOptions, warm: dict[str, tuple[tuple[int, ...], np.dtype]] | None, overlap: bool
) -> tuple[list[str], str | None]:
    """The token outputs the copy engine merges (copymerge.py), or none and why."""
    if not options.copy_engine_merge:
        return [], "off (--no-copy-engine-merge)"
    if not overlap:
        return [], "needs an engine, --no-precision-check and overlapped merges"
    if options.merge != "center":
        return [], f"--merge {options.merge} blends windows; only 'center' windows are copied"
    if not warm:
        return [], "no warm-up (--warmup 0): the merged outputs' layout is not known ahead"
    names = [n for n, k in p.kinds.items() if k.kind == "token" and k.seq_dim == 1 and not k.stride and n in warm]
    return (names, None) if names else ([], "no token output laid out [batch, positions, ...]")


def _pinned_reserve(p: Prepared, options: RunOptions, warm: dict[str, tuple[tuple[int, ...], np.dtype]] | None, names: list[str]) -> int:
    """Bytes of page-locked memory to reserve for the copy-engine merge's outputs: --pinned-reserve-mb, else
    copymerge.reserve_bytes over the batches in flight (queued ahead, in the slots, one merging)."""
    if options.pinned_reserve_mb is not None:
        return int(options.pinned_reserve_mb * 2**20)
    assert warm is not None
    per_position = sum(math.prod(warm[n][0]) * np.dtype(warm[n][1]).itemsize for n in names)
    bounds = [doc.length if doc.ids is not None or doc.text is None else len(doc.text.encode("utf-8")) for doc in p.docs]
    in_flight = (options.plan_ahead + options.slots + 1) * p.batch_cap if options.plan_ahead > 0 else None  # 0: unbounded
    return reserve_bytes(bounds, per_position, in_flight, options.chunk or p.limits.seq or max(bounds, default=1))


def _runtime(
    workers: int,
    merge_workers: int,
    target_runtime: dict[str, Any],
    host: StageClock,
    wall: float,
    cpu: float,
    timings: list[tuple[str, float, float | None]],
    faults: int,
) -> dict[str, Any]:
    """The target's runtime figures plus where the host's time went: the loop's wall and this process's CPU seconds
    (every thread's; planning processes' not), seconds per stage of the loop (plan, wait_plan, merge) and of the target
    (submit incl. stage_inputs, wait_slot, wait_gpu, copy_out), and each batch's wall and GPU ms in order (the timeline)."""
    target_runtime = dict(target_runtime)
    stages = {**host.report(), **target_runtime.pop("host_seconds", {})}
    return {
        "plan_workers": workers,
        "merge_workers": merge_workers,
        **target_runtime,
        "host": {
            "loop_wall_s": round(wall, 6),
            "loop_cpu_s": round(cpu, 6),
            "loop_minor_faults": faults,
            "stages": stages,
            "note": "seconds each stage took, summed over the threads that ran it (threads overlap); cpu_seconds: "
            "the CPU time those threads used meanwhile (the rest is waiting: for the GIL, a core, or the GPU where "
            "its synchronisation blocks; a spinning wait for the GPU counts as CPU time)",
        },
        "timeline": batch_timeline([w for _, w, _ in timings], [g for _, _, g in timings]),
    }


def _warm_up(p: Prepared, options: RunOptions, target: Any) -> dict[str, tuple[tuple[int, ...], np.dtype]] | None:
    """Untimed: the full-size batch of the first document's first chunk shape, `warmup` rounds of the
    target's warm_batches (TensorRT: one plain enqueue, then a graph capture per staging slot). The
    document is planned on a copy, so the timed run still tokenizes and plans it. Returns each token
    output's shape per position and dtype (what the merge can allocate ahead), None without a warm-up."""
    if options.warmup <= 0 or not p.docs:
        return None
    doc = replace(p.docs[0], feeds=dict(p.docs[0].feeds))
    chunks = plan_document(
        0, doc, p.specs, p.layout, options.chunk, options.overlap, p.limits, p.tokenizer, p.scales, options.full_last, p.slices
    )
    first = [c for c in chunks if shape_key(c) == shape_key(chunks[0])]
    size = 1 if options.naive else p.batch_cap
    batch = stack([first[i % len(first)] for i in range(size)])
    outs = list(target.run_many([(None, batch)] * (options.warmup * target.warm_batches)))
    target.timings.clear()
    target.reset_host_clock()  # runtime.host covers the timed loop only, like loop_wall_s
    templates = {}
    for name, kind in p.kinds.items():
        if kind.kind == "token" and outs and name in outs[-1][1]:
            part = chunk_part(kind, first[0], outs[-1][1][name][0:1])
            templates[name] = (tuple(part.shape[1:]), part.dtype)
    return templates
