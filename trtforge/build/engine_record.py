"""What build records about an engine and checks before one is used: its layers (from the inspector or the verbose log), its sidecar's fields, and whether it was built for this TensorRT and GPU."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from trtforge import __version__
from trtforge.backends.engine_layers import engine_layers, parse_layer_log, summarize_layers, tensor_dtype
from trtforge.backends.tensorrt import BuildOptions, BuildOutput, TrtModule
from trtforge.build.profiles import Profile
from trtforge.core.artifacts import (
    read_sidecar,
    sha256_bytes,
    sha256_file,
    write_json_atomic,
)
from trtforge.core.config import AxisRange, InputSpec
from trtforge.core.errors import UserError


def layer_info(
    mod: TrtModule, out: BuildOutput, profiles: list[Profile], output: Path, warn: Callable[[str], None]
) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """Sidecar fields describing the engine's layers, and the layers (None where there are none); writes
    ENGINE.layers.json. Never raises.

    Sources: the engine inspector (needs a GPU that can load the engine) and the builder's verbose
    layer log (always there; on 8.6 the only one with precisions for dynamic shapes). The layers kept
    are the inspector's when they name precisions, else the build log's."""
    inspector_layers, why_not, inspector_error = None, None, None
    try:
        inspector_layers, why_not = engine_layers(mod, out.engine, profiles[0])
    except Exception as exc:  # a broken inspector must never cost the engine (TensorRT 8.6's has failed on ResNet-50)
        inspector_error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        warn(f"the engine inspector failed ({inspector_error}); the engine is written, layer info comes from the build log.")
    try:
        log_layers = parse_layer_log(out.layer_log)
    except Exception as exc:  # a log format this parser does not know: record, do not fail
        log_layers = []
        warn(f"could not read the builder's layer log ({type(exc).__name__}: {exc}); layer precisions are unknown.")
    layers, source = _best_layers(inspector_layers, log_layers)
    if layers and source == "build log" and inspector_layers:
        add_tactic_names(layers, inspector_layers)
    inspector = {"error": inspector_error} if inspector_error else {"ok": inspector_layers is not None, "unavailable": why_not}
    fields: dict[str, Any] = {
        "inspector": inspector,
        "layer_info": None,
        "layer_summary": None,
        "layer_info_unavailable": None if layers else (inspector_error or why_not or "no layer information"),
    }
    if layers:
        layers_file = output.with_name(output.name + ".layers.json")
        # The raw report too (capped): its format differs between TensorRT versions and is undocumented.
        write_json_atomic(
            layers_file, {"source": source, "inspector": inspector, "layers": layers, "build_log": out.layer_log[:LAYER_LOG_KEEP]}
        )
        fields.update(layer_info=layers_file.name, layer_source=source, layer_summary=summarize_layers(layers))
    return fields, (layers or None)


LAYER_LOG_KEEP = 2_000_000  # characters of the builder's layer report kept in ENGINE.layers.json


def add_tactic_names(layers: list[dict[str, Any]], inspector_layers: list[dict[str, Any]]) -> None:
    """Kernel (tactic) names from the inspector onto the build log's layers of the same name: the 8.6
    inspector names tactics even where it says 'N/A due to dynamic shapes' for formats."""
    names = {str(l.get("Name")): l.get("TacticName") for l in inspector_layers if isinstance(l, dict) and l.get("TacticName")}
    for layer in layers:
        if not layer.get("TacticName") and str(layer.get("Name")) in names:
            layer["TacticName"] = names[str(layer.get("Name"))]


def _best_layers(
    inspector_layers: list[dict[str, Any]] | None, log_layers: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The inspector's layers when they state precisions, else the build log's, else whatever exists."""

    def knows_precision(layers: list[dict[str, Any]] | None) -> bool:
        return bool(layers) and any(tensor_dtype(t) for layer in layers for t in layer.get("Outputs") or [] if isinstance(t, dict))

    if knows_precision(inspector_layers):
        return inspector_layers, "inspector"
    if log_layers:
        return log_layers, "build log"
    return (inspector_layers, "inspector") if inspector_layers else (None, None)


def stderr_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def check_engine_compat(engine_path: Path, sidecar: dict[str, Any], identity: dict[str, Any]) -> None:
    """Refuse an engine made for another TensorRT or GPU with one sentence instead of TensorRT's raw error."""
    if sidecar.get("kind") != "engine":
        raise UserError(f"{engine_path}.json is not an engine sidecar; rebuild {engine_path.name} with trtforge build.")
    if sidecar.get("backend") != identity["backend"]:
        raise UserError(
            f"{engine_path.name} was built with {sidecar.get('backend')} but this runtime is {identity['backend']}; "
            "rebuild the engine here."
        )
    if sidecar.get("tensorrt_version") != identity["version"] and not sidecar.get("build_options", {}).get("version_compatible"):
        raise UserError(
            f"{engine_path.name} was built with TensorRT {sidecar.get('tensorrt_version')} but this runtime is "
            f"{identity['version']}; rebuild it here or build with --version-compatible."
        )
    built_cc = sidecar.get("compute_capability")
    if (
        built_cc
        and identity.get("compute_capability")
        and built_cc != identity["compute_capability"]
        and sidecar.get("build_options", {}).get("hardware_compatibility", "none") == "none"
    ):
        raise UserError(
            f"{engine_path.name} was built for compute capability {built_cc} ({sidecar.get('gpu')}) but this GPU is "
            f"{identity['compute_capability']} ({identity.get('gpu')}); rebuild it here or build with --hardware-compatibility."
        )


_ENGINE_SIDECAR_FIELDS = {
    "backend": str,
    "tensorrt_version": str,
    "precision": str,
    "engine_bytes": int,
    "build_seconds": (int, float),
    "profiles": list,
}


def engine_sidecar_problem(sidecar: dict[str, Any]) -> str | None:
    """What makes an engine sidecar unusable (a key every reader relies on missing or of the wrong type), or None."""
    for key, kind in _ENGINE_SIDECAR_FIELDS.items():
        if key not in sidecar:
            return f"lacks '{key}'"
        if not isinstance(sidecar[key], kind) or isinstance(sidecar[key], bool):
            return f"has a malformed '{key}'"
    if not sidecar["profiles"]:
        return "lists no optimization profiles"
    for i, profile in enumerate(sidecar["profiles"]):
        shapes = profile.get("shapes") if isinstance(profile, dict) else None
        if not isinstance(profile, dict) or not isinstance(profile.get("index"), int) or not isinstance(shapes, dict):
            return f"has a malformed profile {i} (needs 'index' and 'shapes')"
        for name, shape in shapes.items():
            if not (
                isinstance(shape, dict)
                and all(isinstance(shape.get(k), list) and all(isinstance(n, int) for n in shape[k]) for k in ("min", "opt", "max"))
            ):
                return f"has a malformed shape for input '{name}' in profile {i} (needs min, opt and max lists of sizes)"
    return None


def read_engine_sidecar(engine_path: Path, verify: bool = False) -> dict[str, Any]:
    """The engine's sidecar; with verify, also prove the engine file is the one the sidecar describes."""
    engine_path = Path(engine_path)
    if not engine_path.is_file():
        raise UserError(f"engine file {engine_path} does not exist; build it with trtforge build.")
    sidecar = read_sidecar(engine_path, required=True)
    assert sidecar is not None
    if sidecar.get("kind") != "engine":
        raise UserError(f"{engine_path}.json is not an engine sidecar; rebuild {engine_path.name} with trtforge build.")
    problem = engine_sidecar_problem(sidecar)
    if problem:
        raise UserError(f"{engine_path}.json {problem}; rebuild {engine_path.name} with trtforge build.")
    if verify:
        size = engine_path.stat().st_size
        if sidecar.get("engine_bytes") is not None and size != sidecar["engine_bytes"]:
            raise UserError(
                f"engine {engine_path} is truncated or altered ({size} bytes, its sidecar says {sidecar['engine_bytes']}); rebuild it."
            )
        if sidecar.get("engine_sha256") and sha256_file(engine_path) != sidecar["engine_sha256"]:
            raise UserError(f"engine {engine_path} does not match its sidecar's hash (corrupt or replaced); rebuild it.")
    return sidecar


def engine_sidecar(
    mod: TrtModule,
    identity: dict[str, Any],
    precision: str,
    profiles: list[Profile],
    phases: Any,
    out: BuildOutput,
    specs: list[InputSpec],
    axes: dict[str, AxisRange],
    onnx_path: Path,
    parent: dict[str, Any] | None,
    built_onnx: Path,
    source: Path,
    precision_report: dict[str, Any],
    fusion: dict[str, Any],
    elementwise: dict[str, dict[str, Any]],
    options: BuildOptions,
    start: float,
) -> dict[str, Any]:
    """The engine's sidecar as written with the engine; layer info and the engine check are added later."""
    return {
        "kind": "engine",
        "trtforge_version": __version__,
        "backend": mod.flavour,
        "tensorrt_version": mod.version,
        "strongly_typed": mod.strongly_typed,
        "gpu": identity["gpu"],
        "compute_capability": identity["compute_capability"] if mod.flavour == "tensorrt" else None,
        "target_compute_capabilities": out.compute_capabilities,
        "precision": precision,
        "tf32": bool(options.tf32) if precision == "fp32" else None,
        "profiles": [p.to_json() for p in profiles],
        "phases": phases,  # KV-cache engines: which profiles serve prefill and decode
        "io": out.io,
        "inputs": [s.model_dump() for s in specs],
        "axes": {k: v.model_dump() for k, v in axes.items()},
        "source_onnx": os.path.abspath(onnx_path),  # absolute: `run` finds it from any folder
        "source_onnx_sha256": sha256_file(onnx_path),
        "source_graph_hash": (parent or {}).get("graph_hash"),
        "reference_onnx": (parent or {}).get("reference_onnx") or os.path.abspath(onnx_path),
        "built_onnx": str(built_onnx),
        "calibration_cache_sha256": (parent or {}).get("cache_sha256"),
        "precision_report": precision_report,
        "attention_fusion": fusion,
        **{f"{key}_fusion": record for key, record in elementwise.items()},  # gelu_fusion, skip_layernorm_fusion
        "build_options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(options).items()},
        "timing_cache": {
            "path": str(options.timing_cache) if options.timing_cache else None,
            "loaded": out.timing_cache_loaded,
            "saved": out.timing_cache is not None,
        },
        "build_seconds": round(out.seconds, 3),
        "total_seconds": round(time.perf_counter() - start, 3),
        "engine_bytes": len(out.engine),
        "engine_sha256": sha256_bytes(out.engine),
        "onnx_bytes": source.stat().st_size,  # the staged copy of built_onnx, or the source itself
        "layer_info": None,
        "layer_info_unavailable": "not inspected yet",
        "layer_summary": None,
        "inspector": None,
        "notes": out.notes,
    }
