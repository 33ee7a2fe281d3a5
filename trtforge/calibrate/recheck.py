"""calibrate's engine re-check: build an engine from the Q/DQ ONNX just written, then check it (engine_check.recheck).
Apart from engine_check because building needs the build step, which itself re-checks through engine_check."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from trtforge.calibrate.engine_check import TACTICS_86, EngineHooks, recheck, runtime_here, runtime_hooks, skipped


def default_hooks(precision: str = "best") -> EngineHooks:
    def build(onnx_path: Path) -> tuple[Path, dict[str, Any]]:
        from trtforge.backends.tensorrt import BuildOptions, load_trt
        from trtforge.build.step import build as build_engine
        from trtforge.build.step import default_engine_path

        _, flavour = runtime_here()
        mod = load_trt(flavour)
        options = BuildOptions(tactic_sources=TACTICS_86 if mod.flavour == "tensorrt" and mod.major < 10 else None)
        result = build_engine(
            onnx_path, default_engine_path(onnx_path, precision), precision, backend=flavour, options=options, engine_check=False
        )
        return result.engine_path, result.sidecar

    return EngineHooks(runtime_here, build, runtime_hooks().runner)


def after_calibrate(
    int8_onnx: Path,
    int8_sidecar: dict[str, Any],
    hooks: EngineHooks | None,
    batches: list[dict[str, np.ndarray]] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """calibrate's re-check: build an engine from the Q/DQ ONNX just written, then `recheck`."""
    hooks = hooks or default_hooks()
    ok, why = hooks.available()
    if not ok:
        return skipped(why)
    progress("engine re-check: building a TensorRT engine from the Q/DQ ONNX")
    from trtforge.core.errors import UserError

    try:
        engine, engine_sidecar = hooks.build(int8_onnx)
    except UserError as exc:  # an INT8 model TensorRT cannot build fails the check; calibrate's files stay
        return {
            "status": "failed",
            "engine_path": None,
            "backend": why,
            "precision": None,
            "rows": [],
            "failures": [f"the engine re-check could not build an engine from {int8_onnx.name}: {exc}"],
        }
    return recheck(int8_onnx, int8_sidecar, engine, engine_sidecar, hooks.runner(engine, engine_sidecar), batches)
