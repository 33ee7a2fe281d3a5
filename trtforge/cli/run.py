"""`trtforge run`: chunked inference checked for accuracy and latency."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer

from trtforge.cli import options as opt
from trtforge.cli import render
from trtforge.core import ui
from trtforge.core.errors import UserError

if TYPE_CHECKING:
    from trtforge.runtime.options import RunOptions


def run_cmd(
    target: Path = typer.Argument(..., metavar="ENGINE|ONNX", help="An engine from trtforge build, or an ONNX (ONNX Runtime)."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", "-i", help="Folder or .jsonl of texts, .npy/.npz arrays, images or .wav."),
    chunk: Optional[int] = typer.Option(
        None,
        "--chunk",
        callback=opt.config_key("run.chunk", "--chunk"),
        help="Chunk size along the sequence, special tokens included (tile size for images).",
    ),
    overlap: Optional[int] = typer.Option(
        None, "--overlap", callback=opt.config_key("run.overlap", "--overlap"), help="Positions shared by consecutive chunks."
    ),
    no_chunking: bool = typer.Option(False, "--no-chunking", help="Run whole inputs; longer ones are an error."),
    merge: Optional[str] = typer.Option(
        None,
        "--merge",
        callback=opt.config_key("run.merge", "--merge"),
        help="center (keep each position from its most central chunk), or a linear, cosine or gaussian blend.",
    ),
    batch_size: Optional[int] = typer.Option(
        None,
        "--batch-size",
        callback=opt.config_key("run.batch_size", "--batch-size"),
        help="Chunks per batch (capped by the profile's batch max).",
    ),
    reference: Optional[Path] = typer.Option(None, "--reference", help="fp32 ONNX to check against (default: the engine's source)."),
    report: Optional[Path] = typer.Option(None, "--report", help="Write the JSON report here."),
    backend: str = typer.Option(
        "auto", "--backend", callback=opt.one_of(opt.BACKENDS, "--backend"), help="For engines: auto, tensorrt or tensorrt_rtx."
    ),
    provider: Optional[list[str]] = typer.Option(
        None, "--provider", callback=opt.check_providers, help="ONNX Runtime providers for an ONNX target (repeatable)."
    ),
    warmup: Optional[int] = typer.Option(
        None, "--warmup", callback=opt.config_key("run.warmup", "--warmup"), help="Untimed warm-up runs per batch shape."
    ),
    tokenizer: Optional[Path] = typer.Option(
        None, "--tokenizer", help="A local Hugging Face tokenizer directory (default: the one export saved)."
    ),
    output_kind: Optional[list[str]] = typer.Option(
        None, "--output-kind", help="NAME=token|pooled|logits|dense[:SCALE], for outputs the sidecar does not declare (repeatable)."
    ),
    max_rel_l2: Optional[float] = typer.Option(
        None,
        "--max-rel-l2",
        callback=opt.config_key("run.max_rel_l2", "--max-rel-l2"),
        help="Precision gate on rel-L2 (default by the target's precision: fp32 1e-4, fp16 1e-2, INT8/FP8 none).",
    ),
    min_cosine: Optional[float] = typer.Option(
        None,
        "--min-cosine",
        callback=opt.config_key("run.min_cosine", "--min-cosine"),
        help="Precision gate on cosine (default 0.99 for fp16, INT8 and FP8 targets).",
    ),
    min_chunk_cosine: Optional[float] = typer.Option(
        None,
        "--min-chunk-cosine",
        callback=opt.config_key("run.min_chunk_cosine", "--min-chunk-cosine"),
        help="Chunking gate on the worst per-input cosine (default: not gated).",
    ),
    min_top1_agreement: Optional[float] = typer.Option(
        None,
        "--min-top1-agreement",
        callback=opt.config_key("run.min_top1_agreement", "--min-top1-agreement"),
        help="Precision gate on logits outputs' top-1 agreement.",
    ),
    min_pixel_agreement: Optional[float] = typer.Option(
        None,
        "--min-pixel-agreement",
        callback=opt.config_key("run.min_pixel_agreement", "--min-pixel-agreement"),
        help="Precision gate on dense outputs' per-pixel argmax agreement.",
    ),
    slice_overlap: Optional[float] = typer.Option(
        None,
        "--slice-overlap",
        callback=opt.config_key("run.slice_overlap", "--slice-overlap"),
        help="Detectors: slices of an image share this share of --chunk (the slice size) with their neighbours; sets --overlap. Without --chunk, images larger than the model takes are sliced at its input size with 0.2.",
    ),
    box_merge: Optional[str] = typer.Option(
        None,
        "--box-merge",
        callback=opt.config_key("run.box_merge", "--box-merge"),
        help="Detectors: how the slices' boxes merge, class by class: nms (keep the best of overlapping boxes) or greedy (it grows to their union).",
    ),
    iou: Optional[float] = typer.Option(
        None,
        "--iou",
        callback=opt.config_key("run.iou", "--iou"),
        help="Detectors: the IoU at which --box-merge merges two boxes (default 0.5).",
    ),
    min_box_recall: Optional[float] = typer.Option(
        None,
        "--min-box-recall",
        callback=opt.config_key("run.min_box_recall", "--min-box-recall"),
        help="Precision gate on boxes outputs: share of the reference's boxes the target finds at IoU >= 0.5 (default 0.9).",
    ),
    min_matched_iou: Optional[float] = typer.Option(
        None,
        "--min-matched-iou",
        callback=opt.config_key("run.min_matched_iou", "--min-matched-iou"),
        help="Precision gate on boxes outputs: mean IoU of the matched boxes (default 0.9).",
    ),
    min_chunk_box_recall: Optional[float] = typer.Option(
        None,
        "--min-chunk-box-recall",
        callback=opt.config_key("run.min_chunk_box_recall", "--min-chunk-box-recall"),
        help="Slicing gate: share of the whole pass's boxes the sliced run finds (default: not gated).",
    ),
    min_chunk_matched_iou: Optional[float] = typer.Option(
        None,
        "--min-chunk-matched-iou",
        callback=opt.config_key("run.min_chunk_matched_iou", "--min-chunk-matched-iou"),
        help="Slicing gate: mean IoU of the sliced run's boxes matched to the whole pass's (default: not gated).",
    ),
    atol: Optional[list[str]] = typer.Option(
        None,
        "--atol",
        help="Absolute tolerance NAME:VALUE or VALUE (every output), on --error-stat; replaces the default gates for the outputs it names (repeatable).",
    ),
    rtol: Optional[list[str]] = typer.Option(
        None, "--rtol", help="Relative tolerance NAME:VALUE or VALUE (every output), on --error-stat (repeatable)."
    ),
    error_stat: str = typer.Option(
        "elemwise",
        "--error-stat",
        help="What --atol/--rtol bound: elemwise (every element within atol + rtol x |reference|), or the max, mean, median or a quantile qNN (e.g. q99) of the absolute error (<= atol) or relative error (<= rtol).",
    ),
    save_reference: Optional[Path] = typer.Option(
        None, "--save-reference", help="Keep the precision check's reference outputs (.npz), so a later run can --load-reference them."
    ),
    load_reference: Optional[Path] = typer.Option(
        None,
        "--load-reference",
        help="Judge the target against reference outputs a run stored with --save-reference (same inputs and chunking) instead of running the reference.",
    ),
    naive: bool = typer.Option(False, "--naive", help="One chunk per execute, no batching (the baseline of benchmarks/run.py)."),
    cuda_graphs: bool = typer.Option(
        True, "--cuda-graphs/--no-cuda-graphs", help="TensorRT: capture each batch shape as a CUDA graph and replay it."
    ),
    shared_memory: bool = typer.Option(
        True, "--shared-memory/--no-shared-memory", help="TensorRT: one device-memory block for all profile contexts."
    ),
    gpu_wait: str = typer.Option(
        "spin",
        "--gpu-wait",
        callback=opt.one_of(("spin", "block"), "--gpu-wait"),
        help="TensorRT: how the collecting thread waits for each batch: spin (CUDA's default: a core polls) or block (it sleeps until the GPU signals).",
    ),
    pad_batches: bool = typer.Option(
        True,
        "--pad-batches/--no-pad-batches",
        help="TensorRT: run a partial batch padded (copies of its last row, dropped after) to a batch size that already ran, instead of as a new shape.",
    ),
    slots: int = typer.Option(3, "--slots", min=1, help="TensorRT: staging slots, i.e. batches in flight."),
    plan_workers: Optional[int] = typer.Option(
        None,
        "--plan-workers",
        min=0,
        help="Threads tokenizing and chunking inputs while batches run (default: min(8, CPUs) where inputs are text to tokenize, else 0 on an engine and 2 on ONNX Runtime; 0: each input planned on the thread feeding the GPU, when its batches are needed).",
    ),
    plan_ahead: int = typer.Option(
        8,
        "--plan-ahead",
        min=0,
        help="Batches planned ahead of the GPU loop, queued (0: no bound); besides them at most 2 x plan-workers documents are planned ahead (with --plan-processes, at least 2 per process).",
    ),
    overlap_merges: bool = typer.Option(
        True,
        "--overlap-merges/--no-overlap-merges",
        help="With --no-precision-check on an engine: merge each batch on one merge thread while the next is collected (off: split a batch's rows over the merge threads and wait).",
    ),
    copy_engine_merge: bool = typer.Option(
        True,
        "--copy-engine-merge/--no-copy-engine-merge",
        help="With overlapped merges: the GPU's copy engine writes token outputs' kept windows straight into each input's merged output (page-locked, pooled, reserved before the clock), so the host copies none of those bytes (off: the merge threads copy them).",
    ),
    pinned_reserve_mb: Optional[float] = typer.Option(
        None,
        "--pinned-reserve-mb",
        min=0,
        help="With the copy-engine merge: MB of page-locked memory reserved before the clock for the merged outputs (default: sized by the batches in flight; 0: page-lock each pooled buffer when first needed).",
    ),
    plan_processes: int = typer.Option(
        0,
        "--plan-processes",
        "--tokenize-processes",
        min=0,
        help="Worker processes tokenizing text inputs and cutting them into windows, started before the clock, so the loop's process only unpickles each input's windows (0: the planning threads do it; --tokenize-processes: its former name).",
    ),
    last_window: Optional[str] = typer.Option(
        None,
        "--last-window",
        callback=opt.config_key("run.last_window", "--last-window"),
        help="A sequence's last window: full (ends at the input's end, as long as the others, so it batches with them; the default) or short (the remainder). Config: run.last_window.",
    ),
    switch_interval_us: int = typer.Option(
        500,
        "--switch-interval-us",
        min=1,
        help="Python's GIL switch interval while the loop runs, in microseconds: how long a thread coming back from a copy or a CUDA wait may wait for the GIL.",
    ),
    gc_pause: bool = typer.Option(
        True,
        "--gc-pause/--no-gc-pause",
        help="Python's cyclic garbage collector off while the loop runs (one collection before the clock): a full collection stops every thread of the loop for tens of ms.",
    ),
    merge_workers: Optional[int] = typer.Option(
        None,
        "--merge-workers",
        min=0,
        help="Threads merging outputs while batches run (default: min(2, CPUs), the fastest measured: docs/performance.md; 0: each batch merged on the thread collecting it, with --overlap-merges on an engine without the precision check).",
    ),
    save_outputs: Optional[Path] = typer.Option(None, "--save-outputs", help="Write every merged output as .npz, keys INPUT/OUTPUT."),
    precision_check: bool = typer.Option(
        True,
        "--precision-check/--no-precision-check",
        help="Check every chunk against ONNX Runtime fp32 after the run (off: speed runs; precision gates you set then fail).",
    ),
    plugin_library: Optional[list[str]] = typer.Option(
        None,
        "--plugin-library",
        help="Where the plugin libraries the engine was built with are on this machine (repeatable; default: the paths its sidecar records, and for a libtrtforge_plugins.so that is not here, the one `trtforge plugins build` cached for this TensorRT and GPU).",
    ),
    chunking_check: bool = typer.Option(
        True,
        "--chunking-check/--no-chunking-check",
        help="Measure chunked+merged vs one whole pass on ONNX Runtime fp32 for every chunked input after the run (off: speed runs; a min_chunk_cosine gate you set then fails).",
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config whose 'run' section gives defaults."),
    ray: Optional[str] = typer.Option(
        None, "--ray", help="Shard the inputs over Ray actors: 'auto' (a local cluster, or the one RAY_ADDRESS names) or a cluster address."
    ),
    ray_actors: Optional[int] = typer.Option(
        None,
        "--ray-actors",
        callback=opt.at_least(1, "--ray-actors"),
        help="With --ray: actors to start (default: one per GPU for an engine, one per CPU for an ONNX).",
    ),
    stateful: bool = typer.Option(
        False, "--stateful", help="KV-cache model: exact chunked prefill, the cache kept on the device between chunks."
    ),
    generate: int = typer.Option(
        0,
        "--generate",
        callback=opt.at_least(0, "--generate"),
        help="With --stateful: greedy-decode N tokens with the cache, checked against a full recompute.",
    ),
    json_out: bool = opt.JsonOpt,
) -> None:
    """Chunked inference checked against ONNX Runtime: precision and chunking errors, latency, throughput, memory."""
    if ray_actors is not None and not ray:
        raise UserError(f"--ray-actors {ray_actors} applies with --ray (actors on a Ray cluster); add --ray auto or drop it.")
    if stateful or generate:
        _refuse_with_stateful(ray, plugin_library)
        from trtforge.runtime.stateful import run_command

        return run_command(target, inputs, chunk, generate, reference, report, backend, provider, max_rel_l2, json_out)
    from trtforge.core.config import RunSection, load_config
    from trtforge.runtime.options import options_from_section
    from trtforge.runtime.outputs import parse_override
    from trtforge.runtime.step import run as run_step

    section = load_config(config).run if config else opt.section_for_target(target) or RunSection()

    options = options_from_section(
        section,
        inputs=inputs,
        no_chunking=no_chunking,
        chunk=chunk,
        overlap=overlap,
        batch_size=batch_size,
        merge=merge,
        warmup=warmup,
        reference=reference,
        backend=backend,
        max_rel_l2=max_rel_l2,
        min_cosine=min_cosine,
        min_chunk_cosine=min_chunk_cosine,
        min_top1_agreement=min_top1_agreement,
        min_pixel_agreement=min_pixel_agreement,
        min_box_recall=min_box_recall,
        min_matched_iou=min_matched_iou,
        min_chunk_box_recall=min_chunk_box_recall,
        min_chunk_matched_iou=min_chunk_matched_iou,
        slice_overlap=slice_overlap,
        box_merge=box_merge,
        iou=iou,
        providers=list(provider or []),
        report=report,
        naive=naive,
        tokenizer=tokenizer,
        output_kinds=dict(parse_override(o) for o in output_kind or []),
        save_outputs=save_outputs,
        cuda_graphs=cuda_graphs,
        shared_device_memory=shared_memory,
        pad_batches=pad_batches,
        gpu_wait=gpu_wait,
        slots=slots,
        precision_check=precision_check,
        chunking_check=chunking_check,
        plugin_libraries=list(plugin_library or []),
        plan_workers=plan_workers,
        plan_ahead=plan_ahead,
        overlap_merges=overlap_merges,
        copy_engine_merge=copy_engine_merge,
        pinned_reserve_mb=pinned_reserve_mb,
        merge_workers=merge_workers,
        plan_processes=plan_processes,
        last_window=last_window,
        switch_interval_us=switch_interval_us,
        gc_pause=gc_pause,
        atol=list(atol or []),
        rtol=list(rtol or []),
        error_stat=error_stat,
        save_reference=save_reference,
        load_reference=load_reference,
    )
    if options.merge not in ("center", "linear", "cosine", "gaussian"):
        raise UserError(f"unknown --merge '{options.merge}'; use center, linear, cosine or gaussian.")
    log = (lambda msg: None) if json_out else (lambda msg: ui.console(stderr=True).print(msg, markup=False))
    if ray:
        result = _run_on_ray(target, options, ray, ray_actors, plan_workers, merge_workers, log)
    else:
        result = run_step(target, options, progress=log)
    _show_and_gate(result, options.report, json_out)


def _refuse_with_stateful(ray: Optional[str], plugin_library: Optional[list[str]]) -> None:
    """The flags a KV-cache run cannot honour, refused before anything loads."""
    if ray:
        raise UserError("--ray does not combine with --stateful/--generate (a KV cache lives on one device); drop one.")
    if plugin_library:
        raise UserError(
            "--plugin-library does not combine with --stateful/--generate yet: the stateful runner loads "
            "the libraries its engine's sidecar records; rebuild the engine where the library now is."
        )


def _run_on_ray(
    target: Path,
    options: RunOptions,
    ray: str,
    ray_actors: Optional[int],
    plan_workers: Optional[int],
    merge_workers: Optional[int],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The run sharded over Ray actors, once the flags of one process's loop (which no actor has) are refused."""
    for flag, value in (
        ("--plan-processes", options.plan_processes or None),
        ("--plan-workers", plan_workers),
        ("--merge-workers", merge_workers),
    ):
        if value is not None:
            raise UserError(
                f"{flag} applies to one process's loop; with --ray the driver plans every input before the "
                "clock and each actor merges its units on one thread, drop it."
            )
    from trtforge.scaleout.ray_run import RayOptions, run_ray

    return run_ray(target, options, RayOptions(ray, opt.positive(ray_actors, "--ray-actors")), progress=log)


def _show_and_gate(result: dict[str, Any], report: Optional[Path], json_out: bool) -> None:
    """The result as JSON or tables, then exit 1 (GateFailed) when a gate failed."""
    from trtforge.core.errors import GateFailed

    if json_out:
        ui.print_json(result)
    else:
        render.run_report(result)
    if not result["gates"]["passed"]:
        raise GateFailed("; ".join(result["gates"]["failures"]) + (f"; see {report}" if report else ""))
