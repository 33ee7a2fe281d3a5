"""What each model output means (token | pooled | logits | dense), declared or inferred. Pure.

The kind decides how chunks merge and which metrics judge an output, so it is never guessed: it is
declared in the config (`outputs: [{name, kind, scale}]`, carried by the export sidecar), or inferred
only where the shapes leave no doubt, from probe runs of the model at two sizes of its chunk axis:
- rank 3 whose dim 1 follows the input's sequence axis -> token;
- rank 4 of an image model -> dense, scale = output H / input H (the same for W and at every probe);
- rank 2 [batch, N] is a pooled vector or class logits: only a declaration can tell -> UserError.
A boxes output is only ever declared (with its format and the output holding its class logits or scores, which
becomes a box_scores output: verify/boxes.py); the sidecar carries its BoxSpec under `boxes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from trtforge.core.errors import UserError
from trtforge.core.layout import Layout
from trtforge.verify.boxes import BoxSpec

KINDS = ("token", "pooled", "logits", "dense")
BOX_KINDS = ("boxes", "box_scores")  # declared in the config only: a boxes output needs its BoxSpec


@dataclass(frozen=True)
class OutputKind:
    name: str
    kind: str | None  # None: unknown (strict=False only)
    scale: float | None = None  # dense only: output spatial size / input spatial size
    source: str = "declared"  # declared | inferred
    stride: int | None = None  # token only: input samples per output frame, measured at export (runtime/audio.py)
    frame_offset: int = 0  # token with a stride: frames(L) = (L - frame_offset) // stride
    fixed_window: int | None = None  # a model that takes exactly this many input positions (windows padded to it)
    boxes: BoxSpec | None = None  # boxes only: how its boxes and scores read

    @property
    def seq_dim(self) -> int:
        return 1

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.kind, "scale": self.scale, "source": self.source}
        if self.stride is not None:
            out.update(stride=self.stride, frame_offset=self.frame_offset)
        return {**out, "boxes": self.boxes.to_json()} if self.boxes else out

    def frames(self, positions: int) -> int:
        """The output's positions for `positions` input positions."""
        return positions if self.stride is None else max(0, (positions - self.frame_offset) // self.stride)


def boxes_of(kinds: dict[str, OutputKind]) -> dict[str, BoxSpec]:
    """Each boxes output's BoxSpec, by name (a model with one is cut into slices, and compared by matching)."""
    return {name: k.boxes for name, k in kinds.items() if k.kind == "boxes" and k.boxes is not None}


def declared_boxes(sidecar_outputs: list[Any] | None) -> dict[str, BoxSpec]:
    """{boxes output: its BoxSpec} from the export sidecar's `outputs`."""
    specs = {}
    for entry in sidecar_outputs or []:
        if isinstance(entry, dict) and entry.get("kind") == "boxes" and isinstance(entry.get("boxes"), dict):
            specs[entry["name"]] = BoxSpec.from_json(entry["boxes"])
    return specs


@dataclass(frozen=True)
class Probe:
    """One run of the model: the size given to each axis, and the shape of every output."""

    sizes: dict[str, int]
    shapes: dict[str, tuple[int, ...]]


def declared_kinds(
    sidecar_outputs: list[Any] | None, overrides: dict[str, tuple[str, float | None]] | None = None
) -> dict[str, tuple[str | None, float | None]]:
    """{output: (kind or None, scale or None)} from the export sidecar's `outputs`, then overrides."""
    declared: dict[str, tuple[str | None, float | None]] = {}
    for entry in sidecar_outputs or []:
        if isinstance(entry, dict) and entry.get("name"):
            declared[entry["name"]] = (entry.get("kind"), entry.get("scale"))
    for name, (kind, scale) in (overrides or {}).items():
        declared[name] = (kind, scale)
    return declared


def declared_frame_rates(sidecar_outputs: list[Any] | None) -> dict[str, tuple[int, int]]:
    """{output: (stride, frame_offset)} for the token outputs export measured advancing at a stride of the input."""
    return {
        e["name"]: (int(e["stride"]), int(e.get("frame_offset") or 0))
        for e in sidecar_outputs or []
        if isinstance(e, dict) and e.get("name") and e.get("stride")
    }


def parse_override(text: str) -> tuple[str, tuple[str, float | None]]:
    """'NAME=KIND' or 'NAME=dense:SCALE' (the --output-kind flag)."""
    name, sep, rest = text.partition("=")
    kind, _, scale = rest.partition(":")
    if not sep or not name or kind not in KINDS:
        raise UserError(f"--output-kind '{text}' is not NAME=KIND with KIND one of {', '.join(KINDS)} (dense may add :SCALE).")
    if scale and kind != "dense":
        raise UserError(f"--output-kind '{text}': a scale applies to dense outputs only.")
    try:
        value = float(Fraction(scale)) if scale else None
    except (ValueError, ZeroDivisionError):
        raise UserError(f"--output-kind '{text}': scale '{scale}' is not a number (e.g. 0.25 or 1/4).") from None
    if value is not None and value <= 0:
        raise UserError(f"--output-kind '{text}': the scale must be > 0.")
    return name, (kind, value)


def needs_probe(names: list[str], declared: dict[str, tuple[str | None, float | None]], boxes: dict[str, BoxSpec] | None = None) -> bool:
    named = {b.scores for b in (boxes or {}).values()}  # box_scores outputs need no declaration of their own
    return any(
        n not in named and (declared.get(n, (None, None))[0] is None or (declared[n][0] == "dense" and declared[n][1] is None))
        for n in names
    )


def _ask(name: str, shape: tuple[int, ...] | None, why: str, choices: str = "token|pooled|logits|dense") -> UserError:
    dims = f" (shape {list(shape)})" if shape is not None else ""
    return UserError(
        f"output '{name}'{dims} {why}; declare its kind in the config (`outputs: [{{name: {name}, kind: {choices}}}]`) "
        f"and re-export, or pass --output-kind {name}=KIND."
    )


def _dense_scale(name: str, layout: Layout, probes: list[Probe]) -> float:
    ratios = set()
    for probe in probes:
        shape = probe.shapes[name]
        for axis, dim in zip(layout.chunk_axes or (), (2, 3)):
            ratios.add(Fraction(shape[dim], probe.sizes[axis]))
        if not layout.chunk_axes and layout.fixed_hw:
            ratios.update({Fraction(shape[2], layout.fixed_hw[0]), Fraction(shape[3], layout.fixed_hw[1])})
    if len(ratios) != 1:
        shown = ", ".join(f"{r.numerator}/{r.denominator}" for r in sorted(ratios))
        raise UserError(
            f"output '{name}' does not scale consistently with the input image (output/input sizes {shown}); "
            f"declare it in the config (`outputs: [{{name: {name}, kind: dense, scale: S}}]`) and re-export, "
            f"or pass --output-kind {name}=dense:S."
        )
    return float(ratios.pop())


def resolve(
    names: list[str],
    declared: dict[str, tuple[str | None, float | None]],
    layout: Layout,
    probes: list[Probe],
    strict: bool = True,
    boxes: dict[str, BoxSpec] | None = None,
) -> dict[str, OutputKind]:
    """The kind of every output: declared ones as given (dense scales measured if missing), the rest
    inferred. strict=False (metrics only, no merging) gives kind None where run would raise. `boxes`: each
    declared boxes output's BoxSpec; the output it names for its scores is a box_scores output."""
    boxes = {n: b for n, b in (boxes or {}).items() if declared.get(n, (None, None))[0] == "boxes"}
    scores_of = {b.scores: n for n, b in boxes.items()}
    kinds: dict[str, OutputKind] = {}
    for name in names:
        if name in boxes or name in scores_of:
            kinds[name] = _box_kind(name, boxes.get(name), names)
            continue
        if not strict:
            try:
                kinds.update(resolve([name], declared, layout, probes, True))
            except UserError:
                kinds[name] = OutputKind(name, None, None, "unknown")
            continue
        kind, scale = declared.get(name, (None, None))
        shape = probes[0].shapes.get(name) if probes else None
        if kind is not None:
            kinds[name] = _declared_kind(name, kind, scale, shape, layout, probes)
        else:
            kinds[name] = _inferred_kind(name, shape, layout, probes)
    return kinds


def _box_kind(name: str, spec: BoxSpec | None, names: list[str]) -> OutputKind:
    """A declared boxes output (`spec`), or the box_scores output a boxes output names (no spec)."""
    if spec is not None and spec.scores not in names:
        raise UserError(
            f"boxes output '{name}' takes its scores from '{spec.scores}', which is not an output of the model "
            f"(outputs: {', '.join(names)}); fix its 'scores' key in the config and re-export."
        )
    return OutputKind(name, "boxes", boxes=spec) if spec else OutputKind(name, "box_scores")


def _declared_kind(
    name: str, kind: str, scale: float | None, shape: tuple[int, ...] | None, layout: Layout, probes: list[Probe]
) -> OutputKind:
    """An output's declared kind as given, a dense one's scale measured where it was not declared."""
    if kind == "boxes":
        raise UserError(
            f"output '{name}' is declared boxes without its format and scores; declare them in the config "
            f"(`outputs: [{{name: {name}, kind: boxes, format: cxcywh_norm, scores: LOGITS}}]`) and re-export."
        )
    if kind not in KINDS:
        raise UserError(f"output '{name}' has kind '{kind}' in its sidecar; use one of {', '.join(KINDS)}.")
    if kind != "dense":
        return OutputKind(name, kind)
    if scale is not None:
        return OutputKind(name, "dense", float(scale))
    if shape is None or len(shape) != 4 or layout.kind != "image":
        raise _ask(name, shape, "is declared dense without a scale and its scale cannot be measured")
    return OutputKind(name, "dense", _dense_scale(name, layout, probes), "declared (scale measured)")


def _inferred_kind(name: str, shape: tuple[int, ...] | None, layout: Layout, probes: list[Probe]) -> OutputKind:
    """An undeclared output's kind from its shapes in the probe runs, where they leave no doubt."""
    if shape is None:
        raise _ask(name, None, "has no declared kind")
    seq = layout.seq_axis
    if len(shape) == 3 and seq and all(p.shapes[name][1] == p.sizes[seq] for p in probes) and len({p.sizes[seq] for p in probes}) > 1:
        return OutputKind(name, "token", None, "inferred")
    if len(shape) == 4 and layout.kind == "image":
        return OutputKind(name, "dense", _dense_scale(name, layout, probes), "inferred")
    if len(shape) == 2:
        raise _ask(name, shape, "may be a pooled vector or class logits", "pooled|logits")
    raise _ask(name, shape, "has a shape whose meaning cannot be inferred")


def probe_sizes(layout: Layout, axes: dict[str, Any]) -> list[dict[str, int]]:
    """Two sizes of the chunk axes (multiples of 32 where the range allows, so strided models divide
    evenly), other axes at their opt and batch 1. One assignment when the chunk axes are fixed."""
    base = {name: (1 if name == layout.batch_axis else rng.opt) for name, rng in axes.items()}
    if not layout.chunk_axes:
        return [base]
    probes = []
    for want in (64, 128):
        sizes = dict(base)
        for axis in layout.chunk_axes:
            rng = axes[axis]
            sizes[axis] = min(rng.max, max(rng.min, want))
        if sizes not in probes:
            probes.append(sizes)
    if len(probes) == 1:  # a narrow range: any second size inside it
        sizes = dict(probes[0])
        for axis in layout.chunk_axes:
            rng = axes[axis]
            other = [v for v in (rng.min, rng.max, rng.opt) if v != sizes[axis]]
            if other:
                sizes[axis] = other[0]
        if sizes != probes[0]:
            probes.append(sizes)
    return probes


def merge_refusal(kind: OutputKind, image: bool, shape: tuple[int, ...] | None, positions: int | None, axis: str | None) -> str | None:
    """Why this output's chunks cannot be merged back into one output per input, as the sentence to show, or None.

    shape: the output's shape from a run at a probe size (batch first); positions: the chunked input axis' size in that
    run (sequence models). Token outputs merge window by window along their positions, which must be the input's;
    pooled and logits outputs merge one [batch, N] vector per window; image tiles merge dense maps and such vectors."""
    name = kind.name
    if kind.kind == "boxes" and shape is not None and (len(shape) != 3 or shape[-1] != 4):
        return (
            f"output '{name}' (shape {list(shape)}) is declared boxes, but slices merge boxes only as [batch, queries, 4]; "
            "run whole images (without --chunk), or fix its kind in the config."
        )
    if kind.kind in BOX_KINDS and not image:
        return f"output '{name}' is a {kind.kind} output, which merges over image slices only; run whole inputs (without --chunk)."
    if image and kind.kind == "token":
        return (
            f"output '{name}' is a token output of an image model, and token outputs cannot be merged across tiles "
            f"yet; run whole images (without --chunk), or declare a kind tiles merge (--output-kind {name}=KIND: "
            "dense for [N, C, H, W] maps, pooled or logits for [N, K] vectors)."
        )
    if kind.kind in ("pooled", "logits") and shape is not None and len(shape) != 2:
        what = "class logits" if kind.kind == "logits" else "a pooled vector"
        return (
            f"output '{name}' (shape {list(shape)}) is declared {kind.kind}, but chunks merge {what} only as one "
            f"[batch, N] vector per input and this one has rank {len(shape)}; run whole inputs (without --chunk), or "
            f"declare it token (--output-kind {name}=token) if it has one vector per input position."
        )
    if kind.kind == "dense" and image and shape is not None and len(shape) != 4:
        return (
            f"output '{name}' (shape {list(shape)}) is declared dense, but tiles merge dense outputs only as [N, C, H, W] "
            f"maps and this one has rank {len(shape)}; run whole images (without --chunk), or declare the kind it has "
            f"(--output-kind {name}=KIND)."
        )
    if (
        kind.kind == "token"
        and not image
        and shape is not None
        and positions is not None
        and (len(shape) < 2 or shape[1] != kind.frames(positions))
    ):
        got = shape[1] if len(shape) >= 2 else "no"
        if kind.stride is not None:
            return (
                f"output '{name}' has {got} frames for {positions} input positions along '{axis}', not the "
                f"{kind.frames(positions)} its recorded stride ({kind.stride}) gives; re-export the model."
            )
        return (
            f"output '{name}' has {got} positions for {positions} input positions along '{axis}' (it advances at a "
            f"stride of the input, and no stride is recorded for it), so windows over the input cannot be mapped to its "
            f"positions; declare it `kind: token` under 'outputs' in the config and re-export (export measures its "
            f"stride), or run without --chunk (whole inputs, up to axes.{axis}.max)."
        )
    return None
