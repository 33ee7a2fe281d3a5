"""Where the pieces that compile libtrtforge_plugins are, and where the built library lives: pure functions of the
file system, the environment and the search path, so every search order and every "missing" sentence is tested
with fake directory trees (trtforge.plugins_build runs the compiler and probes the GPU).

Each requirement is looked for in order: its flag, then its environment variable (the names trtforge/native/build.sh
reads), then the pip wheels that `pip install 'trtforge[plugins]'` installs (under each site-packages of the search
path), then the usual system places. A flag or variable that is set is the only place looked at: a directory the
user named and that lacks the header is an error, not a reason to take another one silently.

Wheel layouts (as installed under site-packages):
- nvidia-cudnn-cu12 / -cu13: nvidia/cudnn/include/cudnn.h, nvidia/cudnn/lib/libcudnn.so.9
- nvidia-cudnn-frontend (1.5+): include/cudnn_frontend.h (a top-level include/ directory)
- nvidia-cublas-cu12: nvidia/cublas/include/cublasLt.h, nvidia/cublas/lib/libcublasLt.so.12;
  nvidia-cublas (CUDA 13): nvidia/cu13/include/cublasLt.h, nvidia/cu13/lib/libcublasLt.so.13
- nvidia-cuda-nvrtc-cu12: nvidia/cuda_nvrtc/lib/libnvrtc.so.12 (cuDNN compiles its attention kernels at run time)
- tensorrt (PyPI): libraries only, no headers; TensorRT's headers come from its tarball, its Debian packages
  (libnvinfer-dev), or NVIDIA/TensorRT's include/ at the release tag.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from trtforge.core.errors import UserError

LIBRARY_NAME = "libtrtforge_plugins.so"
SIDECAR_NAME = LIBRARY_NAME + ".json"
SIDECAR_KIND = "trtforge-plugin-library"
SIDECAR_SCHEMA = 1
CACHE_ENV = "TRTFORGE_CACHE_DIR"
MIN_CUDA = (12, 0)
TENSORRT_MAJOR_MINOR = (8, 6)  # the plugin sources are written against TensorRT 8.6's IPluginV2DynamicExt
EXTRA = "pip install 'trtforge[plugins]'"
SOURCE_SUFFIXES = (".cpp", ".cu", ".h", ".sh")


@dataclass(frozen=True)
class Found:
    path: Path  # the directory (or, for tools, the executable)
    source: str  # where it came from: "--flag", "$VAR", "package", "system", "PATH"
    version: str | None = None


@dataclass
class Discovery:
    """What the compile needs, found or not: `missing` holds one sentence per thing that was not found."""

    found: dict[str, Found] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    runtime_libraries: list[Path] = field(default_factory=list)  # cuBLASLt / nvrtc to preload before the plugin

    @property
    def ok(self) -> bool:
        return not self.missing


@dataclass(frozen=True)
class Inputs:
    """Everything discovery reads besides the file system. flags: requirement key -> the directory given on the
    command line; search_path: site-packages directories (sys.path and --packages-dir); system: roots of the usual
    system places (['/'] outside tests); which: shutil.which."""

    flags: dict[str, str | None]
    env: dict[str, str]
    search_path: list[str]
    which: Callable[[str], str | None]
    system: tuple[str, ...] = ("/",)


def _define(path: Path, name: str) -> int | None:
    """The integer value of `#define NAME value` in a header, or None."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    m = re.search(rf"^\s*#\s*define\s+{name}\s+(\d+)", text, re.M)
    return int(m.group(1)) if m else None


def tensorrt_header_version(include: Path) -> str | None:
    """'8.6.1' from NvInferVersion.h's NV_TENSORRT_MAJOR/MINOR/PATCH, or None."""
    header = include / "NvInferVersion.h"
    parts = [_define(header, f"NV_TENSORRT_{p}") for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(map(str, parts)) if all(p is not None for p in parts) else None


def cuda_header_version(include: Path) -> str | None:
    """'12.4' from cuda_runtime_api.h's CUDART_VERSION (12040), or None."""
    value = _define(include / "cuda_runtime_api.h", "CUDART_VERSION")
    return None if value is None else f"{value // 1000}.{value % 1000 // 10}"


def cudnn_header_version(include: Path) -> str | None:
    parts = [_define(include / "cudnn_version.h", f"CUDNN_{p}") for p in ("MAJOR", "MINOR", "PATCHLEVEL")]
    return ".".join(map(str, parts)) if all(p is not None for p in parts) else None


def frontend_header_version(include: Path) -> str | None:
    parts = [_define(include / "cudnn_frontend_version.h", f"CUDNN_FRONTEND_{p}_VERSION") for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(map(str, parts)) if all(p is not None for p in parts) else None


def _version_tuple(version: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version or "")[:3])


def normalize_tensorrt_version(version: str) -> str:
    """'8.6.1.6' or '8.6.1.post1' -> '8.6.1': the cache key's TensorRT version (the build number does not change the
    plugin ABI)."""
    return ".".join(map(str, _version_tuple(version)))


def _sys(inputs: Inputs, *parts: str) -> list[Path]:
    return [Path(root, *parts) for root in inputs.system]


def _globbed(bases: Iterable[Path], pattern: str) -> list[Path]:
    """Matches of `pattern` under each base, newest-looking name first (cuda-12.4 before cuda-12.1)."""
    out: list[Path] = []
    for base in bases:
        if base.is_dir():
            out += sorted(base.glob(pattern), key=lambda p: _version_tuple(p.name), reverse=True)
    return out


def _given(inputs: Inputs, key: str, flag: str, env: str) -> tuple[Path, str] | None:
    if inputs.flags.get(key):
        return Path(str(inputs.flags[key])).expanduser(), flag
    if inputs.env.get(env):
        return Path(inputs.env[env]).expanduser(), f"${env}"
    return None


def _looked(paths: list[Path]) -> str:
    shown = list(dict.fromkeys(str(p) for p in paths))
    return ", ".join(shown[:6]) + (f" and {len(shown) - 6} more" if len(shown) > 6 else "") if shown else "nowhere"


def _site(inputs: Inputs, *parts: str) -> list[Path]:
    return [Path(p, *parts) for p in inputs.search_path if p]


# ---------------------------------------------------------------------------------------------------- requirements


def find_cuda(inputs: Inputs, out: Discovery) -> None:
    """The CUDA toolkit: nvcc 12+, include/cuda_runtime_api.h and the static runtime (lib64/libcudart_static.a)."""
    given = _given(inputs, "cuda_home", "--cuda-home", "CUDA_HOME")
    if given:
        candidates, source = [given[0]], given[1]
    else:
        source = "system"
        candidates = []
        nvcc = inputs.which("nvcc")
        if nvcc:
            candidates.append(Path(nvcc).resolve().parent.parent)
        candidates += _sys(inputs, "usr", "local", "cuda") + _globbed(_sys(inputs, "usr", "local"), "cuda-*")
    problems = []
    for home in candidates:
        lacks = [p for p in ("bin/nvcc", "include/cuda_runtime_api.h", "lib64/libcudart_static.a") if not (home / p).exists()]
        if lacks:
            problems.append(f"{home} lacks {' and '.join(lacks)}")
            continue
        version = cuda_header_version(home / "include")
        if _version_tuple(version) < MIN_CUDA:
            problems.append(f"{home} is CUDA {version or 'of unknown version'}")
            continue
        out.found["cuda_home"] = Found(home, source, version)
        nvcc_env = inputs.env.get("NVCC")
        out.found["nvcc"] = Found(Path(nvcc_env) if nvcc_env else home / "bin" / "nvcc", "$NVCC" if nvcc_env else source, version)
        return
    where = "; ".join(problems) if problems else f"no nvcc on PATH and nothing at {_looked(candidates)}"
    fix = f"fix {source}" if given else "install the CUDA toolkit 12 or newer or pass --cuda-home DIR"
    out.missing.append(f"no CUDA toolkit (nvcc 12+, include/cuda_runtime_api.h, lib64/libcudart_static.a) was found ({where}): {fix}.")


def find_cxx(inputs: Inputs, out: Discovery) -> None:
    name = inputs.env.get("CXX")
    path = inputs.which(name) if name else (inputs.which("g++") or inputs.which("c++"))
    if path:
        out.found["cxx"] = Found(Path(path), "$CXX" if name else "PATH")
    else:
        where = f"$CXX={name} is not on PATH" if name else "no g++ or c++ on PATH"
        out.missing.append(f"no C++17 compiler was found ({where}): install g++ (e.g. `apt-get install g++`) or set CXX.")


def find_tensorrt(inputs: Inputs, out: Discovery, runtime_version: str | None) -> None:
    """TensorRT 8.6's include/ (NvInfer.h, NvInferVersion.h), matching the installed TensorRT's major.minor."""
    given = _given(inputs, "tensorrt_include", "--tensorrt-include", "TRT_INCLUDE")
    if given:
        candidates, source = [given[0]], given[1]
    else:
        source = "system"
        roots = [Path(inputs.env[v]) / "include" for v in ("TENSORRT_ROOT", "TRT_ROOT") if inputs.env.get(v)]
        candidates = roots + [p / "include" for p in _site(inputs, "tensorrt") + _site(inputs, "tensorrt_libs")]
        candidates += _sys(inputs, "usr", "include", "x86_64-linux-gnu") + _sys(inputs, "usr", "include")
        candidates += [p / "include" for p in _globbed(_sys(inputs, "usr", "local") + _sys(inputs, "opt"), "TensorRT*")]
        candidates += _sys(inputs, "opt", "tensorrt", "include")
    wanted = ".".join(map(str, TENSORRT_MAJOR_MINOR))
    others = []
    for include in candidates:
        if not (include / "NvInfer.h").is_file():
            continue
        version = tensorrt_header_version(include)
        if _version_tuple(version)[:2] != TENSORRT_MAJOR_MINOR:
            others.append(f"{include} holds TensorRT {version or 'headers of unknown version'}")
            continue
        if runtime_version and _version_tuple(runtime_version)[:2] != _version_tuple(version)[:2]:
            out.missing.append(
                f"the TensorRT headers at {include} are {version} but the installed tensorrt is "
                f"{runtime_version}: the plugins are written for TensorRT {wanted}; install tensorrt=={wanted}.* "
                "or point --tensorrt-include at its headers."
            )
            return
        out.found["tensorrt_include"] = Found(
            include, source if given else ("package" if include.parent.name in ("tensorrt", "tensorrt_libs") else "system"), version
        )
        return
    seen = f"{'; '.join(others)}; " if others else ""
    fix = f"fix {source} with" if given else "the tensorrt wheel ships none; pass --tensorrt-include DIR with"
    out.missing.append(
        f"TensorRT {wanted}'s headers (NvInfer.h) were not found ({seen}looked in {_looked(candidates)}): {fix} "
        f"the include/ of the TensorRT {wanted} tarball, of libnvinfer-dev, or of github.com/NVIDIA/TensorRT "
        "at tag v8.6.0."
    )


def _first_with(candidates: list[Path], *markers: str) -> Path | None:
    return next((c for c in candidates if all((c / m).is_file() for m in markers)), None)


def _source(given: tuple[Path, str] | None, path: Path, inputs: Inputs) -> str:
    if given:
        return given[1]
    return "package" if any(str(path).startswith(str(Path(p))) for p in inputs.search_path if p) else "system"


def find_cudnn(inputs: Inputs, out: Discovery) -> None:
    """cuDNN 9: its headers (cudnn.h, cudnn_version.h) and its library directory (libcudnn.so.9)."""
    cuda = out.found.get("cuda_home")
    given = _given(inputs, "cudnn_include", "--cudnn-include", "CUDNN_INCLUDE")
    candidates = (
        [given[0]]
        if given
        else (
            _site(inputs, "nvidia", "cudnn", "include")
            + ([cuda.path / "include"] if cuda else [])
            + _sys(inputs, "usr", "include", "x86_64-linux-gnu")
            + _sys(inputs, "usr", "include")
        )
    )
    include = _first_with(candidates, "cudnn.h", "cudnn_version.h")
    version = cudnn_header_version(include) if include else None
    if include is None or _version_tuple(version)[:1] != (9,):
        seen = f"{include} holds cuDNN {version}; " if include else ""
        fix = f"fix {given[1]}" if given else f"{EXTRA} (nvidia-cudnn-cu12) or pass --cudnn-include DIR"
        out.missing.append(f"cuDNN 9's headers (cudnn.h) were not found ({seen}looked in {_looked(candidates)}): {fix}.")
        include = None
    else:
        out.found["cudnn_include"] = Found(include, _source(given, include, inputs), version)
    given_lib = _given(inputs, "cudnn_lib", "--cudnn-lib", "CUDNN_LIB")
    beside = [include.parent / "lib"] if include is not None else []
    libs = (
        [given_lib[0]]
        if given_lib
        else (
            beside
            + _site(inputs, "nvidia", "cudnn", "lib")
            + ([cuda.path / "lib64"] if cuda else [])
            + _sys(inputs, "usr", "lib", "x86_64-linux-gnu")
        )
    )
    lib = _first_with(libs, "libcudnn.so.9")
    if lib is None:
        fix = f"fix {given_lib[1]}" if given_lib else f"{EXTRA} (nvidia-cudnn-cu12) or pass --cudnn-lib DIR"
        out.missing.append(f"cuDNN 9's library (libcudnn.so.9) was not found (looked in {_looked(libs)}): {fix}.")
    else:
        out.found["cudnn_lib"] = Found(lib, _source(given_lib, lib, inputs), version)


def find_frontend(inputs: Inputs, out: Discovery) -> None:
    """cudnn-frontend's header-only include/ (its headers include "../include/...", so the directory keeps that name)."""
    given = _given(inputs, "cudnn_frontend_include", "--cudnn-frontend-include", "CUDNN_FRONTEND_INCLUDE")
    candidates = (
        [given[0]] if given else (_site(inputs, "include") + _sys(inputs, "usr", "local", "include") + _sys(inputs, "usr", "include"))
    )
    include = _first_with(candidates, "cudnn_frontend.h")
    if include is None:
        fix = f"fix {given[1]}" if given else f"{EXTRA} (nvidia-cudnn-frontend 1.14) or pass --cudnn-frontend-include DIR"
        out.missing.append(f"cudnn-frontend's headers (cudnn_frontend.h) were not found (looked in {_looked(candidates)}): {fix}.")
    elif include.resolve().name != "include":
        out.missing.append(
            f"cudnn-frontend's headers at {include} must sit in a directory named include/ (they include "
            '"../include/..."): pass the include/ directory of its source tree or wheel.'
        )
    else:
        out.found["cudnn_frontend_include"] = Found(include, _source(given, include, inputs), frontend_header_version(include))


def find_cublas(inputs: Inputs, out: Discovery) -> None:
    """cublasLt.h (the GEMM plugin's declarations; the library itself is opened at run time)."""
    cuda = out.found.get("cuda_home")
    given = _given(inputs, "cublas_include", "--cublas-include", "CUBLAS_INCLUDE")
    candidates = (
        [given[0]]
        if given
        else (
            _site(inputs, "nvidia", "cublas", "include")
            + _site(inputs, "nvidia", "cu13", "include")
            + ([cuda.path / "include"] if cuda else [])
        )
    )
    include = _first_with(candidates, "cublasLt.h")
    if include is None:
        fix = f"fix {given[1]}" if given else f"{EXTRA} (nvidia-cublas-cu12) or pass --cublas-include DIR"
        out.missing.append(f"cuBLASLt's header (cublasLt.h) was not found (looked in {_looked(candidates)}): {fix}.")
    else:
        out.found["cublas_include"] = Found(include, _source(given, include, inputs))


def find_runtime_libraries(inputs: Inputs, out: Discovery) -> None:
    """cuBLASLt and nvrtc from the wheels, which the plugin (dlopen of libcublasLt) and cuDNN (nvrtc) open at run time by
    name: preloaded by full path they resolve without LD_LIBRARY_PATH. Optional: a system install is found by the loader."""
    cublas = out.found.get("cublas_include")
    dirs = (
        ([cublas.path.parent / "lib"] if cublas else [])
        + _site(inputs, "nvidia", "cublas", "lib")
        + _site(inputs, "nvidia", "cu13", "lib")
        + _site(inputs, "nvidia", "cuda_nvrtc", "lib")
    )
    for prefix in ("libcublasLt.so.", "libnvrtc.so."):
        for d in dirs:
            hits = (
                sorted(d.glob(prefix + "[0-9]*"), key=lambda p: _version_tuple(p.name[len(prefix) :]), reverse=True) if d.is_dir() else []
            )
            hits = [h for h in hits if re.fullmatch(re.escape(prefix) + r"\d+", h.name)]
            if hits:
                out.runtime_libraries.append(hits[0])
                break


def discover(inputs: Inputs, runtime_tensorrt: str | None = None) -> Discovery:
    """Every requirement of the compile, found or described as missing (one sentence each, in a fixed order)."""
    out = Discovery()
    find_cuda(inputs, out)
    find_cxx(inputs, out)
    find_tensorrt(inputs, out, runtime_tensorrt)
    find_cudnn(inputs, out)
    find_frontend(inputs, out)
    find_cublas(inputs, out)
    find_runtime_libraries(inputs, out)
    return out


def build_environment(found: dict[str, Found]) -> dict[str, str]:
    """The variables trtforge/native/build.sh reads, from what discovery found."""
    names = {
        "tensorrt_include": "TRT_INCLUDE",
        "cudnn_include": "CUDNN_INCLUDE",
        "cudnn_lib": "CUDNN_LIB",
        "cudnn_frontend_include": "CUDNN_FRONTEND_INCLUDE",
        "cublas_include": "CUBLAS_INCLUDE",
        "cuda_home": "CUDA_HOME",
        "nvcc": "NVCC",
        "cxx": "CXX",
    }
    return {var: str(found[key].path) for key, var in names.items() if key in found}


# ---------------------------------------------------------------------------------------------------- the cache


def parse_arch(text: str) -> int:
    """'sm_90', 'SM90', '9.0' or '90' -> 90; ValueError for anything else."""
    s = text.strip().lower().removeprefix("sm_").removeprefix("sm")
    m = re.fullmatch(r"(\d+)\.(\d)", s)
    if m:
        return int(m.group(1)) * 10 + int(m.group(2))
    if re.fullmatch(r"\d{2,3}", s):
        return int(s)
    raise ValueError(text)


def cuda_major_minor(version: str) -> str:
    parts = _version_tuple(version)
    return f"{parts[0]}.{parts[1] if len(parts) > 1 else 0}"


def cache_key(tensorrt_version: str, cuda_version: str, sm: int) -> str:
    """'trt8.6.1-cuda12.4-sm90': one library per TensorRT version, CUDA toolkit and GPU architecture."""
    return f"trt{normalize_tensorrt_version(tensorrt_version)}-cuda{cuda_major_minor(cuda_version)}-sm{sm}"


def cache_root(env: dict[str, str], home: Path) -> Path:
    """$TRTFORGE_CACHE_DIR, else $XDG_CACHE_HOME/trtforge, else ~/.cache/trtforge."""
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "trtforge"
    return home / ".cache" / "trtforge"


def plugins_dir(root: Path) -> Path:
    return root / "plugins"


def library_path(root: Path, key: str) -> Path:
    return plugins_dir(root) / key / LIBRARY_NAME


def sources_digest(native_dir: Path) -> str:
    """sha256 over the native sources and build script (names and bytes): a cached library built from other sources
    is stale."""
    h = hashlib.sha256()
    for path in sorted(p for p in native_dir.iterdir() if p.suffix in SOURCE_SUFFIXES and p.is_file()):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class CacheState:
    status: str  # "found" | "not built" | "stale"
    path: Path | None
    detail: str  # one sentence for doctor, `plugins status` and build's warning
    record: dict | None = None  # the library's sidecar when found


def _key_parts(name: str) -> tuple[str, tuple[int, ...], int] | None:
    m = re.fullmatch(r"trt([\d.]+)-cuda(\d+\.\d+)-sm(\d+)", name)
    return (m.group(1), _version_tuple(m.group(2)), int(m.group(3))) if m else None


def cache_state(
    root: Path,
    tensorrt_version: str,
    sm: int,
    sources: str,
    driver_cuda: str | None,
    read_record: Callable[[Path], dict | None],
    library_hash: Callable[[Path], str],
) -> CacheState:
    """Which cached library build and run load for this TensorRT and GPU: among trt<ver>-cuda*-sm<sm>, the newest CUDA
    the driver runs (any, when the driver's version is unknown) whose sidecar names these sources and whose bytes match
    the hash it records. read_record and library_hash are injected so the decision is tested without a library."""
    trt = normalize_tensorrt_version(tensorrt_version)
    base = plugins_dir(root)
    wanted = f"trt{trt}-cuda*-sm{sm}"
    entries = sorted(
        (
            (parts, d)
            for d in (base.glob(wanted) if base.is_dir() else [])
            if (parts := _key_parts(d.name)) is not None and parts[0] == trt and parts[2] == sm
        ),
        key=lambda e: e[0][1],
        reverse=True,
    )
    stale: list[str] = []
    for (_, cuda, _), d in entries:
        lib = d / LIBRARY_NAME
        if driver_cuda and cuda > _version_tuple(driver_cuda)[:2]:
            stale.append(f"{lib} needs CUDA {'.'.join(map(str, cuda))}, newer than the driver's {driver_cuda}")
            continue
        record = read_record(d / SIDECAR_NAME) if lib.is_file() else None
        if record is None or record.get("kind") != SIDECAR_KIND:
            stale.append(f"{lib} has no readable sidecar")
            continue
        if record.get("sources_sha256") != sources:
            stale.append(f"{lib} was built from other plugin sources (an earlier trtforge)")
            continue
        if record.get("sha256") != library_hash(lib):
            stale.append(f"{lib} no longer matches the hash its sidecar records")
            continue
        return CacheState("found", lib, f"{lib} ({d.name}) matches TensorRT {trt} on sm_{sm}", record)
    if stale:
        return CacheState("stale", Path(str(entries[0][1] / LIBRARY_NAME)), f"{stale[0]}; run `trtforge plugins build` to rebuild it")
    return CacheState(
        "not built", None, f"no plugin library for TensorRT {trt} on sm_{sm} under {base}; `trtforge plugins build` makes one"
    )


NO_PLUGINS = "none"


def chosen_libraries(given: list[str], cached: CacheState | None) -> tuple[list[str], str]:
    """The plugin libraries a build loads and why: the paths given (--plugin-library / build.plugin_libraries), none
    for the single value 'none', else the cached library when one matches this TensorRT and GPU."""
    if given:
        if NO_PLUGINS in given:
            if len(given) > 1:
                raise UserError(
                    "--plugin-library none turns plugin libraries off (config key build.plugin_libraries: "
                    "[none]); give it alone, without paths."
                )
            return [], "turned off (--plugin-library none)"
        return list(given), "given"
    if cached is not None and cached.status == "found" and cached.path is not None:
        return [str(cached.path)], f"cached: {cached.detail}"
    return [], cached.detail if cached is not None else "no cached plugin library applies"
