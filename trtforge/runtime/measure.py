"""What `run` measures besides latency: precision against the reference, chunking against a whole pass, gates."""

from __future__ import annotations

from typing import Any

import numpy as np

from trtforge.backends.stored import RecordingReference, StoredReference
from trtforge.core.artifacts import (
    onnx_graph_hash,
    read_sidecar,
)
from trtforge.core.onnxio import load_onnx
from trtforge.runtime.documents import Chunk, Document
from trtforge.runtime.loop import (
    wall_over_gpu,
)
from trtforge.runtime.merge import chunk_part, merge_document
from trtforge.runtime.options import RunOptions
from trtforge.runtime.outputs import OutputKind, boxes_of
from trtforge.runtime.planning import Limits, plan_document, stack
from trtforge.runtime.prepare import Prepared
from trtforge.runtime.report import latency_stats, target_precision
from trtforge.verify.compare import Comparator, worst
from trtforge.verify.gates import evaluate_gates, gate_notes, gates_from
from trtforge.verify.tolerances import Tolerance


def comparator_for(kinds: dict[str, OutputKind], tolerances: dict[str, Tolerance] | None = None) -> Comparator:
    """The comparator for these outputs: by kind, boxes outputs by their BoxSpec."""
    return Comparator({name: k.kind for name, k in kinds.items()}, tolerances, boxes_of(kinds))


def gates_for(report: dict[str, Any], p: Prepared, options: RunOptions) -> dict[str, Any]:
    """The report's gates, with the defaults of the target's precision (verify/gates.py), which the report names."""
    onnx_sidecar = None if p.is_engine else read_sidecar(p.target_path, required=False)
    precision = target_precision(p.engine_sidecar if p.is_engine else None, onnx_sidecar, None if p.is_engine else p.target_path)
    gates = evaluate_gates(report, gates_from(options.gate_values(), precision, boxes=p.slices), tolerated=frozenset(p.tolerances))
    notes = gate_notes(options.gate_values(), precision)
    if p.tolerances:
        notes = [*notes, f"--atol/--rtol replace the default gates for {', '.join(p.tolerances)}"]
        if not (report.get("precision_error") or {}).get("measured"):
            why = (report.get("precision_error") or {}).get("reason", "not measured")
            gates = {
                **gates,
                "passed": False,
                "failures": [*gates["failures"], f"--atol/--rtol could not be evaluated: precision error not measured: {why}"],
            }
    gates = {"precision": precision, **gates}
    return {**gates, "notes": notes} if notes else gates


def precision_error(
    p: Prepared, batches: list[list[Chunk]], results: dict[int, dict[str, np.ndarray]], options: RunOptions
) -> dict[str, Any]:
    """The target against ONNX Runtime fp32 on the reference ONNX (or the outputs --load-reference stored), batch by
    batch on identical chunks; with --save-reference, the reference's outputs are kept for a later run."""
    if self_referenced(p) and not options.load_reference:
        return {"measured": False, "reason": "target is its own reference; pass --reference or run an engine"}
    reference: Any = p.reference
    if options.load_reference:
        reference = StoredReference(options.load_reference)
        reference.check_outputs(list(p.kinds))
    elif options.save_reference:
        reference = RecordingReference(p.reference, p.reference_path, onnx_graph_hash(load_onnx(p.reference_path)))
    comparator = comparator_for(p.kinds, p.tolerances)
    try:
        for i, b in enumerate(batches):
            add_precision(comparator, reference, b, results[i])
    finally:
        if isinstance(reference, StoredReference):
            reference.close()
    summary = precision_summary(comparator)
    if isinstance(reference, RecordingReference):
        reference.save(options.save_reference)
        summary["saved_reference"] = str(options.save_reference)
    if isinstance(reference, StoredReference):
        summary["scope"] = (
            f"target vs the reference outputs stored in {options.load_reference} "
            f"(from {reference.meta.get('reference_onnx')}, {reference.meta.get('made')}) on identical chunks"
        )
    return summary


def self_referenced(p: Prepared) -> bool:
    return not p.is_engine and p.target_path.resolve() == p.reference_path.resolve()


def add_precision(comparator: Comparator, reference: Any, batch: list[Chunk], out: dict[str, np.ndarray]) -> None:
    """One batch's target outputs judged against the reference ONNX run on the same stacked chunks."""
    feeds = stack(batch)
    comparator.add(reference.run(feeds), {k: v.astype(np.float32) for k, v in out.items()}, feeds.get("attention_mask"))


def precision_summary(comparator: Comparator) -> dict[str, Any]:
    per_output = comparator.result()
    return {
        "measured": True,
        "scope": "target vs ONNX Runtime fp32 on identical chunks",
        "per_output": per_output,
        "worst": worst(per_output),
    }


def latency_summary(timings: list[tuple[str, float, float | None]]) -> dict[str, Any]:
    groups: dict[str, list[tuple[float, float | None]]] = {}
    for label, wall, gpu in timings:
        groups.setdefault(label, []).append((wall, gpu))
    out: dict[str, Any] = {}
    for label, values in [("all", [(w, g) for _, w, g in timings])] + sorted(groups.items()):
        entry: dict[str, Any] = {"wall": latency_stats([w for w, _ in values])}
        gpus = [g for _, g in values if g is not None]
        ratio = wall_over_gpu([w for w, _ in values], [g for _, g in values])
        if ratio is not None:
            entry["gpu_compute"] = latency_stats(gpus)
            # how busy the GPU was: the wall time the batches cost over their GPU compute (1.0: never idle)
            entry["wall_over_gpu"] = ratio
            entry["wall_over_gpu_p50"] = entry["wall"]["p50_ms"] / entry["gpu_compute"]["p50_ms"]
        out[label] = entry
    return out


def whole_limit(size: int, limit: int | None, scales: list[float]) -> int:
    """The largest size <= limit the model takes whole whose output maps to whole pixels at every scale."""
    n = min(size, limit) if limit else size
    while n > 1 and any(abs(n * s - round(n * s)) > 1e-6 for s in scales):
        n -= 1
    return n


def measurement_input(doc: Document, p: Prepared) -> tuple[Document, str]:
    """The longest prefix (top-left crop for images) of `doc` that the model takes in one pass."""
    if doc.kind == "text":
        assert p.tokenizer is not None
        n = min(doc.length, p.limits.seq - p.tokenizer.specials) if p.limits.seq else doc.length
        return Document(doc.name, "text", {}, n, doc.ids[:n]), "whole" if n == doc.length else f"prefix of {n} tokens"
    if doc.kind == "seq":
        n = min(doc.length, p.limits.seq or doc.length)
        sub = Document(doc.name, "seq", p.layout.sliced(doc.feeds, {p.layout.seq_axis: (0, n)}), n)
        return sub, "whole" if n == doc.length else f"prefix of {n} positions"
    h, w = doc.hw
    hh, ww = whole_limit(h, p.limits.tile, p.scales), whole_limit(w, p.limits.tile, p.scales)
    ha, wa = p.layout.chunk_axes
    sub = Document(doc.name, "image", p.layout.sliced(doc.feeds, {ha: (0, hh), wa: (0, ww)}), hh * ww)
    return sub, "whole" if (hh, ww) == (h, w) else f"top-left {hh}x{ww} crop"


def chunking_error(p: Prepared, options: RunOptions, counts: list[int]) -> dict[str, Any]:
    """Chunked+merged vs one whole pass, both ONNX Runtime fp32, where chunking happens: on the longest
    prefix of each chunked input that the model takes whole, with that prefix itself chunked. counts: each input's
    chunks in the run."""
    return chunking_summary([chunking_error_of(doc, counts[d], p, options) for d, doc in enumerate(p.docs)], p.kinds)


def chunking_error_of(doc: Document, count: int, p: Prepared, options: RunOptions) -> tuple[dict[str, Any], Comparator | None]:
    """One input's share of the chunking error (`count`: its chunks in the run): its per_input entry and
    a comparator holding only this input (None when not measured). Per-input comparators merged in input
    order give the sums one comparator fed input by input gives, so the error does not depend on where
    (which process, which Ray actor) each input was measured."""
    if count == 1:
        return {"name": doc.name, "scope": "not chunked (fits one chunk)", "measured": False}, None
    if not options.chunking_check:
        return {"name": doc.name, "scope": "--no-chunking-check", "measured": False}, None
    if p.layout.fixed_length:
        return {
            "name": doc.name,
            "scope": f"not measurable: the model takes exactly {p.layout.fixed_length} positions, so no whole pass exists",
            "measured": False,
        }, None
    sub, scope = measurement_input(doc, p)
    sub_chunks = plan_document(
        0, sub, p.specs, p.layout, options.chunk, options.overlap, p.limits, p.tokenizer, p.scales, options.full_last, p.slices
    )
    if len(sub_chunks) < 2:
        longest = p.limits.seq if doc.kind != "image" else p.limits.tile
        return {
            "name": doc.name,
            "scope": f"not measurable: chunk ({options.chunk}) is not smaller than the longest input the model takes whole ({longest})",
            "measured": False,
        }, None
    comparator = comparator_for(p.kinds)
    whole_chunk = plan_document(0, sub, p.specs, p.layout, None, 0, Limits(), p.tokenizer, p.scales)[0]
    whole = p.reference.run(whole_chunk.feeds)
    parts: dict[str, list[tuple[Chunk, np.ndarray]]] = {}
    for c in sub_chunks:
        out = p.reference.run(c.feeds)
        for name, kind in p.kinds.items():
            parts.setdefault(name, []).append((c, chunk_part(kind, c, out[name])))
    for name, kind in p.kinds.items():
        if kind.kind == "box_scores":  # judged within its boxes output's detections
            continue
        scores, whole_scores = None, None
        if kind.kind == "boxes" and kind.boxes is not None:
            scores = parts[kind.boxes.scores]
            whole_scores = [(whole_chunk, chunk_part(p.kinds[kind.boxes.scores], whole_chunk, whole[kind.boxes.scores]))]
        merged = merge_document(sub, kind, parts[name], options, scores)
        reference = merge_document(sub, kind, [(whole_chunk, chunk_part(kind, whole_chunk, whole[name]))], options, whole_scores)
        comparator.add_output(name, reference[None], merged[None])
    return {"name": doc.name, "scope": scope, "chunks": len(sub_chunks), "measured": True}, comparator


def chunking_summary(parts: list[tuple[dict[str, Any], Comparator | None]], kinds: dict[str, OutputKind]) -> dict[str, Any]:
    """The report's chunking_error from chunking_error_of's results, in input order."""
    per_input = [entry for entry, _ in parts]
    if not any(i["measured"] for i in per_input):
        reasons = sorted({i["scope"] for i in per_input})
        return {"measured": False, "reason": "; ".join(reasons), "per_input": per_input}
    comparator = comparator_for(kinds)
    for _, part in parts:
        if part is not None:
            comparator.merge(part)
    per_output = comparator.result()
    return {
        "measured": True,
        "scope": "chunked+merged vs one whole pass, both ONNX Runtime fp32",
        "per_input": per_input,
        "per_output": per_output,
        "worst": worst(per_output),
    }
