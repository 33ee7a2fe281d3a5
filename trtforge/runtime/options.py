"""`run`'s options: one dataclass, and the one mapping from a config's `run` section to it (the CLI and the pipeline
both use it). The defaults a config can set come from the config schema (core/config.RunSection), so there is one
source of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trtforge.core.config import RunSection
from trtforge.core.errors import UserError
from trtforge.runtime.loop import (
    check_gpu_wait,
)
from trtforge.runtime.slicing import BOX_MERGES
from trtforge.verify.tolerances import (
    check_statistic,
)

_SECTION = RunSection()  # the config schema's defaults
DEFAULT_SLICE_OVERLAP = 0.2  # a detector sliced without --chunk: SAHI's default overlap ratio
SECTION_KEYS = ("chunk", "overlap", "batch_size", "merge", "last_window", "warmup", "slice_overlap", "box_merge", "iou")
GATE_KEYS = (
    "max_rel_l2",
    "min_cosine",
    "min_chunk_cosine",
    "min_top1_agreement",
    "min_pixel_agreement",
    "min_box_recall",
    "min_matched_iou",
    "min_chunk_box_recall",
    "min_chunk_matched_iou",
)


@dataclass
class RunOptions:
    inputs: Path
    chunk: int | None = _SECTION.chunk  # None: inputs cut at the model's own maximum length
    overlap: int = _SECTION.overlap
    batch_size: int = _SECTION.batch_size
    merge: str = _SECTION.merge
    warmup: int = _SECTION.warmup
    reference: Path | None = None
    backend: str = "auto"
    # Gates: None = not set (max_rel_l2 and min_cosine then take their defaults; see report.py).
    max_rel_l2: float | None = None
    min_cosine: float | None = None
    min_chunk_cosine: float | None = None
    min_top1_agreement: float | None = None
    min_pixel_agreement: float | None = None
    min_box_recall: float | None = None
    min_matched_iou: float | None = None
    min_chunk_box_recall: float | None = None
    min_chunk_matched_iou: float | None = None
    # Detectors: image slices overlapping by this share of --chunk (sets overlap), their boxes merged by nms or greedy
    # merging at IoU `iou` (runtime/slicing.py)
    slice_overlap: float | None = _SECTION.slice_overlap
    box_merge: str = _SECTION.box_merge
    iou: float = _SECTION.iou
    providers: list[str] = field(default_factory=list)
    report: Path | None = None
    naive: bool = False  # one chunk per execute (for benchmarks)
    save_outputs: Path | None = None  # merged outputs per input and output, as .npz keys INPUT/OUTPUT
    tokenizer: Path | None = None  # a local HF tokenizer dir; else the one the export sidecar names
    output_kinds: dict[str, tuple[str, float | None]] = field(default_factory=dict)  # --output-kind overrides
    # The TensorRT loop (tensorrt_runtime.TrtRunner); off switches exist to measure what each buys.
    cuda_graphs: bool = True
    shared_device_memory: bool = True
    pad_batches: bool = True  # a partial batch runs padded to a batch size that ran (runloop.padded_batch)
    gpu_wait: str = "spin"  # how the collector waits for a batch: spin (CUDA's default here) or block (TrtRunner)
    slots: int = 3  # staging slots: batches in flight
    plan_workers: int | None = None  # threads tokenizing and planning documents while batches run (None: run.default_plan_workers;
    # 0: each input planned on the thread feeding the GPU)
    plan_ahead: int = 8  # batches planning may run ahead of the GPU loop (0: unbounded; runloop.stream_batches)
    merge_workers: int | None = None  # threads merging outputs back per input while batches run (None: min(2, CPUs))
    # on an engine without the precision check: each batch merged on one merge thread while the collector goes on to
    # the next batch (its slot is reused once the merge is done); False: a batch's rows split over the merge threads
    # and the collector waits for them
    overlap_merges: bool = True
    # with overlapped merges: the GPU's copy engine writes token outputs' kept windows straight into their inputs'
    # merged outputs (page-locked pooled memory, reserved before the clock), so the host copies none of those bytes
    # (copymerge.py). On by default: closer to the GPU's time than the host merge, with bit-equal outputs (figures:
    # docs/performance.md#copy-engine-merge-defaults)
    copy_engine_merge: bool = True
    # with the copy-engine merge: MB of page-locked memory reserved before the clock for the merged outputs (None: sized
    # by copymerge.reserve_bytes; 0: none, every pooled buffer page-locked when first needed, inside the loop)
    pinned_reserve_mb: float | None = None
    # worker processes tokenizing and planning text inputs (planning_processes.py; 0: the planning threads do it); they
    # are spawned, so a script calling run() with it must guard its top level with `if __name__ == "__main__":`
    plan_processes: int = 0
    # Python's GIL switch interval while the loop runs: a thread back from a GIL-free numpy copy or CUDA wait waits up to
    # this long for the GIL while another thread runs Python (benchmarks/gil_handoff.py); Python's default is 5000.
    # 20-500 ran alike on MiniLM (docs/performance.md#run-loop-defaults)
    switch_interval_us: int = 500
    # Python's cyclic garbage collector off while the loop runs, after one collection before the clock (collect_garbage)
    gc_pause: bool = True
    last_window: str = _SECTION.last_window  # a sequence's last window: "full" (ends at the input's end, as long as the others) or "short"
    # False: no ONNX Runtime pass over every chunk after the loop, and no outputs kept for it (speed runs: it took
    # minutes of CPU after a ~1 s BERT-base run, docs/performance.md#run-loop-defaults); precision is reported not measured.
    precision_check: bool = True
    # False: no chunked-vs-whole ONNX Runtime fp32 pass per input after the loop (it can take a minute of CPU after a
    # ~1 s BERT-base run; docs/performance.md#run-loop-defaults); the chunking error is reported not measured.
    chunking_check: bool = True
    plugin_libraries: list[str] = field(default_factory=list)  # override the engine sidecar's plugin libraries' paths
    # Per-output tolerances (verify/tolerances.py): 'NAME:VALUE' or 'VALUE', on the error statistic error_stat.
    atol: list[str] = field(default_factory=list)
    rtol: list[str] = field(default_factory=list)
    error_stat: str = "elemwise"
    save_reference: Path | None = None  # the precision check's reference outputs, kept for --load-reference
    load_reference: Path | None = None  # judge the target against stored reference outputs instead of running the reference

    def __post_init__(self) -> None:
        check_statistic(self.error_stat)
        if self.save_reference and self.load_reference:
            raise UserError(
                "--save-reference and --load-reference do not combine: a stored reference is saved from a run "
                "that computes it; pass one of them."
            )
        if (self.save_reference or self.load_reference) and not self.precision_check:
            raise UserError("--save-reference/--load-reference belong to the precision check; drop --no-precision-check.")
        if self.last_window not in ("full", "short"):
            raise UserError(f"unknown --last-window '{self.last_window}'; use full or short.")
        check_gpu_wait(self.gpu_wait)
        if self.plan_ahead < 0:
            raise UserError(f"--plan-ahead {self.plan_ahead} is negative; use 0 (no bound) or a number of batches.")
        if self.pinned_reserve_mb is not None and self.pinned_reserve_mb < 0:
            raise UserError(f"--pinned-reserve-mb {self.pinned_reserve_mb:g} is negative; use 0 (reserve nothing) or a size in MB.")
        if self.plan_workers is not None and self.plan_workers < 0:
            raise UserError(f"--plan-workers {self.plan_workers} is negative; use 0 (plan on the thread feeding the target) or more.")
        if self.merge_workers is not None and self.merge_workers < 0:
            raise UserError(f"--merge-workers {self.merge_workers} is negative; use 0 (merge on the collecting thread) or more.")
        if self.switch_interval_us < 1:
            raise UserError(f"--switch-interval-us {self.switch_interval_us} must be at least 1 (microseconds).")
        if self.box_merge not in BOX_MERGES:
            raise UserError(f"unknown --box-merge '{self.box_merge}'; use nms or greedy.")
        if not 0 < self.iou <= 1:
            raise UserError(f"--iou must be above 0 and at most 1, got {self.iou:g}.")
        if self.slice_overlap is not None:
            if not 0 <= self.slice_overlap < 1:
                raise UserError(f"--slice-overlap must be at least 0 and below 1 (a share of the slice size), got {self.slice_overlap:g}.")
            if self.chunk is not None:
                self.overlap = self.slice_overlap_pixels(self.chunk)

    def slice_overlap_pixels(self, size: int) -> int:
        """--slice-overlap's share of a slice size, in pixels (SAHI's DEFAULT_SLICE_OVERLAP where it is unset)."""
        share = DEFAULT_SLICE_OVERLAP if self.slice_overlap is None else self.slice_overlap
        return int(round(share * size))

    @property
    def full_last(self) -> bool:
        return self.last_window == "full"

    def gate_values(self) -> dict[str, float | None]:
        return {
            "max_rel_l2": self.max_rel_l2,
            "min_cosine": self.min_cosine,
            "min_chunk_cosine": self.min_chunk_cosine,
            "min_top1_agreement": self.min_top1_agreement,
            "min_pixel_agreement": self.min_pixel_agreement,
            "min_box_recall": self.min_box_recall,
            "min_matched_iou": self.min_matched_iou,
            "min_chunk_box_recall": self.min_chunk_box_recall,
            "min_chunk_matched_iou": self.min_chunk_matched_iou,
        }


# -- inputs --------------------------------------------------------------------------------------


def options_from_section(section: RunSection, inputs: Path | None = None, no_chunking: bool = False, **given: object) -> RunOptions:
    """The options a run section gives, with what the user gave (not None) taking precedence. Gates are 'set' only where
    a flag or the YAML sets them (an unset one takes its default, which fails nothing when unevaluable: verify/gates.py);
    paths in the section are taken as written. no_chunking: whole inputs (chunk None, overlap 0)."""
    chosen = inputs or (Path(section.inputs) if section.inputs else None)
    if chosen is None:
        raise UserError("no inputs given; pass --inputs FOLDER or set run.inputs in the config.")
    values: dict[str, object] = {key: getattr(section, key) for key in SECTION_KEYS}
    values.update({key: getattr(section, key) if key in section.model_fields_set else None for key in GATE_KEYS})
    values.update({key: Path(v) for key in ("reference", "report") if (v := getattr(section, key))})
    values.update({key: value for key, value in given.items() if value is not None})
    if no_chunking:
        values.update(chunk=None, overlap=0)
    return RunOptions(inputs=chosen, **values)  # type: ignore[arg-type]
