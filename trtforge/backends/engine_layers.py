"""What a built engine is made of: its layers (the inspector's JSON, or TensorRT 8.6's verbose build log), read into one summary of layer types, precisions and fusions."""

from __future__ import annotations

import json
import re
from typing import Any

from trtforge.backends.tensorrt import Logger, TrtModule, shorten
from trtforge.build.profiles import Profile
from trtforge.core import interrupts


class InspectorParseError(ValueError):
    """The engine inspector's JSON could not be read even after repair."""


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BAD_ESCAPE = re.compile(r'\\(?!["\\/bfnrtu])')


def parse_inspector_json(text: str) -> dict[str, Any]:
    """The inspector's JSON, read tolerantly. Pure.

    TensorRT 8.6 wrote raw control characters into layer names of a torchvision ResNet-50
    ("Invalid control character"): strict=False accepts them inside strings; the fallback blanks control
    characters anywhere (outside strings too) and doubles stray backslashes. Raises InspectorParseError with the reason."""

    try:
        data = json.loads(text, strict=False)
    except ValueError:
        repaired = _CONTROL.sub(" ", _BAD_ESCAPE.sub(r"\\\\", text))
        try:
            data = json.loads(repaired, strict=False)
        except ValueError as exc:
            raise InspectorParseError(f"unreadable engine inspector JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InspectorParseError(f"engine inspector JSON is a {type(data).__name__}, not an object")
    return data


def engine_layers(mod: TrtModule, engine_bytes: bytes, profile: Profile | None = None) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Layer information (DETAILED) from the engine inspector, or (None, why) where it cannot load.

    With dynamic shapes, formats and precisions are only known for concrete shapes: an execution
    context set to `profile`'s opt shapes is handed to the inspector. Raises InspectorParseError."""
    with interrupts.deferred():  # TensorRT swallows a KeyboardInterrupt raised in its logger
        return _engine_layers(mod, engine_bytes, profile)


def _engine_layers(mod: TrtModule, engine_bytes: bytes, profile: Profile | None) -> tuple[list[dict[str, Any]] | None, str | None]:
    trt = mod.trt
    logger = Logger(trt)
    try:
        runtime = trt.Runtime(logger.impl)
        engine = runtime.deserialize_cuda_engine(engine_bytes)
    except Exception as exc:
        return None, f"cannot deserialize here: {exc}"
    if engine is None:
        why = shorten(logger.errors()[0]) if logger.errors() else "deserialization returned None"
        return None, f"cannot deserialize here ({why})"
    inspector = engine.create_engine_inspector()
    context = None
    context_error = None
    if profile is not None:
        try:
            context = engine.create_execution_context()
            for name, (_lo, opt, _hi) in profile.shapes.items():
                context.set_input_shape(name, opt)
            inspector.execution_context = context
        except Exception as exc:  # formats then stay "N/A due to dynamic shapes"; say why
            context, context_error = None, f"{type(exc).__name__}: {exc}"
    info = parse_inspector_json(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    layers = info.get("Layers", [])
    return [layer if isinstance(layer, dict) else {"Name": layer} for layer in layers], context_error


# The builder's VERBOSE per-layer report: 8.6 prints "Engine Layer Information:" then one
# "Layer(TYPE): NAME, Tactic: T, in[Dtype(dims)], ... -> out[Dtype(dims)]" line per layer; TensorRT 10 and
# TensorRT-RTX print "Layers:" then "Name: N, LayerType: T, Inputs: [ { Name: x, ..., Datatype: Float, ... }], ...".
_LOG_PREFIX = re.compile(r"^(?:\[[^\]]*\]\s*)+(?=Layer\(|Name: )")  # "[V] [TRT] " and timestamps
_LOG86_LAYER = re.compile(r"^Layer\(([^)]*)\): (.*?), Tactic: (\S+?), (.*)$")
_LOG86_TENSOR = re.compile(r"(?:^|, )(.*?)\[([A-Za-z][A-Za-z0-9]*)\(([-\d,\s]*)\)\]")
# The same report as some TensorRT 8.6 GA and 9.x builds print it (the bracketed form above gives every
# layer empty I/O there): "name (Dtype[dims])".
_LOG86_TENSOR_PAREN = re.compile(r"(?:^|, )(.*?) \(([A-Za-z][A-Za-z0-9]*)\[([-\d,\s]*)\]\)")
_LOG10_LAYER = re.compile(r"^Name: (.*?), LayerType: (.*?), Inputs: \[(.*?)\], Constants: .*?Outputs: \[(.*?)\], TacticName: ([^,]*)")
_LOG10_TENSOR = re.compile(r"\{ Name: (.*?), Dimensions: \[([-\d,]*)\].*?Datatype: (\w+)")


def parse_layer_log(text: str) -> list[dict[str, Any]]:
    """Per-layer types and I/O datatypes from the builder's verbose layer report (either format). Pure.

    The records use the inspector's JSON keys (Name, LayerType, Inputs, Outputs with Datatype) so one
    summary serves both; dims of dynamic axes are negative."""
    layers = []
    for line in (raw.strip() for raw in text.splitlines()):
        line = _LOG_PREFIX.sub("", line)
        m86 = _LOG86_LAYER.match(line)
        if m86:
            ins, _, outs = m86.group(4).partition(" -> ")
            layers.append(
                {
                    "Name": m86.group(2),
                    "LayerType": m86.group(1),
                    "TacticValue": m86.group(3),
                    "Inputs": _tensors86(ins),
                    "Outputs": _tensors86(outs),
                }
            )
            continue
        m10 = _LOG10_LAYER.match(line)
        if m10:
            layers.append(
                {
                    "Name": m10.group(1),
                    "LayerType": m10.group(2),
                    "TacticName": m10.group(5),
                    "Inputs": _tensors10(m10.group(3)),
                    "Outputs": _tensors10(m10.group(4)),
                }
            )
    return layers


def _tensors86(part: str) -> list[dict[str, Any]]:
    found = _LOG86_TENSOR.findall(part) or _LOG86_TENSOR_PAREN.findall(part)
    return [
        {"Name": name.strip(), "Datatype": dtype, "Dimensions": [int(d) for d in dims.split(",") if d.strip()]}
        for name, dtype, dims in found
    ]


def _tensors10(part: str) -> list[dict[str, Any]]:
    return [
        {"Name": name, "Datatype": dtype, "Dimensions": [int(d) for d in dims.split(",") if d]}
        for name, dims, dtype in _LOG10_TENSOR.findall(part)
    ]


_DTYPE_WORDS = (
    ("Int8", ("int8",)),
    ("BFloat16", ("bfloat16", "bf16")),
    ("Half", ("half", "fp16")),
    ("FP8", ("fp8",)),
    ("Int32", ("int32",)),
    ("Int64", ("int64",)),
    ("Bool", ("bool",)),
    ("Float", ("float", "fp32")),
)


def tensor_dtype(tensor: dict[str, Any]) -> str | None:
    """'Int8', 'Half', 'Float', ... from a build-log record or the inspector's 'Format/Datatype' text;
    None where unknown (the 8.6 inspector says 'N/A due to dynamic shapes')."""
    text = str(tensor.get("Datatype") or tensor.get("Format/Datatype") or "").lower()
    return next((name for name, words in _DTYPE_WORDS if any(w in text for w in words)), None)


_INT8_KERNEL = re.compile(r"(?:^|[_\W])(?:i8|int8|imma)(?:[_\W\d]|$)|i8i8|int8x4|i8816|i8832", re.IGNORECASE)


def int8_kernel(name: str) -> bool:
    """A kernel/tactic name that says int8 math: 'i8i8', 'imma', 'int8', '_s8_'... (Ampere/Hopper xmma
    names such as sm90_xmma_gemm_i8i8_i8i32_f32_...). Pure."""
    return bool(_INT8_KERNEL.search(name or ""))


def runs_int8(layer: dict[str, Any]) -> bool:
    """A compute layer that consumes int8 tensors or runs an int8 kernel (reformats that only
    quantize/dequantize do not count)."""
    if "reformat" in str(layer.get("LayerType", "")).lower():
        return False
    if int8_kernel(str(layer.get("TacticName") or "")):
        return True
    return any(tensor_dtype(t) == "Int8" for t in layer.get("Inputs") or [] if isinstance(t, dict))


def opaque(layer: dict[str, Any]) -> bool:
    """A Myelin 'ForeignNode' that names no kernel: TensorRT 8.6 compiles whole transformer blocks into
    one such layer and neither its inspector nor its build log lists the kernels inside, so whether the
    GEMMs in it run int8 cannot be read off the engine (only a kernel profile, e.g. Nsight Compute, shows it)."""
    mye = "myelin" in str(layer.get("LayerType", "")).lower() or "ForeignNode" in str(layer.get("Name", ""))
    return mye and not layer.get("TacticName")


def summarize_layers(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of layers by type and by output precision, and the layers that run INT8 (pure)."""
    by_type: dict[str, int] = {}
    by_precision: dict[str, int] = {}
    for layer in layers:
        kind = str(layer.get("LayerType", "Unknown"))
        by_type[kind] = by_type.get(kind, 0) + 1
        outputs = [t for t in layer.get("Outputs") or [] if isinstance(t, dict)]
        precision = (tensor_dtype(outputs[0]) or "unknown") if outputs else "unknown"
        by_precision[precision] = by_precision.get(precision, 0) + 1
    int8 = [str(layer.get("Name")) for layer in layers if runs_int8(layer)]
    hidden = [str(layer.get("Name")) for layer in layers if opaque(layer)]
    boundary = sorted(
        {
            tensor_dtype(t) or "unknown"
            for layer in layers
            if opaque(layer)
            for t in (layer.get("Inputs") or []) + (layer.get("Outputs") or [])
            if isinstance(t, dict)
        }
    )
    return {
        "by_type": by_type,
        "by_precision": by_precision,
        "int8_layers": int8,
        "opaque_layers": hidden,
        "opaque_boundary_types": boundary,
        "int8_verdict": int8_verdict(len(layers), int8, hidden, boundary),
    }


def int8_verdict(total: int, int8: list[str], hidden: list[str], boundary: list[str]) -> str:
    """One sentence on what the engine shows about INT8, saying plainly what it cannot show. Pure."""
    shown = f"{len(int8)} of {total} layers run INT8 (int8 inputs or an int8 kernel)"
    if not hidden:
        return shown
    types = f" (tensor types at their boundaries: {', '.join(boundary)})" if boundary else ""
    return (
        f"{shown}; {len(hidden)} Myelin layer(s) are opaque{types}: this TensorRT lists no kernels inside them, "
        "so whether their GEMMs run INT8 cannot be told from the engine; a kernel profile shows it "
        "(benchmarks/gpu/int8_probe.py kernels on an Nsight Compute CSV)"
    )


def runtime_identity(mod: TrtModule) -> dict[str, Any]:
    from trtforge.core.platform import gpu_info

    gpu = gpu_info()
    return {
        "backend": mod.flavour,
        "version": mod.version,
        "gpu": gpu["name"] if gpu else None,
        "compute_capability": gpu["compute_capability"] if gpu else None,
    }
