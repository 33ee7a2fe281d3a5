"""Loading plugin libraries into TensorRT: the ones a build names, the ones an engine's sidecar recorded (or the cached build of the same sources), with cuDNN and the library's companions preloaded so that dlopen finds them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtforge.backends.base import TrtModule
from trtforge.core.artifacts import sha256_file
from trtforge.core.errors import UserError


def init_plugins(mod: TrtModule) -> None:
    """Register libnvinfer_plugin's creators (idempotent); a TensorRT without the library registers none."""
    init = getattr(mod.trt, "init_libnvinfer_plugins", None)
    if init is not None:
        init(mod.trt.Logger(mod.trt.Logger.ERROR), "")


CUDNN_LIB_ENV = "TRTFORGE_CUDNN_LIB"  # a directory holding libcudnn*.so.9, for plugin libraries that link cuDNN
_LOADED_LIBRARIES: dict[str, Any] = {}


def cudnn_lib_dirs(env: dict[str, str], search_path: list[str], recorded: Path | None = None) -> list[Path]:
    """Where cuDNN 9's libraries may be, in order: $TRTFORGE_CUDNN_LIB, the directory the plugin library was built
    against (its cache sidecar's), then each nvidia/cudnn/lib under the search path (the nvidia-cudnn-cu12/cu13 wheels'
    layout). Pure, so the order is tested without any library."""
    dirs = [Path(env[CUDNN_LIB_ENV])] if env.get(CUDNN_LIB_ENV) else []
    dirs += [recorded] if recorded is not None else []
    dirs += [Path(p) / "nvidia" / "cudnn" / "lib" for p in search_path if p]
    return [d for d in dirs if (d / "libcudnn.so.9").is_file()]


def _preload_cudnn(recorded: Path | None = None) -> Path | None:
    """Load cuDNN 9's parts (graph first) by full path, globally, so a plugin library's `libcudnn.so.9` and cuDNN's
    own dlopen of its sub-libraries resolve to them; None when no directory holds them (the loader's own search
    path, e.g. LD_LIBRARY_PATH, may still find them)."""
    import ctypes
    import os
    import sys

    found = cudnn_lib_dirs(dict(os.environ), sys.path, recorded)
    if not found:
        return None
    order = ["libcudnn_graph.so.9", "libcudnn.so.9"]
    for lib in order + sorted(p.name for p in found[0].glob("libcudnn_*.so.9") if p.name not in order):
        path = str(found[0] / lib)
        if path not in _LOADED_LIBRARIES:
            _LOADED_LIBRARIES[path] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return found[0]


_PLUGIN_LIBRARIES: dict[str, dict[str, Any]] = {}  # every plugin library loaded in this process: {path, sha256}


def loaded_plugin_libraries() -> list[dict[str, Any]]:
    """What an engine built now may depend on: TensorRT's plugin registry is process-wide, so a library that an earlier
    build (or a pipeline step) of this process loaded serves this build's passes too, and its sidecar must name it."""
    return [dict(r) for r in _PLUGIN_LIBRARIES.values()]


def _preload_companions(library: Path) -> Path | None:
    """For a library `trtforge plugins build` made (its cache sidecar beside it): load the cuBLASLt and nvrtc it found
    in the wheels (opened later by name, by the GEMM plugin and by cuDNN) and return the cuDNN lib directory it was built
    against; None for any other library."""
    import ctypes

    from trtforge.build.plugins.discovery import SIDECAR_KIND

    try:
        record = json.loads(Path(str(library) + ".json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("kind") != SIDECAR_KIND:
        return None
    for lib in record.get("runtime_libraries") or []:
        if Path(lib).is_file() and lib not in _LOADED_LIBRARIES:
            try:
                _LOADED_LIBRARIES[lib] = ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            except OSError:  # the loader's own search may still find another copy; the plugin says so if not
                pass
    cudnn = (record.get("cudnn") or {}).get("lib")
    return Path(cudnn) if cudnn else None


def load_plugin_libraries(mod: TrtModule, paths: list[str] | None) -> list[dict[str, Any]]:
    """Load each plugin library (its creators register themselves with TensorRT's registry when loaded), once per
    process; [{path, sha256}] of these. A missing or unloadable file is the user's to fix: one sentence."""
    import ctypes

    records = []
    for raw in paths or []:
        path = Path(raw).expanduser().resolve()
        if not path.is_file():
            raise UserError(
                f"plugin library {raw} does not exist; build it with `trtforge plugins build` or fix "
                "--plugin-library (config key build.plugin_libraries)."
            )
        if mod.flavour != "tensorrt":
            raise UserError(f"plugin library {path.name} is a TensorRT plugin; {mod.label} does not load plugins (drop --plugin-library).")
        key = str(path)
        if key not in _LOADED_LIBRARIES:
            init_plugins(mod)  # TensorRT's own creators first; the library's register beside them
            built_with = _preload_companions(path)
            try:
                cudnn = _preload_cudnn(built_with) if built_with is not None else _preload_cudnn()
            except OSError as exc:
                raise UserError(
                    f"cannot load cuDNN for plugin library {path.name}: {exc}; point {CUDNN_LIB_ENV} at a "
                    "cuDNN 9 lib directory built for this CUDA."
                ) from exc
            try:
                _LOADED_LIBRARIES[key] = ctypes.CDLL(key, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                hint = (
                    f"cuDNN was taken from {cudnn}"
                    if cudnn
                    else f"no cuDNN 9 found: set {CUDNN_LIB_ENV} to the directory of libcudnn.so.9 or put it on LD_LIBRARY_PATH"
                )
                raise UserError(f"cannot load plugin library {path}: {exc} ({hint}).") from exc
            _PLUGIN_LIBRARIES[key] = {"path": key, "sha256": sha256_file(path)}
        records.append(dict(_PLUGIN_LIBRARIES[key]))
    return records


def load_engine_plugin_libraries(mod: TrtModule, sidecar: dict[str, Any], engine_path: Path | str) -> list[dict[str, Any]]:
    """Load the plugin libraries an engine's sidecar says its build loaded: they must be in the process before the
    engine is deserialized. A library that is gone is named with the engine, so the fix (rebuild, or --plugin-library)
    is clear."""
    paths = [_cached_in_place_of(mod, r["path"]) for r in sidecar.get("plugin_libraries") or []]
    for p in paths:
        if not Path(p).is_file():
            raise UserError(
                f"engine {Path(engine_path).name} holds plugin layers from {p}, which does not exist; "
                "give its new place with --plugin-library, run `trtforge plugins build`, or rebuild the engine."
            )
    return load_plugin_libraries(mod, paths)


def _cached_in_place_of(mod: TrtModule, recorded: str) -> str:
    """A recorded libtrtforge_plugins that is not on this machine (the engine was built elsewhere, or the cache moved)
    is replaced by this machine's cached library for the same TensorRT and GPU, built from the same sources."""
    from trtforge.build.plugins.discovery import LIBRARY_NAME

    if Path(recorded).is_file() or Path(recorded).name != LIBRARY_NAME or mod.flavour != "tensorrt":
        return recorded
    from trtforge.build.plugins.compile import gpu_sm, state_for

    state = state_for(mod.version, gpu_sm())
    return str(state.path) if state.status == "found" and state.path else recorded


def plugin_registered(mod: TrtModule, name: str, version: str) -> bool:
    if mod.flavour != "tensorrt":
        return False
    try:
        init_plugins(mod)
        return mod.trt.get_plugin_registry().get_plugin_creator(name, version, "") is not None
    except Exception:  # no plugin library, or a registry API this TensorRT does not have
        return False
