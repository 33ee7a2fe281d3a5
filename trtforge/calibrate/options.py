"""calibrate's options and results, and the accuracy gates a calibration records and is held to."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtforge.calibrate.evaluate import Accuracy
from trtforge.core.errors import UserError
from trtforge.verify.gates import screen
from trtforge.verify.metrics import worst_of

FLOAT_FLOPS_REASONS = {
    "attention_bmm": "attention's activation x activation MatMuls (--quantize-attention quantizes them)",
    "gemv": "matrix-vector products",
    "conv_channels": "convolutions with too few channels for int8 kernels",
    "output_layer": "the output layer",
    "fallback": "layers the accuracy fallback kept float",
    "other": "GEMMs with an input that cannot be quantized",
}


METHODS = ("entropy", "percentile", "minmax")


@dataclass
class CalibrateOptions:
    data: Path
    method: str = "entropy"
    percentile: float = 99.99
    num_bins: int = 2048
    batch_size: int = 16
    max_samples: int | None = None
    smooth: float | None = None
    eval_data: Path | None = None
    max_eval_samples: int | None = None
    min_cosine: float = 0.99
    min_top1_agreement: float | None = None  # task gates on held-out data (None: reported, not gated)
    min_pixel_agreement: float | None = None
    min_int8_flops: float = 0.8
    fallback: bool = True
    sensitivity_samples: int = 48
    sensitivity_top: int = 4  # layers (by local error) that get an end-to-end leave-one-out check
    quantize_attention: bool = False  # quantize attention BMMs (QK^T, softmax.V); off: TensorRT 8.6 breaks them
    strict_cache: bool = False
    from_cache: Path | None = None
    output: Path | None = None  # the int8 ONNX; the cache goes beside it
    engine_check: bool = True  # re-check the gate on a TensorRT engine where one can execute (engine_check.py)
    engine_check_off: str = "--no-engine-check"  # why, when engine_check is off
    ray: str | None = None  # collect activations on Ray actors at this address ('auto': local); same cache
    ray_actors: int | None = None


@dataclass
class MethodResult:
    method: str
    amax: dict[str, float]
    float_nodes: list[str]
    accuracy: Accuracy | None
    int8_flops_fraction: float
    sensitivity: dict[str, float] = field(default_factory=dict)
    layer_errors: dict[str, float] = field(default_factory=dict)


@dataclass
class CalibrateResult:
    int8_path: Path
    cache_path: Path
    reused: bool
    reason: str
    result: MethodResult
    sidecar: dict[str, Any]
    comparison: list[MethodResult] = field(default_factory=list)
    seconds: float = 0.0


TASK_GATES = (
    ("min_top1_agreement", "top1_agreement", "logits", "top-1 agreement"),
    ("min_pixel_agreement", "pixel_agreement", "dense", "per-pixel argmax agreement"),
)


def gate_record(options: CalibrateOptions) -> dict[str, Any]:
    """The sidecar's gate and what it was measured on (held_out), so that `build` can re-check it on the engine."""
    return {
        "gate": {
            "min_cosine": options.min_cosine,
            "min_int8_flops": options.min_int8_flops,
            "min_top1_agreement": options.min_top1_agreement,
            "min_pixel_agreement": options.min_pixel_agreement,
        },
        "held_out": {
            "data": str(options.eval_data or options.data),
            "max_samples": options.max_eval_samples,
            "calibration_data": str(options.data),
        },
    }


def gate_failures(sidecar: dict[str, Any], options: CalibrateOptions) -> list[str]:
    """Why the INT8 model misses its gates (empty when it passes). A task gate (top-1 / pixel
    agreement) that no output can be judged by fails too, naming the outputs and their kinds."""
    acc = sidecar.get("accuracy") or {}
    where = options.eval_data or options.data
    failures = [f"{f} on {where}" for f in screen(acc.get("per_output") or {}, f"calibrate's held-out check on {where}", "the INT8 model")]
    if acc and not acc["mean_cosine"] >= options.min_cosine:
        failures.append(
            f"INT8 mean cosine {acc['mean_cosine']:.4f} is below the gate {options.min_cosine} on {where}; "
            "try --smooth, another --method, or a lower --min-int8-flops to allow more float layers"
        )
    for key, metric, kind, label in TASK_GATES:
        threshold = getattr(options, key)
        if threshold is None:
            continue
        values = {n: m[metric] for n, m in (acc.get("per_output") or {}).items() if metric in m}
        if not values:
            kinds = ", ".join(f"{n} ({k or 'kind unknown'})" for n, k in (acc.get("output_kinds") or {}).items())
            failures.append(
                f"{key} {threshold:g} could not be evaluated: no {kind} output has {label} (outputs: {kinds}); "
                f"declare the output's kind in the config's `outputs`"
            )
            continue
        value = worst_of(list(values.values()), "min")
        name = next(n for n, v in values.items() if v == value or value != value and v != v)
        if not value >= threshold:
            failures.append(f"INT8 {label} of '{name}' is {value:.4f}, below the gate {threshold:g} ({key}) on {where}")
    check = sidecar.get("engine_check") or {}
    if check.get("status") == "failed":
        failures += check["failures"]
    if sidecar["int8_gemm_flops_fraction"] < options.min_int8_flops:
        rest = "; ".join(
            f"{FLOAT_FLOPS_REASONS.get(why, why)} {share:.1%}"
            for why, share in (sidecar.get("float_gemm_flops") or {}).items()
            if share >= 0.001
        )
        failures.append(
            f"only {sidecar['int8_gemm_flops_fraction']:.1%} of GEMM FLOPs run in INT8, below the floor "
            f"{options.min_int8_flops:.0%} (min_int8_flops)"
            + (f"; float: {rest}" if rest else "")
            + "; lower --min-int8-flops (calibrate.min_int8_flops) where this model's float share is expected"
        )
    return failures


def options_from_section(section: Any, **overrides: Any) -> CalibrateOptions:
    """CalibrateOptions from a config's `calibrate` section; keyword overrides win when not None."""
    values = dict(
        data=Path(section.data) if section.data else None,
        method=section.method,
        percentile=section.percentile,
        num_bins=section.num_bins,
        batch_size=section.batch_size,
        max_samples=section.max_samples,
        smooth=section.smooth,
        eval_data=Path(section.eval_data) if section.eval_data else None,
        min_cosine=section.min_cosine,
        min_int8_flops=section.min_int8_flops,
        min_top1_agreement=section.min_top1_agreement,
        min_pixel_agreement=section.min_pixel_agreement,
    )
    values.update({k: v for k, v in overrides.items() if v is not None})
    if values["data"] is None:
        raise UserError("no calibration data given; pass --data FOLDER or set calibrate.data in the config.")
    return CalibrateOptions(**values)


def paths_for(onnx_path: Path, output: Path | None) -> tuple[Path, Path]:
    """(NAME.int8.onnx, NAME.calib.cache) for a (clean) ONNX, or beside the --output the user chose."""
    stem = onnx_path.name.removesuffix(".onnx").removesuffix(".clean")
    int8 = output or onnx_path.with_name(f"{stem}.int8.onnx")
    cache = int8.with_name(int8.name.removesuffix(".onnx").removesuffix(".int8") + ".calib.cache")
    return int8, cache
