"""`trtforge plugins build|status|path`: compile trtforge/native/ into the per-user cache, and find the cached library
that `build` and `run` load by default. What to search and what is missing is decided in trtforge.plugin_discovery;
this module adds what cannot be pure: the installed TensorRT, the GPU, the driver, and the compiler run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trtforge.build.plugins.discovery import (
    CACHE_ENV,
    LIBRARY_NAME,
    SIDECAR_KIND,
    SIDECAR_SCHEMA,
    CacheState,
    Discovery,
    Inputs,
    build_environment,
    cache_key,
    cache_root,
    cache_state,
    chosen_libraries,
    discover,
    library_path,
    normalize_tensorrt_version,
    parse_arch,
    plugins_dir,
    sources_digest,
)
from trtforge.core.artifacts import ensure_writable_dir, publish, sha256_file, sidecar_path, write_sidecar, write_text_atomic
from trtforge.core.errors import UserError

NATIVE_DIR = Path(__file__).resolve().parents[2] / "native"
FLAG_KEYS = ("cuda_home", "tensorrt_include", "cudnn_include", "cudnn_lib", "cudnn_frontend_include", "cublas_include")


class MissingRequirements(UserError):
    """The compile cannot start: `sentences` says, one sentence each, what is missing and how to provide it."""

    def __init__(self, sentences: list[str]):
        self.sentences = sentences
        super().__init__(
            sentences[0]
            if len(sentences) == 1
            else f"{len(sentences)} things the plugin library needs are missing (listed above); provide them and "
            "run `trtforge plugins build` again."
        )


def runtime_tensorrt_version() -> str | None:
    """The full TensorRT's version (the one that will load the library), or None when only a stub or none is there."""
    try:
        import tensorrt  # noqa: PLC0415
    except Exception:
        return None
    return str(tensorrt.__version__) if hasattr(tensorrt, "Builder") else None


def gpu_sm() -> int | None:
    """GPU 0's compute capability as an integer (9.0 -> 90), or None without a GPU."""
    from trtforge.core.platform import gpu_info

    gpu = gpu_info()
    return parse_arch(gpu["compute_capability"]) if gpu else None


def driver_cuda_version() -> str | None:
    """The newest CUDA the installed driver runs ('13.0'), or None when cuda-python cannot say."""
    try:
        from cuda.bindings import runtime as cudart
    except Exception:
        return None
    try:
        err, version = cudart.cudaDriverGetVersion()
        return f"{version // 1000}.{version % 1000 // 10}" if int(err) == 0 and version else None
    except Exception:
        return None


def cache_dir() -> Path:
    return cache_root(dict(os.environ), Path.home())


def _read_record(path: Path) -> dict | None:
    try:
        import json

        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def state_for(tensorrt_version: str | None, sm: int | None) -> CacheState:
    """The cache's state for this TensorRT and GPU; 'unavailable' (with why) when either is unknown."""
    if tensorrt_version is None:
        return CacheState("unavailable", None, "the plugin library needs TensorRT 8.6 (the full tensorrt package), which is not installed")
    if sm is None:
        return CacheState("unavailable", None, "no GPU found: the cached plugin library is chosen by the GPU's architecture")
    if not NATIVE_DIR.is_dir():
        return CacheState(
            "unavailable", None, f"this installation lacks the plugin sources ({NATIVE_DIR}), which a cached library must match"
        )
    return cache_state(cache_dir(), tensorrt_version, sm, sources_digest(NATIVE_DIR), driver_cuda_version(), _read_record, sha256_file)


def state_here() -> CacheState:
    return state_for(runtime_tensorrt_version(), gpu_sm())


def libraries_for_build(flavour: str, version: str, given: list[str], warn: Callable[[str], None]) -> list[str]:
    """The plugin libraries a build loads: those given, none for 'none', else the cached library that matches this
    TensorRT and GPU (only the full TensorRT loads plugins). A stale cache is said once and not loaded."""
    if given or flavour != "tensorrt":
        return chosen_libraries(given, None)[0]
    state = state_for(version, gpu_sm())
    if state.status == "stale":
        warn(f"plugin library not loaded: {state.detail}.")
    return chosen_libraries([], state)[0]


def native_sources() -> Path:
    """trtforge/native/ of this installation, or the one sentence saying it is absent."""
    if not (NATIVE_DIR / "build.sh").is_file() or not any(NATIVE_DIR.glob("*.cpp")):
        raise UserError(
            f"the plugin sources are not in this installation ({NATIVE_DIR} lacks build.sh or its .cpp files); "
            "install a trtforge wheel that ships trtforge/native/, or run from a checkout."
        )
    return NATIVE_DIR


def discovery_here(flags: dict[str, str | None], packages_dirs: list[str], runtime: str | None) -> Discovery:
    site = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    inputs = Inputs(flags=flags, env=dict(os.environ), search_path=[*packages_dirs, *site], which=shutil.which)
    return discover(inputs, runtime)


@dataclass
class BuildReport:
    path: Path
    key: str
    reused: bool
    seconds: float
    record: dict[str, Any]


def _arch(arch: str | None, missing: list[str]) -> int | None:
    if arch:
        try:
            return parse_arch(arch)
        except ValueError:
            raise UserError(f"--arch '{arch}' is not a compute capability; use e.g. sm_90 or 9.0.") from None
    sm = gpu_sm()
    if sm is None:
        missing.append(
            "no GPU was found to build for (cuda-python sees none): pass --arch with the compute capability of "
            "the GPU that will run the library, e.g. --arch sm_90 for an H100."
        )
    return sm


def _record(found: Discovery, key: str, sm: int, trt: str, runtime: str | None, sources: str, sha: str, seconds: float) -> dict:
    from trtforge import __version__

    f = found.found
    return {
        "kind": SIDECAR_KIND,
        "schema": SIDECAR_SCHEMA,
        "key": key,
        "sha256": sha,
        "sources_sha256": sources,
        "tensorrt_version": trt,
        "tensorrt_runtime": runtime,
        "tensorrt_include": {"path": str(f["tensorrt_include"].path), "version": f["tensorrt_include"].version},
        "cuda": {"path": str(f["cuda_home"].path), "version": f["cuda_home"].version, "nvcc": str(f["nvcc"].path)},
        "cxx": str(f["cxx"].path),
        "sm": sm,
        "cudnn": {"include": str(f["cudnn_include"].path), "lib": str(f["cudnn_lib"].path), "version": f["cudnn_include"].version},
        "cudnn_frontend": {"include": str(f["cudnn_frontend_include"].path), "version": f["cudnn_frontend_include"].version},
        "cublas_include": str(f["cublas_include"].path),
        "runtime_libraries": [str(p) for p in found.runtime_libraries],
        "sources": {k: v.source for k, v in f.items()},
        "trtforge_version": __version__,
        "build_seconds": round(seconds, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _last_error(text: str) -> str:
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    errors = [l for l in lines if "error" in l.lower()]
    return (errors or lines or ["no output"])[0][:300]


def compile_library(native: Path, env: dict[str, str], out: Path, log: Path) -> None:
    """Run trtforge/native/build.sh into `out` (a temp name beside the final one) and keep its output in `log`."""
    try:
        proc = subprocess.run(["bash", str(native / "build.sh"), str(out)], env={**os.environ, **env}, capture_output=True, text=True)
    except OSError as exc:
        raise UserError(f"cannot run bash for {native / 'build.sh'}: {exc.strerror or exc}; install bash.") from None
    write_text_atomic(log, f"$ bash {native / 'build.sh'} {out}\n{proc.stdout}{proc.stderr}")
    if proc.returncode != 0 or not out.is_file():
        raise UserError(
            f"compiling the plugin library failed (exit {proc.returncode}): {_last_error(proc.stderr + proc.stdout)}; "
            f"the compiler's output is in {log}."
        )


def build_plugins(flags: dict[str, str | None], packages_dirs: list[str], arch: str | None = None, force: bool = False) -> BuildReport:
    """Find everything, then compile into <cache>/plugins/<key>/ and write the library's sidecar; an up-to-date
    library for the same key and sources is reused unless `force`."""
    native = native_sources()
    runtime = runtime_tensorrt_version()
    found = discovery_here(flags, packages_dirs, runtime)
    missing = list(found.missing)
    sm = _arch(arch, missing)
    if missing:
        raise MissingRequirements(missing)
    assert sm is not None
    trt = normalize_tensorrt_version(runtime or str(found.found["tensorrt_include"].version))
    key = cache_key(trt, str(found.found["cuda_home"].version), sm)
    lib = library_path(cache_dir(), key)
    sources = sources_digest(native)
    if not force:
        current = _read_record(sidecar_path(lib)) if lib.is_file() else None
        if current and current.get("sources_sha256") == sources and current.get("sha256") == sha256_file(lib):
            return BuildReport(lib, key, True, 0.0, current)
    ensure_writable_dir(lib)  # a cache that cannot be written is one sentence naming it (TRTFORGE_CACHE_DIR moves it)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".build-", dir=lib.parent) as tmp:
        out = Path(tmp) / LIBRARY_NAME
        compile_library(native, build_environment(found.found), out, lib.parent / "build.log")
        sha = sha256_file(out)
        seconds = time.perf_counter() - start
        record = _record(found, key, sm, trt, runtime, sources, sha, seconds)
        publish(out, lib)  # the library first: a sidecar never names bytes that are not there yet
    write_sidecar(lib, record)
    return BuildReport(lib, key, False, seconds, record)


def status(flags: dict[str, str | None], packages_dirs: list[str]) -> dict[str, Any]:
    """What `plugins build` would find (without compiling) and the cache's state for this machine."""
    runtime = runtime_tensorrt_version()
    sm = gpu_sm()
    found = discovery_here(flags, packages_dirs, runtime)
    state = state_for(runtime, sm)
    return {
        "cache_dir": str(plugins_dir(cache_dir())),
        "cache_env": CACHE_ENV,
        "tensorrt": runtime,
        "sm": sm,
        "state": state.status,
        "path": str(state.path) if state.path else None,
        "detail": state.detail,
        "found": {k: {"path": str(v.path), "source": v.source, "version": v.version} for k, v in found.found.items()},
        "missing": found.missing,
        "runtime_libraries": [str(p) for p in found.runtime_libraries],
    }


def plugin_library_state() -> dict[str, Any]:
    """libtrtforge_plugins for this TensorRT and GPU: found (with its path), not built, stale, or unavailable (why)."""
    from trtforge.build.plugins.discovery import plugins_dir

    state = state_here()
    return {
        "state": state.status,
        "path": str(state.path) if state.path else None,
        "detail": state.detail,
        "cache_dir": str(plugins_dir(cache_dir())),
    }
