"""benchmarks/build_passes.py: where `build`'s own time goes before TensorRT sees the graph, on a machine without it.

Runs build's planning and graph passes (the fp16 conversion with its magnitude observation, the shared observation,
the attention pass, the GELU / skip-LayerNorm / GEMM passes) as they run for a TensorRT 8.6 fp16 build with
libtrtforge_plugins loaded on an sm_90 GPU, with TensorRT itself stood in: the plugin registry answers yes, no
library is loaded, nothing is built. The laps are the build clock's (build/clock.py), the same the build's
`build time:` line and the sidecar's `build_overhead` report; the attention count is the pass's record. Prints a
table, writes JSON. On a GPU machine with TensorRT, the build's own line gives the same laps beside TensorRT's time.

    python benchmarks/build_passes.py CLEAN.onnx --config CONFIG.yaml [--repeat 2] [--json out/build_passes.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

import trtforge.backends.plugin_libraries as plugin_libraries  # noqa: E402
import trtforge.build.plugins.compile as plugins_compile  # noqa: E402
import trtforge.build.step as build_step  # noqa: E402
import trtforge.core.platform as platform  # noqa: E402
from trtforge.backends.base import TrtModule  # noqa: E402
from trtforge.backends.tensorrt import BuildOptions  # noqa: E402
from trtforge.core.artifacts import write_json_atomic  # noqa: E402

GPU = {"name": "stand-in sm_90 GPU", "compute_capability": "9.0"}


def stand_in_tensorrt_86() -> None:
    """TensorRT 8.6 with trtforge's plugins registered, on an sm_90 GPU, as far as the passes ask."""
    plugin_libraries.plugin_registered = lambda mod, name, version: True
    plugin_libraries.load_plugin_libraries = lambda mod, libraries: None
    plugin_libraries.init_plugins = lambda mod: None
    plugins_compile.libraries_for_build = lambda *args, **kwargs: []
    platform.gpu_info = lambda: GPU
    build_step.load_trt = lambda backend: TrtModule(None, "tensorrt", "8.6.1")


def passes_once(onnx_path: Path, tiers: dict | None, precision: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="trtforge-build-passes-") as folder:
        plan = build_step.plan_build(
            onnx_path, Path(folder) / "stand-in.engine", precision, None, tiers, "tensorrt", BuildOptions(), None, 3, lambda _: None
        )
        start = time.perf_counter()
        graphs = build_step.graph_passes(plan)
        total = time.perf_counter() - start
    fusion = graphs.fusion or {}
    return {
        "laps": {k: round(v, 3) for k, v in plan.clock.laps.items()},
        "passes_seconds": round(total, 3),
        "attentions": len(fusion.get("attentions") or []),
        "fused": len(fusion.get("replaced") or []),
        "plugins": fusion.get("plugins"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("onnx", type=Path, help="a cleaned ONNX (trtforge clean)")
    ap.add_argument("--config", type=Path, required=True, help="its config (build.tiers, build.precision)")
    ap.add_argument("--repeat", type=int, default=1, help="runs; the table shows each lap's median")
    ap.add_argument("--json", type=Path, default=ROOT / "out" / "build_passes.json")
    args = ap.parse_args()
    if args.json.resolve() in (args.onnx.resolve(), args.config.resolve()):
        ap.error(f"--json {args.json} is an input; write the results elsewhere.")
    build = (yaml.safe_load(args.config.read_text()) or {}).get("build") or {}
    stand_in_tensorrt_86()
    runs = [passes_once(args.onnx, build.get("tiers"), build.get("precision", "fp16")) for _ in range(args.repeat)]
    laps = {k: statistics.median(r["laps"][k] for r in runs) for k in runs[0]["laps"]}
    print(f"{args.onnx.name}: build's passes as for TensorRT 8.6 fp16 with trtforge's plugins ({args.repeat} run(s), median s)")
    print(f"{'lap':48s} {'s':>8s}")
    for name, seconds in laps.items():
        print(f"{name:48s} {seconds:8.2f}")
    print(f"{'total':48s} {sum(laps.values()):8.2f}")
    print(f"attention: fused {runs[0]['fused']} of {runs[0]['attentions']} ({', '.join(runs[0]['plugins'] or []) or 'no plugin'})")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.json, {"onnx": str(args.onnx), "config": str(args.config), "median_laps": laps, "runs": runs})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
