"""How the commands print their results (rich tables on a terminal, plain lines under CI): apart from parsing."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from trtforge.core import ui

if TYPE_CHECKING:
    from rich.console import Console


def engine_check(check: Optional[dict]) -> None:
    """The engine re-check: ORT and engine figures side by side, or the line saying why it was skipped."""
    from trtforge.calibrate.engine_check import render_lines

    con = ui.console()
    if check and check.get("rows"):
        con.print(
            ui.table(
                check.get("title") or "held-out accuracy: ONNX Runtime (Q/DQ ONNX) vs the TensorRT engine",
                ["metric", "ONNX Runtime", "engine", "gate"],
                [[("-" if v is None else v) for v in r] for r in check["rows"]],
            )
        )
    for line in render_lines(check):
        con.print(line, markup=False)


def engine(side: dict, engine_path: Path, summary: Optional[dict]) -> None:
    con = ui.console()
    rows = []
    for p in side["profiles"]:
        for name, shp in p["shapes"].items():
            rows.append([p["index"], name, "x".join(map(str, shp["min"])), "x".join(map(str, shp["opt"])), "x".join(map(str, shp["max"]))])
    con.print(ui.table(f"{engine_path.name}: optimization profiles", ["profile", "input", "min", "opt", "max"], rows))
    targets = ",".join(side.get("target_compute_capabilities") or []) or side.get("compute_capability") or "-"
    con.print(
        f"{side['backend']} {side['tensorrt_version']}, precision {side['precision']}, target {targets}, "
        f"engine {side['engine_bytes'] / 1e6:.1f} MB, built in {side['build_seconds']:.1f} s"
    )
    from trtforge.build.clock import overhead_line

    if overhead_line(side.get("build_overhead")):
        con.print(overhead_line(side.get("build_overhead")), markup=False)
    report = side.get("precision_report") or {}
    if report.get("fp32_nodes") is not None:
        con.print(
            f"fp16 conversion: {report['fp16_nodes']} nodes fp16, {report['fp32_nodes']} kept fp32 (block list, observed overflow or integer arithmetic; the sidecar says why for each)"
        )
    if summary:
        source = f" (from the {side['layer_source']})" if side.get("layer_source") else ""
        con.print(ui.table(f"layers by type{source}", ["type", "count"], sorted(summary["by_type"].items(), key=lambda kv: -kv[1])))
        con.print(
            ui.table("layers by output precision", ["precision", "count"], sorted(summary["by_precision"].items(), key=lambda kv: -kv[1]))
        )
        int8 = summary.get("int8_layers") or []
        con.print(f"layers running INT8: {len(int8)}" + (": " + ", ".join(int8) if int8 else ""), markup=False)
        if summary.get("int8_verdict"):
            con.print(f"INT8: {summary['int8_verdict']}", markup=False)
    elif side.get("layer_info_unavailable"):
        con.print(f"layer information: {side['layer_info_unavailable']}")
    if (side.get("inspector") or {}).get("error"):
        con.print(f"engine inspector failed: {side['inspector']['error']}", markup=False)
    from trtforge.fusion.fp8 import describe_fp8
    from trtforge.fusion.step import describe, describe_gelu, describe_gemm, describe_skip_layernorm

    for line in (
        describe(side.get("attention_fusion") or {}, side.get("precision"))
        + describe_gelu(side.get("gelu_fusion") or {})
        + describe_skip_layernorm(side.get("skip_layernorm_fusion") or {})
        + describe_gemm(side.get("gemm_fusion") or {})
        + describe_fp8(side.get("gemm_precision") or {})
    ):
        con.print(line, markup=False)
    for lib in side.get("plugin_libraries") or []:
        con.print(f"plugin library: {lib['path']} (sha256 {lib.get('sha256', '?')[:12]}); run loads it first", markup=False)
    for note in side.get("notes", []):
        con.print(f"note: {note}")


def kind_label(output: dict) -> str:
    scale = output.get("scale")
    return output["kind"] + ("" if scale in (None, 1.0) else f" x{scale:g}")


def run_report(r: dict) -> None:
    con = ui.console()
    ch = r["chunking"]
    con.print(
        f"{len(r['inputs'])} inputs, {sum(i['chunks'] for i in r['inputs'])} chunks (chunk {ch['chunk']}, overlap {ch['overlap']}, "
        f"merge {ch['merge']}), {r['batches']} batches on {r['backend']}"
    )
    con.print("outputs: " + ", ".join(f"{n} ({kind_label(o)}, {o['source']})" for n, o in r["outputs"].items()))
    _run_errors(con, r)
    _run_latency(con, r)
    if r.get("workers"):
        _ray_workers(con, r)
    _run_throughput(con, r)
    _run_gates(con, r)


def _run_errors(con: Console, r: dict) -> None:
    """run's precision and chunking errors: one table for arrays, one for detections' boxes."""
    rows: list[list] = []
    box_rows: list[list] = []
    for label, section in (("precision", r["precision_error"]), ("chunking", r["chunking_error"])):
        if not section.get("measured"):
            rows.append([f"{label}: {section.get('reason', 'not measured')}", "-", "-", "-", "-", "-"])
            continue
        for name, m in section["per_output"].items():
            if "box_recall" in m:  # detections: the boxes table below
                box_rows.append(_box_row(f"{label}: {name}", m))
                continue
            task = m.get("top1_agreement", m.get("pixel_agreement", "-"))
            rows.append(
                [
                    f"{label}: {name} ({r['outputs'][name]['kind']})",
                    m["rel_l2"],
                    m["cosine"],
                    m["min_row_cosine"],
                    m["min_item_cosine"],
                    task,
                ]
            )
    con.print(ui.table("errors", ["check", "rel-L2", "cosine", "min row cosine", "min item cosine", "top-1 / pixel agr."], rows))
    _box_table(con, box_rows, "check")


def _box_row(label: str, m: dict) -> list:
    return [label, m["reference_boxes"], m["candidate_boxes"], m["box_recall"], m["box_precision"], m["matched_iou"], m["score_error"]]


def _box_table(con: Console, rows: list[list], first: str) -> None:
    """Detections' agreement: boxes matched to the reference's, not compared as numbers."""
    if rows:
        con.print(
            ui.table(
                "boxes (matched at IoU >= 0.5, same class)",
                [first, "reference boxes", "target boxes", "recall", "precision", "matched IoU", "score error"],
                rows,
            )
        )


def _run_latency(con: Console, r: dict) -> None:
    """run's latency per batch, by group."""
    lat = [
        [
            label,
            v["wall"]["count"],
            v["wall"].get("p50_ms", 0.0),
            v["wall"].get("p90_ms", 0.0),
            v["wall"].get("p99_ms", 0.0),
            v.get("gpu_compute", {}).get("p50_ms", "-"),
            v.get("wall_over_gpu", "-"),
        ]
        for label, v in r["latency"].items()
    ]
    con.print(
        ui.table(
            "latency per batch (warm-up excluded)", ["group", "batches", "p50 ms", "p90 ms", "p99 ms", "GPU p50 ms", "wall / GPU"], lat
        )
    )


def _ray_workers(con: Console, r: dict) -> None:
    """run's Ray workers, one row each."""
    con.print(
        ui.table(
            f"Ray workers ({r['ray']['actors']} actors, {r['ray']['units']} units, {r['ray']['retried_units']} retried)",
            [
                "worker",
                "host",
                "documents",
                "chunks",
                "batches",
                f"{r['throughput'].get('unit', 'tokens')}/s",
                "p50 ms",
                "retried",
                "alive",
            ],
            [
                [
                    w["worker"],
                    w["host"] or "-",
                    w["documents"],
                    w["chunks"],
                    w["batches"],
                    w["tokens_per_s"],
                    w["latency"]["all"]["wall"].get("p50_ms", 0.0),
                    w["retried_units"],
                    w["alive"],
                ]
                for w in r["workers"]
            ],
        )
    )


def _run_throughput(con: Console, r: dict) -> None:
    """run's throughput and memory, then the runtime's CUDA graphs and host stages where reported."""
    t, m = r["throughput"], r["memory"]
    mem = f"peak GPU {m['peak_gpu_mb']:.0f} MiB" if "peak_gpu_mb" in m else f"peak RSS {m['peak_rss_mb']:.0f} MiB"
    con.print(f"throughput {t['inputs_per_s']:.2f} inputs/s, {t['tokens_per_s']:.0f} {t.get('unit', 'tokens')}/s; {mem}")
    g = (r.get("runtime") or {}).get("cuda_graphs")
    if g:
        shared = r["runtime"].get("shared_device_memory", {})
        con.print(
            f"CUDA graphs: {'on' if g['enabled'] else 'off'}, {g['captured']} captured, {g['replayed']} replays, "
            f"{g['plain_enqueues']} plain enqueues, {len(g['fallbacks'])} fallbacks; shared device memory: "
            + (f"{shared['mb']:.0f} MiB" if shared.get("enabled") else "off")
        )
    host = r.get("runtime", {}).get("host")
    if host and host.get("stages"):
        con.print(
            f"host seconds (loop wall {host['loop_wall_s']:.3f} s; threads overlap): "
            + ", ".join(f"{k} {v['seconds']:.3f}" for k, v in host["stages"].items()),
            markup=False,
        )


def _run_gates(con: Console, r: dict) -> None:
    """run's gates: passed or why not, what was not evaluated, and each threshold with its source."""
    skipped = [c for c in r["gates"]["checked"] if c["status"] == "not evaluated"]
    note = "; not evaluated (defaults): " + ", ".join(f"{c['gate']} ({c['reason']})" for c in skipped) if skipped else ""
    con.print("gates: " + ("passed" if r["gates"]["passed"] else "FAILED: " + "; ".join(r["gates"]["failures"])) + note)
    used = ", ".join(f"{c['gate']} {c['threshold']:g} ({c['source']})" for c in r["gates"]["checked"])
    con.print(f"  target precision {r['gates'].get('precision', '?')}; gates: {used or 'none'}", markup=False)
    for line in r["gates"].get("notes") or []:
        con.print(f"  note: {line}", markup=False)


def compare_report(r: dict) -> None:
    con = ui.console()
    rows = [
        [
            name,
            r["outputs"][name]["kind"] or "-",
            m["rel_l2"],
            m["cosine"],
            m["max_abs"],
            (
                f"{m['tolerance']['violations']} outside"
                if m["tolerance"]["statistic"] == "elemwise"
                else f"{m['tolerance']['statistic']} {m['tolerance']['abs_error']:.3g}"
            )
            if "tolerance" in m
            else "-",
        ]
        for name, m in r["per_output"].items()
        if "box_recall" not in m
    ]
    con.print(
        ui.table(
            f"{Path(r['target']).name} against {Path(r['reference']).name} ({r['inputs']['samples']} inputs, "
            f"target precision {r['precision']})",
            ["output", "kind", "rel-L2", "cosine", "max-abs", "tolerance"],
            rows,
        )
    )
    _box_table(con, [_box_row(name, m) for name, m in r["per_output"].items() if "box_recall" in m], "output")
    lw = r.get("layerwise")
    if lw:
        rows = [
            [
                row["tensor"],
                row["op"] + ("" if row["target_op"] == row["op"] else f" (target: {row['target_op']})"),
                row["rel_l2"],
                row["cosine"],
                row["max_abs"],
                "-" if row["growth"] is None else f"{row['growth']:.3g}x",
                row["status"],
            ]
            for row in lw["rows"]
        ]
        con.print(
            ui.table(
                "layer-wise, in the reference's topological order",
                ["tensor", "op", "rel-L2", "cosine", "max-abs", "growth", "status"],
                rows,
            )
        )
        con.print(
            f"layer-wise: {lw['matched']} tensors matched by name ({lw['reference_tensors']} in the reference, "
            f"{lw['target_tensors']} in the target), {lw['compared']} compared, {len(lw['skipped'])} skipped"
            + "".join(f"; {n} {why}" for why, n in lw["skipped_counts"].items()),
            markup=False,
        )
        jump = lw["first_jump"]
        gates = ", ".join(f"{g['gate']} {g['threshold']:g}" for g in lw["gates"]) or "none"
        con.print(
            f"first tensor over the layer gates ({gates}): "
            + (
                f"'{jump['tensor']}' ({jump['op']} node {jump['node']}"
                + ("" if jump["target_op"] == jump["op"] else f", {jump['target_op']} in the target")
                + f"): {'; '.join(jump['reasons'])}"
                + ("" if jump["growth"] is None else f", {jump['growth']:.3g}x its inputs' worst")
                if jump
                else "none"
            ),
            markup=False,
        )
    checked = ", ".join(f"{c['gate']} {c['threshold']:g} ({c['source']})" for c in r["gates"]["checked"]) or "none"
    con.print(f"gates ({checked}): " + ("passed" if r["gates"]["passed"] else "FAILED: " + "; ".join(r["gates"]["failures"])), markup=False)
    for line in r["gates"].get("notes") or []:
        con.print(f"  note: {line}", markup=False)
