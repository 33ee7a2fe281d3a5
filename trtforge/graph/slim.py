"""onnxslim inside `trtforge clean`, and which parser rewrites a build target needs.

onnxslim folds constants and shape subgraphs (with ONNX Runtime's symbolic shape inference) and removes
redundant Reshape/Transpose/Slice/Concat chains and common subexpressions: on transformer exports it leaves a
third to a half of the nodes that constant folding alone leaves. Its result is still proven by `clean`'s parity
check. When it fails on a graph, `slim_model` says why and `clean` folds with onnx-graphsurgeon instead.
"""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from typing import Any, get_args

import numpy as np
import onnx

from trtforge.core.config import CleanSection
from trtforge.core.errors import UserError

# Parser targets of `clean --parser` (config key clean.parser), and the rewrites each one's ONNX parser needs.
PARSERS: tuple[str, ...] = get_args(CleanSection.model_fields["parser"].annotation)
PARSER_REWRITES: dict[str, tuple[str, ...]] = {
    # TensorRT 8.6's parser ignores Shape's start/end and then fails on the Slice after it.
    "trt8": ("shape_start_end",),
    # TensorRT-RTX parses the graph as the exporters write it.
    "rtx": (),
    "none": (),
}


FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)

# onnxslim's weight tying makes equal initializers (a fresh model's zero biases, unit LayerNorm scales) one shared tensor:
# the build's fusion passes fold a bias or scale into its plugin only where no other node reads it.
SKIPPED_OPTIMIZATIONS = ("weight_tying",)


def resolve_parser(parser: str, backend: str = "auto") -> str:
    """The parser target `auto` stands for: the TensorRT that `build --backend BACKEND` would load here.
    TensorRT-RTX needs no rewrites; TensorRT (8.6, or a release not proven to parse the raw graph) and a
    machine without TensorRT (the ONNX may be built elsewhere) get the TensorRT 8.6 rewrites."""
    if parser not in PARSERS:
        raise UserError(f"--parser must be one of {', '.join(PARSERS)}, got '{parser}'.")
    if parser != "auto":
        return parser
    from trtforge.backends.tensorrt import load_trt

    try:
        flavour = load_trt(backend).flavour
    except UserError:
        return "trt8"
    return "rtx" if flavour == "tensorrt_rtx" else "trt8"


def needs_rewrite(parser: str, rewrite: str) -> bool:
    """Whether the (resolved) parser target needs this rewrite."""
    return rewrite in PARSER_REWRITES[parser]


def onnxslim_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("onnxslim")
    except Exception:
        return None


def slim_model(model: onnx.ModelProto, size_threshold_bytes: int) -> tuple[onnx.ModelProto | None, dict[str, Any]]:
    """onnxslim's optimisation of a copy of `model` (constants up to `size_threshold_bytes` folded), with graph
    inputs it dropped as unused put back, so the model keeps the interface its sidecar describes. Returns
    (model, record of what onnxslim did), or (None, record with a one-line `note`) when onnxslim is missing or fails."""
    record: dict[str, Any] = {"tool": "onnxslim", "version": onnxslim_version()}
    try:
        import onnxslim
    except ImportError:
        record["note"] = "onnxslim is not installed (pip install onnxslim); folded constants with onnx-graphsurgeon instead"
        return None, record
    source = onnx.ModelProto()
    source.CopyFrom(model)
    shielded = shield_parameters(source)
    chatter = io.StringIO()
    try:
        # onnxslim logs and prints; stdout stays clean for `--json`.
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            slimmed = onnxslim.slim(
                source, size_threshold=max(1, int(size_threshold_bytes)), skip_optimizations=list(SKIPPED_OPTIMIZATIONS)
            )
        if slimmed is None:
            raise RuntimeError("it returned no model")
    except Exception as exc:
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        record["note"] = f"onnxslim failed ({reason}); folded constants with onnx-graphsurgeon instead"
        return None, record
    unshield_parameters(slimmed, shielded)
    restore_inputs(slimmed, model)
    before, after = Counter(n.op_type for n in model.graph.node), Counter(n.op_type for n in slimmed.graph.node)
    record.update(
        nodes_before=len(model.graph.node),
        nodes_after=len(slimmed.graph.node),
        ops_removed=dict(sorted((before - after).items())),
        ops_added=dict(sorted((after - before).items())),
    )
    return slimmed, record


def restore_inputs(slimmed: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Put back, in the original order, graph inputs that onnxslim removed because nothing reads them."""
    initializers = {t.name for t in original.graph.initializer}
    kept = {i.name: i for i in slimmed.graph.input}
    inputs = []
    for value in original.graph.input:
        if value.name in kept:
            inputs.append(kept.pop(value.name))
        elif value.name not in initializers:
            inputs.append(value)
    inputs.extend(kept.values())
    del slimmed.graph.input[:]
    slimmed.graph.input.extend(inputs)


# What onnxslim would delete because of a weight's current value: x + zeros, x - zeros, x * ones, x / ones.
IDENTITY_VALUES = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0}


def shield_parameters(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Move float weight vectors that onnxslim would delete for their value (a fresh model's zero biases and unit
    scales) from the initializers to graph inputs, where onnxslim sees a runtime value. A cleaned model then keeps the
    structure of the trained one (benchmarks on random weights measure the real graph), and the build's fusion passes
    still find each bias to fold. Returns the moved tensors by name."""
    from onnx import numpy_helper

    initializers = {t.name: t for t in model.graph.initializer}
    shielded: dict[str, onnx.TensorProto] = {}
    for node in model.graph.node:
        identity = IDENTITY_VALUES.get(node.op_type)
        if identity is None or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        weights = [name for name in node.input if name in initializers]
        if len(weights) != 1 or weights[0] in shielded:
            continue
        tensor = initializers[weights[0]]
        if tensor.data_type not in FLOAT_TYPES or len(tensor.dims) == 0 or int(np.prod(tensor.dims)) < 2:
            continue
        if np.all(numpy_helper.to_array(tensor) == identity):
            shielded[tensor.name] = tensor
    if shielded:
        kept = [t for t in model.graph.initializer if t.name not in shielded]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
        model.graph.input.extend(onnx.helper.make_tensor_value_info(name, t.data_type, list(t.dims)) for name, t in shielded.items())
    return shielded


def unshield_parameters(model: onnx.ModelProto, shielded: dict[str, onnx.TensorProto]) -> None:
    """Undo shield_parameters on onnxslim's result: the moved inputs become initializers again (those still read)."""
    if not shielded:
        return
    read = {name for node in model.graph.node for name in node.input}
    inputs = [i for i in model.graph.input if i.name not in shielded]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(t for name, t in shielded.items() if name in read)
