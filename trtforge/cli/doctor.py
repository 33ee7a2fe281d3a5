"""`trtforge doctor`: what this machine has and can run."""

from __future__ import annotations

from trtforge import __version__
from trtforge.cli import options as opt
from trtforge.core import ui


def doctor(json_out: bool = opt.JsonOpt) -> None:
    """Report Python, torch, ONNX, ONNX Runtime, TensorRT, CUDA and the GPU, and what this machine can run."""
    from trtforge.build.plugins.compile import plugin_library_state
    from trtforge.core.platform import report

    data = {**report(), "plugin_library": plugin_library_state()}
    if json_out:
        ui.print_json(data)
        return
    con = ui.console()
    con.print(f"trtforge {__version__} on {data['platform']}")
    con.print(ui.table("versions", ["component", "version"], [[k, v or "not installed"] for k, v in data["versions"].items()]))
    con.print(f"ONNX Runtime providers: {', '.join(data['onnxruntime_providers']) or 'none'}")
    gpu = data["gpu"]
    con.print(f"GPU: {gpu['name']} (compute capability {gpu['compute_capability']}, {gpu['memory_gib']} GiB)" if gpu else "GPU: none found")
    con.print(ui.table("features", ["feature", "available"], [[k, "yes" if v else "no"] for k, v in data["features"].items()]))
    for flavour, why in data["engines"].items():
        con.print(f"run {flavour} engines here: {why}")
    plugin = data["plugin_library"]
    con.print(f"plugin library (libtrtforge_plugins): {plugin['state']}: {plugin['detail']}", markup=False)
