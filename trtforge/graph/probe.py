"""Probe runs that let outputs.py infer output kinds: the reference model at two sizes of its chunk axis."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.artifacts import sidecar_chain
from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError
from trtforge.core.layout import Layout
from trtforge.runtime.feeds import random_feeds
from trtforge.runtime.outputs import (
    OutputKind,
    Probe,
    declared_boxes,
    declared_frame_rates,
    declared_kinds,
    needs_probe,
    probe_sizes,
    resolve,
)


def output_kinds(
    reference: OrtRunner,
    reference_path: Path,
    specs: list[InputSpec],
    axes: dict[str, AxisRange],
    layout: Layout,
    overrides: dict[str, tuple[str, float | None]] | None = None,
    chain: list[tuple[Path, dict]] | None = None,
    strict: bool = True,
) -> dict[str, OutputKind]:
    """Each output's kind: declared in the sidecar chain (or overridden), else inferred from probe runs
    (the reference at two sizes of its chunk axis). strict=False leaves undecidable kinds None."""
    chain = chain if chain is not None else sidecar_chain(reference_path)
    declared: dict[str, tuple[str | None, float | None]] = {}
    rates: dict[str, tuple[int, int]] = {}
    boxes = {}
    for _, side in reversed(chain):  # the nearest sidecar wins
        declared.update(declared_kinds(side.get("outputs")))
        rates.update(declared_frame_rates(side.get("outputs")))
        boxes.update(declared_boxes(side.get("outputs")))
    declared.update(overrides or {})
    unknown = [n for n in (overrides or {}) if n not in reference.output_names]
    if unknown:
        raise UserError(
            f"--output-kind names '{unknown[0]}', which is not an output of {reference_path.name} "
            f"(outputs: {', '.join(reference.output_names)})."
        )
    probes = []
    if needs_probe(reference.output_names, declared, boxes):
        for sizes in probe_sizes(layout, axes):
            out = reference.run(random_feeds(specs, sizes, seed=0))
            probes.append(Probe(sizes, {k: tuple(v.shape) for k, v in out.items()}))
    kinds = resolve(reference.output_names, declared, layout, probes, strict, boxes)
    for name, (stride, offset) in rates.items():  # a frame rate export measured: token outputs only
        if name in kinds and kinds[name].kind == "token":
            kinds[name] = replace(kinds[name], stride=stride, frame_offset=offset)
    return kinds
