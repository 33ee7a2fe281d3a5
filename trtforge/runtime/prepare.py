"""Everything `run` decides before its first inference: target, reference, kinds, documents, refusals."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtforge import __version__
from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.artifacts import (
    linked_path,
    read_sidecar,
    refuse_overwrite,
    sidecar_chain,
)
from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError, exception_summary
from trtforge.core.layout import Layout, model_layout
from trtforge.core.onnxio import load_onnx
from trtforge.graph.index import io_specs
from trtforge.graph.probe import output_kinds
from trtforge.runtime.audio import reading_specs, run_kinds, run_layout
from trtforge.runtime.chunking import (
    check_overlap,
)
from trtforge.runtime.documents import Chunk, Document, load_documents
from trtforge.runtime.feeds import random_feeds
from trtforge.runtime.options import RunOptions
from trtforge.runtime.outputs import OutputKind, boxes_of, merge_refusal, probe_sizes
from trtforge.runtime.planning import Limits, cut_into_windows, make_chunks, no_chunk_axis, plan_limits
from trtforge.runtime.report import SCHEMA
from trtforge.runtime.tokenize import TextTokenizer, find_tokenizer_dir
from trtforge.verify.tolerances import (
    Tolerance,
    parse_tolerances,
    tolerances_for,
)


def check_io(target: Any, reference: OrtRunner, target_path: Path, reference_path: Path) -> None:
    if sorted(target.input_names) != sorted(reference.input_names) or sorted(target.output_names) != sorted(reference.output_names):
        raise UserError(
            f"{target_path.name} has inputs {sorted(target.input_names)} / outputs {sorted(target.output_names)} but "
            f"{reference_path.name} has {sorted(reference.input_names)} / {sorted(reference.output_names)}; "
            "pass the ONNX the engine was built from as --reference."
        )


@dataclass
class Prepared:
    """Everything a run needs before inference: paths, specs, output kinds, documents and chunks."""

    target_path: Path
    is_engine: bool
    engine_sidecar: dict | None
    reference_path: Path
    specs: list[InputSpec]
    layout: Layout
    limits: Limits
    kinds: dict[str, OutputKind]
    tokenizer: TextTokenizer | None
    docs: list[Document]
    chunks: list[Chunk]
    batch_cap: int
    reference: OrtRunner
    tolerances: dict[str, Tolerance] = field(default_factory=dict)

    @property
    def scales(self) -> list[float]:
        return [k.scale for k in self.kinds.values() if k.kind == "dense" and k.scale]

    @property
    def slices(self) -> bool:
        """Images are cut into slices of one size (a detector's: planning.plan_document's `slices`)."""
        return bool(boxes_of(self.kinds))

    def report_head(self, options: RunOptions, backend: str, chunks: list[int]) -> dict[str, Any]:
        """The run report's first keys, up to `inputs` (one process or Ray alike); `chunks`: each input's count."""
        return {
            "schema": SCHEMA,
            "trtforge_version": __version__,
            "target": str(self.target_path),
            "backend": backend,
            "reference": str(self.reference_path),
            "outputs": {name: k.to_json() for name, k in self.kinds.items()},
            "tokenizer": str(self.tokenizer.directory) if self.tokenizer else None,
            "chunking": {
                "chunk": options.chunk,
                "overlap": options.overlap,
                "merge": options.merge,
                "batch_size": self.batch_cap,
                "max_length": self.limits.seq,
                "max_tile": self.limits.tile,
                "naive": options.naive,
                "last_window": options.last_window,
            },
            "inputs": [{"name": d.name, "kind": d.kind, "length": d.length, "chunks": chunks[i]} for i, d in enumerate(self.docs)],
        }


def prepare(target_path: Path, options: RunOptions, plan: bool = True) -> Prepared:
    """With plan=False, texts are not tokenized and `chunks` is empty: run() plans them while it runs."""
    target_path = Path(target_path)
    refuse_overwrite(
        "run",
        [target_path, options.reference, options.inputs, options.tokenizer, options.load_reference],
        files=[options.report, options.save_outputs, options.save_reference],
    )
    is_engine = target_path.suffix != ".onnx"
    engine_sidecar, reference_path = _reference_of(target_path, is_engine, options.reference)
    ref_model = load_onnx(reference_path)
    specs, axes, _ = io_specs(reference_path, ref_model)
    del ref_model
    chain = sidecar_chain(reference_path)
    probe_layout = model_layout(specs)  # output kinds are inferred on the model's own axes
    layout = run_layout(probe_layout, specs, chain, options.output_kinds, options.chunk, options.overlap, reference_path.name)
    limits = Limits(seq=layout.fixed_length) if layout.fixed_length else plan_limits(layout, axes, engine_sidecar)
    if options.chunk is not None:
        _check_chunk(options.chunk, options.overlap, layout, limits, target_path, is_engine)
    reference = OrtRunner(reference_path)
    kinds = output_kinds(reference, reference_path, specs, axes, probe_layout, options.output_kinds, chain)
    kinds = run_kinds(kinds, layout, options.chunk, options.overlap)
    tok_dir = options.tokenizer or find_tokenizer_dir(reference_path, chain)
    tokenizer = TextTokenizer(tok_dir) if tok_dir else None
    docs = load_documents(Path(options.inputs), reading_specs(specs, layout), layout, tokenizer, tokenize=plan)
    if not docs:
        raise UserError(f"{options.inputs} holds no inputs; add documents or arrays.")
    if is_engine:  # an engine whose fused attention dropped the mask must never see padding
        from trtforge.fusion.attention import refuse_padding

        for doc in docs:
            refuse_padding(engine_sidecar, doc.name, doc.feeds, target_path.name)
    if options.chunk is None and boxes_of(kinds) and _slice_at_model_size(options, docs, limits):
        _check_chunk(options.chunk, options.overlap, layout, limits, target_path, is_engine)
    if options.chunk is not None:
        refuse_unmergeable(kinds, docs, options.chunk, reference, reference_path, specs, axes, layout)
    scales = [k.scale for k in kinds.values() if k.kind == "dense" and k.scale]
    slices = bool(boxes_of(kinds))
    chunks = (
        make_chunks(docs, specs, layout, options.chunk, options.overlap, limits, tokenizer, scales, options.full_last, slices)
        if plan
        else []
    )
    batch_cap = _batch_cap(options.batch_size, layout, engine_sidecar, axes)
    tolerances = tolerances_for(
        list(kinds), parse_tolerances(options.atol, "--atol"), parse_tolerances(options.rtol, "--rtol"), options.error_stat
    )
    return Prepared(
        target_path,
        is_engine,
        engine_sidecar,
        reference_path,
        specs,
        layout,
        limits,
        kinds,
        tokenizer,
        docs,
        chunks,
        batch_cap,
        reference,
        tolerances,
    )


def _reference_of(target_path: Path, is_engine: bool, given: Path | None) -> tuple[dict | None, Path]:
    """The engine's sidecar (None for an ONNX) and the reference ONNX: --reference, else the one the target's sidecar
    records, else the target itself."""
    engine_sidecar = None
    if is_engine:
        from trtforge.build.engine_record import read_engine_sidecar

        engine_sidecar = read_engine_sidecar(target_path)
        recorded = engine_sidecar.get("reference_onnx") or engine_sidecar["source_onnx"]
    else:
        recorded = (read_sidecar(target_path, required=False) or {}).get("reference_onnx")
    # A recorded path relative to the folder its step ran in (older sidecars) is looked for from here too.
    if given:
        return engine_sidecar, Path(given)
    if recorded:
        return engine_sidecar, linked_path(target_path, str(recorded))
    return engine_sidecar, target_path


def _slice_at_model_size(options: RunOptions, docs: list[Document], limits: Limits) -> bool:
    """A detector given images larger than it takes, without --chunk, is sliced as SAHI slices: slices of the model's
    largest input, overlapping by --slice-overlap (default 0.2) of it. Sets options.chunk and options.overlap."""
    if limits.tile is None or not any(d.kind == "image" and max(d.hw) > limits.tile for d in docs):
        return False
    options.chunk, options.overlap = limits.tile, options.slice_overlap_pixels(limits.tile)
    return True


def _check_chunk(chunk: int, overlap: int, layout: Layout, limits: Limits, target_path: Path, is_engine: bool) -> None:
    """--chunk refused before anything runs where the model has no axis to chunk or takes no window (tile) that long."""
    check_overlap(chunk, overlap)
    if not layout.chunk_axes:
        raise no_chunk_axis(layout)
    limit = limits.seq if layout.kind == "sequence" else limits.tile
    if limit is not None and chunk > limit:
        where = (
            f"engine {target_path.name}'s largest profile"
            if is_engine
            else (f"the model's axis '{layout.seq_axis}'" if layout.kind == "sequence" else "the model's image axes")
        )
        what = f"--chunk {chunk}" + ("" if layout.kind == "sequence" else " (tile size)")
        raise UserError(f"{what} is larger than {where} ({limit}); rebuild with larger tiers or lower --chunk.")


def _batch_cap(batch_size: int, layout: Layout, engine_sidecar: dict | None, axes: dict[str, AxisRange]) -> int:
    """Chunks per batch: --batch-size, capped by the batch axis' largest size (the engine's profiles' or the model's);
    1 for a model without a batch axis."""
    if not layout.batch_axis:
        return 1
    b = layout.batch_axis
    cap = max(p["axes"][b][2] for p in engine_sidecar["profiles"]) if engine_sidecar else (axes[b].max if b in axes else None)
    return min(batch_size, cap) if cap else batch_size


def refuse_unmergeable(
    kinds: dict[str, OutputKind],
    docs: list[Document],
    chunk: int,
    reference: OrtRunner,
    reference_path: Path,
    specs: list[InputSpec],
    axes: dict[str, AxisRange],
    layout: Layout,
) -> None:
    """Before any window runs: an output whose windows cannot be merged back (outputs.merge_refusal) is a UserError,
    where --chunk cuts some input into several windows. The outputs' shapes come from one reference run at a probe
    size of the chunk axis (batch 1)."""
    if not any(cut_into_windows(doc, chunk) for doc in docs):
        return
    sizes = probe_sizes(layout, axes)[0]
    try:
        shapes = {name: tuple(value.shape) for name, value in reference.run(random_feeds(specs, sizes, seed=0)).items()}
    except Exception as exc:
        raise UserError(
            f"ONNX Runtime fails on {reference_path.name} at {', '.join(f'{k}={v}' for k, v in sizes.items())} "
            f"({exception_summary(exc, 200)}); check the model's axis ranges."
        ) from None
    positions = layout.fixed_length or (sizes.get(layout.seq_axis) if layout.seq_axis else None)
    dense = [name for name, kind in kinds.items() if kind.kind == "dense"]
    if boxes_of(kinds) and dense:
        raise UserError(
            f"output '{dense[0]}' is dense, and tiles of a dense map do not merge over the slices a detector's boxes are "
            "cut into; run whole images (without --chunk), or run the dense output from a model without the boxes."
        )
    for name, kind in kinds.items():
        why = merge_refusal(kind, layout.kind == "image", shapes.get(name), positions, layout.seq_axis)
        if why:
            raise UserError(why)


def check_save_outputs(docs: list[Document], path: Path | None) -> None:
    """Before any work: --save-outputs keys are INPUT/OUTPUT, so inputs sharing a name would overwrite each other."""
    if path is None:
        return
    from trtforge.core.artifacts import ensure_writable_dir

    ensure_writable_dir(Path(path))
    seen: dict[str, int] = {}
    for d, doc in enumerate(docs):
        if doc.name in seen:
            raise UserError(
                f"inputs {seen[doc.name]} and {d} are both named '{doc.name}', so --save-outputs {path} would keep "
                "only one of them; give the inputs distinct names."
            )
        seen[doc.name] = d
