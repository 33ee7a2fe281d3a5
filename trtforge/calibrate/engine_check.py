"""Engine re-check: the held-out INT8 gate measured on the TensorRT engine, beside ONNX Runtime's figure.

ONNX Runtime executing a Q/DQ ONNX is not what users deploy. TensorRT fuses and reorders the graph, so
its rounding happens elsewhere (a BERT-base Q/DQ ONNX at cosine 0.9998 on ORT ran at 0.74 on the
engine; docs/performance.md#int8-qdq-placement). So where this machine can execute TensorRT engines,
`calibrate` (after writing the Q/DQ ONNX) and `build` (for an int8/best engine whose ONNX came from calibrate) run the same held-out samples
through the engine and apply the same gate. A gate that passes on ORT and fails on the engine is a
failed check (exit 1). Where no engine can execute, the check is recorded as skipped, with the
reason, in the output and in the sidecar.

The runtime pieces (is there a runtime, build, open a runner) are hooks, so tests inject a fake engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trtforge.backends.base import RunnerLifecycle

SKIPPED = "engine re-check: skipped (no GPU / no TensorRT runtime here)"
# TensorRT 8.6 wheels come without working cuBLAS/cuDNN here: their tactic sources stay off (trtexec's
# --tacticSources=-CUBLAS,-CUBLAS_LT,-CUDNN); TensorRT >= 10 dropped them anyway.
TACTICS_86 = "-CUBLAS,-CUBLAS_LT,-CUDNN"


@dataclass
class EngineHooks:
    available: Callable[[], tuple[bool, str]]  # (an engine can execute here, why not)
    build: Callable[[Path], tuple[Path, dict[str, Any]]]  # Q/DQ ONNX -> (engine, its sidecar)
    runner: Callable[[Path, dict[str, Any]], Any]  # engine + sidecar -> a Runner (input/output names, run)


def runtime_here() -> tuple[bool, str]:
    """(True, flavour) when a TensorRT flavour can execute engines on this machine, else (False, why)."""
    from trtforge.core.platform import support_here

    support = support_here()
    for flavour in ("tensorrt", "tensorrt_rtx"):
        ok, _why = support.get(flavour, (False, ""))
        if ok:
            return True, flavour
    return False, "; ".join(f"{k}: {why.removeprefix('no: ')}" for k, (_, why) in support.items())


def runtime_hooks() -> EngineHooks:
    """Hooks that open a runner on an engine that exists (build's re-checks); building one is calibrate's
    (calibrate/recheck.default_hooks)."""

    def build(onnx_path: Path) -> tuple[Path, dict[str, Any]]:
        raise RuntimeError(f"runtime hooks build no engines ({onnx_path})")

    def runner(engine: Path, sidecar: dict[str, Any]) -> Any:
        from trtforge.backends.tensorrt import load_trt
        from trtforge.backends.tensorrt_runtime import TrtRunner

        return TrtRunner(load_trt(sidecar.get("backend", "auto")), engine, sidecar)

    return EngineHooks(runtime_here, build, runner)


class NamedOutputs(RunnerLifecycle):
    """A runner whose output order is the reference's (the engine may list its outputs in another order;
    the sample cosine is taken on the first output)."""

    def __init__(self, runner: Any, output_names: list[str]):
        self.runner, self.input_names, self.output_names = runner, list(runner.input_names), list(output_names)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.runner.run({k: v for k, v in feeds.items() if k in self.input_names})
        return {name: np.asarray(out[name], dtype=np.float32) for name in self.output_names}

    def close(self) -> None:
        self.runner.close()


class RunOnce(RunnerLifecycle):
    """A runner that executes each feed (by identity) once and answers repeats from what it kept: the FP8 gate reads
    its real batches twice (cosine over every feed, top-1 over the real ones) and the engine need not run them twice."""

    def __init__(self, runner: Any):
        self.runner, self.input_names, self.output_names = runner, runner.input_names, runner.output_names
        self._outputs: dict[int, dict[str, np.ndarray]] = {}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if id(feeds) not in self._outputs:
            self._outputs[id(feeds)] = self.runner.run(feeds)
        return self._outputs[id(feeds)]

    def close(self) -> None:
        self._outputs.clear()
        self.runner.close()


def gate_options(int8_sidecar: dict[str, Any]) -> Any:
    """The calibrate options that carry the gate and held-out data recorded in a calibrate sidecar."""
    from trtforge.calibrate.options import CalibrateOptions

    held = int8_sidecar.get("held_out") or {}
    gate = int8_sidecar.get("gate") or {}
    return CalibrateOptions(
        data=Path(held["calibration_data"]) if held.get("calibration_data") else Path("."),
        eval_data=Path(held["data"]) if held.get("data") else None,
        max_eval_samples=held.get("max_samples"),
        min_cosine=gate.get("min_cosine", 0.99),
        min_int8_flops=gate.get("min_int8_flops", 0.0),
        min_top1_agreement=gate.get("min_top1_agreement"),
        min_pixel_agreement=gate.get("min_pixel_agreement"),
    )


def skipped(reason: str, message: str = SKIPPED) -> dict[str, Any]:
    return {"status": "skipped", "message": message, "reason": reason}


def recheck(
    int8_onnx: Path,
    int8_sidecar: dict[str, Any],
    engine: Path,
    engine_sidecar: dict[str, Any],
    runner: Any,
    batches: list[dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Held-out accuracy of `runner` (the engine) against the fp32 reference ONNX, gated like calibrate's
    ORT figure; returns {status: passed|failed, ort, engine, failures, rows} (rows: the side-by-side table)."""
    from trtforge.backends.onnxruntime import OrtRunner
    from trtforge.calibrate.evaluate import evaluate, reference_outputs
    from trtforge.calibrate.options import gate_failures
    from trtforge.core.onnxio import load_onnx

    options = gate_options(int8_sidecar)
    if batches is None:
        batches = held_out_batches(int8_onnx, int8_sidecar)
    reference = OrtRunner(load_onnx(Path(int8_sidecar["reference_onnx"])).SerializeToString())
    refs = reference_outputs(reference, batches)
    ort = int8_sidecar.get("accuracy") or {}
    kinds = ort.get("output_kinds") or {}
    accuracy = evaluate(NamedOutputs(runner, reference.output_names), batches, refs, kinds).to_json()
    accuracy["output_kinds"] = kinds
    fraction = int8_sidecar.get("int8_gemm_flops_fraction", 1.0)
    failures = [
        f"on the TensorRT engine {engine.name}: {f}"
        for f in gate_failures({"accuracy": accuracy, "int8_gemm_flops_fraction": max(fraction, options.min_int8_flops)}, options)
    ]
    if failures and ort.get("mean_cosine", 0.0) >= options.min_cosine:
        failures.append(
            f"ONNX Runtime passes on the same Q/DQ ONNX, so TensorRT executes part of it differently: "
            f"`trtforge bisect {int8_sidecar.get('reference_onnx')} --data {int8_sidecar.get('held_out', {}).get('data')}` "
            "names the Q/DQ groups"
        )
    return {
        "status": "failed" if failures else "passed",
        "engine_path": str(engine),
        "backend": f"{engine_sidecar.get('backend')} {engine_sidecar.get('tensorrt_version')}",
        "precision": engine_sidecar.get("precision"),
        "ort": _headline(ort),
        "engine": accuracy,
        "failures": failures,
        "rows": side_by_side(ort, accuracy, options),
    }


def held_out_batches(int8_onnx: Path, int8_sidecar: dict[str, Any]) -> list[dict[str, np.ndarray]]:
    """The held-out batches calibrate evaluated on (same data, same limit, same batching)."""
    from trtforge.calibrate import data as data_mod
    from trtforge.calibrate.data import limited_batches, max_sample_length, tokenizer_factory
    from trtforge.core.config import AxisRange, InputSpec
    from trtforge.core.errors import UserError

    held = int8_sidecar.get("held_out") or {}
    if not held.get("data"):
        raise UserError(f"{int8_onnx}.json names no held-out data (made by an older trtforge calibrate); re-run calibrate.")
    specs = [InputSpec(**s) for s in int8_sidecar["inputs"]]
    axes = {k: AxisRange(**v) for k, v in int8_sidecar["axes"].items()}
    _, samples = data_mod.load_samples(
        Path(held["data"]), specs, tokenizer_factory(int8_onnx), max_sample_length(specs, axes), held.get("max_samples")
    )
    return limited_batches(samples, held.get("max_samples"))


def _headline(acc: dict[str, Any]) -> dict[str, Any]:
    return {k: acc.get(k) for k in ("mean_cosine", "min_cosine", "samples", "per_output")}


def side_by_side(ort: dict[str, Any], engine: dict[str, Any], options: Any) -> list[list[Any]]:
    """[metric, ORT (Q/DQ ONNX), engine, gate] rows: the mean-pooled sample cosines, then each output's
    task metric (top-1 / pixel agreement) where it has one."""
    rows: list[list[Any]] = [
        ["mean cosine", ort.get("mean_cosine"), engine.get("mean_cosine"), f">= {options.min_cosine:g}"],
        ["min cosine", ort.get("min_cosine"), engine.get("min_cosine"), "-"],
    ]
    gates = {"top1_agreement": options.min_top1_agreement, "pixel_agreement": options.min_pixel_agreement}
    for name, metrics in (engine.get("per_output") or {}).items():
        for metric, threshold in gates.items():
            if metric in metrics:
                ort_value = ((ort.get("per_output") or {}).get(name) or {}).get(metric)
                rows.append(
                    [
                        f"{name} {metric.replace('_', ' ')}",
                        ort_value,
                        metrics[metric],
                        f">= {threshold:g}" if threshold is not None else "-",
                    ]
                )
    return rows


def after_build(engine: Path, engine_sidecar: dict[str, Any], hooks: EngineHooks | None = None) -> dict[str, Any] | None:
    """build's re-check for an int8/best engine whose ONNX came from calibrate; None for other engines."""
    from trtforge.core.artifacts import read_sidecar

    if engine_sidecar.get("precision") not in ("int8", "best"):
        return None
    source = Path(engine_sidecar["source_onnx"])
    int8_sidecar = read_sidecar(source, required=False) or {}
    if int8_sidecar.get("step") != "calibrate":
        return None
    held = (int8_sidecar.get("held_out") or {}).get("data")
    if not held or not Path(held).is_dir():
        why = (
            f"the held-out data {held} named in {source}.json is not here"
            if held
            else f"{source}.json names no held-out data (an older trtforge calibrate); re-run calibrate"
        )
        return skipped(why, "engine re-check: skipped (held-out data not found)")
    hooks = hooks or runtime_hooks()
    ok, why = hooks.available()
    if not ok:
        return skipped(why)
    return recheck(source, int8_sidecar, engine, engine_sidecar, hooks.runner(engine, engine_sidecar))


def after_fp8_build(
    engine: Path,
    engine_sidecar: dict[str, Any],
    feeds: list[dict[str, np.ndarray]],
    min_cosine: float,
    hooks: EngineHooks | None = None,
    min_top1: float | None = None,
    real_batches: int = 0,
) -> dict[str, Any]:
    """build's gate for --gemm-precision fp8: the engine against ONNX Runtime fp32 on the reference ONNX, over `feeds`;
    failed (exit 1) when the mean sample cosine is under min_cosine, or a logits output's top-1 agreement under
    min_top1 (None: reported, not gated; a cosine gate alone lets through a classifier whose top-1 FP8 flipped,
    docs/performance.md#fp8-defaults). Top-1 is judged
    on the first real_batches feeds, the real inputs: random ones give nearly flat logits, whose top-1 any rounding
    flips (without real inputs it is reported as on random feeds, and cannot be gated). FP8's error is not the fp16
    conversion's, and only the engine shows it: ORT cannot run the plugin."""
    from trtforge.backends.onnxruntime import OrtRunner
    from trtforge.calibrate.evaluate import evaluate, reference_outputs
    from trtforge.core.artifacts import declared_output_kinds
    from trtforge.core.onnxio import load_onnx
    from trtforge.verify.gates import screen

    hooks = hooks or runtime_hooks()
    ok, why = hooks.available()
    if not ok:
        return skipped(why, "FP8 engine check: skipped (no GPU / no TensorRT runtime here)")
    reference = OrtRunner(load_onnx(Path(engine_sidecar["reference_onnx"])).SerializeToString())
    refs = reference_outputs(reference, feeds)
    base = {
        "engine_path": str(engine),
        "backend": f"{engine_sidecar.get('backend')} {engine_sidecar.get('tensorrt_version')}",
        "precision": "fp16, GEMMs fp8",
        "ort": {},
        "title": "FP8 GEMMs: the TensorRT engine against ONNX Runtime fp32",
    }
    kinds = declared_output_kinds(Path(engine_sidecar["reference_onnx"]))
    try:
        runner = RunOnce(NamedOutputs(hooks.runner(engine, engine_sidecar), reference.output_names))
        accuracy = evaluate(runner, feeds, refs, kinds).to_json()  # the top-1 pass below reads the real batches' outputs again
        on_real = evaluate(runner, feeds[:real_batches], refs[:real_batches], kinds).to_json() if real_batches else None
    except Exception as exc:  # an engine that cannot execute has failed its gate; the engine file stays, marked failed
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {
            **base,
            "status": "failed",
            "engine": {},
            "rows": [],
            "failures": [
                f"the TensorRT engine {engine.name} did not execute ({why[:300]}); its plugins' errors are on "
                "stderr above; build with --gemm-precision fp16"
            ],
        }
    failures = [f"on the TensorRT engine {engine.name}, {f}" for f in screen(accuracy["per_output"], "build's FP8 gate", "the FP8 engine")]
    if not accuracy["mean_cosine"] >= min_cosine:  # NaN fails too
        failures.append(
            f"on the TensorRT engine {engine.name}, FP8 GEMMs reach mean cosine {accuracy['mean_cosine']:.4f} "
            f"against ONNX Runtime fp32, under the gate {min_cosine:g} (build.fp8_min_cosine); build with "
            "--gemm-precision fp16, or lower the gate if this error is acceptable"
        )
    top1_from = on_real or accuracy
    top1 = {name: m["top1_agreement"] for name, m in top1_from["per_output"].items() if "top1_agreement" in m}
    for metrics in accuracy["per_output"].values():  # per_output covers every feed; top-1 is its own, on top1_on's inputs
        metrics.pop("top1_agreement", None)
    accuracy["top1_agreement"], accuracy["top1_on"] = top1, "real inputs" if on_real else "random feeds"
    if min_top1 is not None and not on_real:
        failures.append(
            f"build.fp8_min_top1_agreement {min_top1:g} could not be evaluated: it is judged on real inputs, and "
            "this build had none; give --calib-data DIR (config key build.calib_data)"
        )
    elif min_top1 is not None and not top1:
        failures.append(
            f"build.fp8_min_top1_agreement {min_top1:g} could not be evaluated: no output of "
            f"{Path(engine_sidecar['reference_onnx']).name} is declared logits; declare its kind in the config's `outputs`"
        )
    for name, value in top1.items():
        if min_top1 is not None and on_real and not value >= min_top1:
            failures.append(
                f"on the TensorRT engine {engine.name}, FP8 GEMMs keep the top-1 of '{name}' on {value:.4f} of "
                f"the real inputs, under the gate {min_top1:g} (build.fp8_min_top1_agreement); build with "
                "--gemm-precision fp16, or lower the gate if this error is acceptable"
            )
    rows = [["mean cosine", None, accuracy["mean_cosine"], f">= {min_cosine:g}"], ["min cosine", None, accuracy["min_cosine"], "-"]]
    rows += [
        [f"top-1 agreement ({name}, {accuracy['top1_on']})", None, value, f">= {min_top1:g}" if min_top1 is not None else "-"]
        for name, value in top1.items()
    ]
    return {**base, "status": "failed" if failures else "passed", "engine": accuracy, "failures": failures, "rows": rows}


def render_lines(check: dict[str, Any] | None) -> list[str]:
    """Plain lines for the console: the skip message, or the verdict (the table is rendered by the CLI)."""
    if not check:
        return []
    if check["status"] == "skipped":
        return [f"{check['message']}: {check['reason']}"]
    verdict = "passed" if check["status"] == "passed" else "FAILED: " + "; ".join(check["failures"])
    if not check.get("engine_path"):
        return [f"engine re-check: {verdict}"]
    return [f"engine re-check on {Path(check['engine_path']).name} ({check['backend']}, {check['precision']}): {verdict}"]
