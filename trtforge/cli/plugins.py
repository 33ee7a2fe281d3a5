"""`trtforge plugins build|status|path`: parse, call trtforge.plugins_build, render."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trtforge.cli import options as opt
from trtforge.core import ui
from trtforge.core.errors import UserError

plugins_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="libtrtforge_plugins (cuDNN flash attention, cuBLASLt GEMMs for TensorRT 8.6): build it "
    "into the per-user cache that build and run load by default.",
)

CudaHome = typer.Option(
    None,
    "--cuda-home",
    help="The CUDA toolkit (bin/nvcc, include/, lib64/libcudart_static.a; default: $CUDA_HOME, the nvcc on PATH, /usr/local/cuda*).",
)
TrtInclude = typer.Option(
    None,
    "--tensorrt-include",
    help="TensorRT 8.6's include/ with NvInfer.h (default: $TRT_INCLUDE, $TENSORRT_ROOT/include, the tensorrt package, /usr/include, /usr/local/TensorRT*/include).",
)
CudnnInclude = typer.Option(
    None,
    "--cudnn-include",
    help="cuDNN 9's include/ (default: $CUDNN_INCLUDE, the nvidia-cudnn-cu12 wheel's nvidia/cudnn/include, the CUDA toolkit, /usr/include).",
)
CudnnLib = typer.Option(
    None,
    "--cudnn-lib",
    help="The directory of libcudnn.so.9 (default: $CUDNN_LIB, beside the cuDNN headers, the wheel's nvidia/cudnn/lib).",
)
FrontendInclude = typer.Option(
    None,
    "--cudnn-frontend-include",
    help="cudnn-frontend's include/ (default: $CUDNN_FRONTEND_INCLUDE, the nvidia-cudnn-frontend wheel's site-packages/include).",
)
CublasInclude = typer.Option(
    None, "--cublas-include", help="The directory of cublasLt.h (default: $CUBLAS_INCLUDE, the nvidia-cublas wheels, the CUDA toolkit)."
)
PackagesDir = typer.Option(
    None, "--packages-dir", help="Another site-packages to search for the nvidia-* wheels (repeatable), e.g. another Python's."
)


def _flags(cuda_home, tensorrt_include, cudnn_include, cudnn_lib, cudnn_frontend_include, cublas_include) -> dict:
    return {
        "cuda_home": cuda_home,
        "tensorrt_include": tensorrt_include,
        "cudnn_include": cudnn_include,
        "cudnn_lib": cudnn_lib,
        "cudnn_frontend_include": cudnn_frontend_include,
        "cublas_include": cublas_include,
    }


@plugins_app.command("build")
def build_cmd(
    cuda_home: Optional[str] = CudaHome,
    tensorrt_include: Optional[str] = TrtInclude,
    cudnn_include: Optional[str] = CudnnInclude,
    cudnn_lib: Optional[str] = CudnnLib,
    cudnn_frontend_include: Optional[str] = FrontendInclude,
    cublas_include: Optional[str] = CublasInclude,
    packages_dir: Optional[list[str]] = PackagesDir,
    arch: Optional[str] = typer.Option(None, "--arch", help="The GPU architecture to build for, e.g. sm_90 (default: GPU 0's)."),
    force: bool = typer.Option(False, "--force", help="Compile again even when the cached library is up to date."),
    json_out: bool = opt.JsonOpt,
) -> None:
    """Find CUDA, TensorRT 8.6, cuDNN 9, cudnn-frontend and cuBLASLt, and compile libtrtforge_plugins into the cache
    (~/.cache/trtforge/plugins/trt<ver>-cuda<ver>-sm<arch>/; TRTFORGE_CACHE_DIR moves it)."""
    from trtforge.build.plugins.compile import MissingRequirements, build_plugins

    flags = _flags(cuda_home, tensorrt_include, cudnn_include, cudnn_lib, cudnn_frontend_include, cublas_include)
    try:
        report = build_plugins(flags, list(packages_dir or []), arch, force)
    except MissingRequirements as exc:
        if len(exc.sentences) > 1:
            err = ui.console(stderr=True)
            for sentence in exc.sentences:
                err.print(f"missing: {sentence}", markup=False)
        raise
    if json_out:
        ui.print_json({"path": str(report.path), "key": report.key, "reused": report.reused, **report.record})
        return
    con = ui.console()
    if report.reused:
        con.print(f"up to date: {report.path} ({report.key}); --force compiles it again", markup=False)
    else:
        con.print(f"built {report.path} ({report.key}) in {report.seconds:.0f} s", markup=False)
    con.print("build and run load it by default for this TensorRT and GPU (--plugin-library none turns it off)", markup=False)


@plugins_app.command("status")
def status_cmd(
    cuda_home: Optional[str] = CudaHome,
    tensorrt_include: Optional[str] = TrtInclude,
    cudnn_include: Optional[str] = CudnnInclude,
    cudnn_lib: Optional[str] = CudnnLib,
    cudnn_frontend_include: Optional[str] = FrontendInclude,
    cublas_include: Optional[str] = CublasInclude,
    packages_dir: Optional[list[str]] = PackagesDir,
    json_out: bool = opt.JsonOpt,
) -> None:
    """The cached library for this TensorRT and GPU (found, not built, stale) and what `plugins build` would use."""
    from trtforge.build.plugins.compile import status

    data = status(
        _flags(cuda_home, tensorrt_include, cudnn_include, cudnn_lib, cudnn_frontend_include, cublas_include), list(packages_dir or [])
    )
    if json_out:
        ui.print_json(data)
        return
    con = ui.console()
    con.print(f"plugin library: {data['state']}: {data['detail']}", markup=False)
    rows = [[k, v["path"], v["source"], v["version"] or "-"] for k, v in data["found"].items()]
    con.print(ui.table("what `trtforge plugins build` would use", ["requirement", "path", "from", "version"], rows))
    for sentence in data["missing"]:
        con.print(f"missing: {sentence}", markup=False)


@plugins_app.command("path")
def path_cmd() -> None:
    """Print the cached library's path for this TensorRT and GPU (exit 2 when there is none)."""
    from trtforge.build.plugins.compile import state_here

    state = state_here()
    if state.status != "found" or state.path is None:
        raise UserError(f"no usable plugin library ({state.status}): {state.detail}.")
    typer.echo(str(Path(state.path)))
