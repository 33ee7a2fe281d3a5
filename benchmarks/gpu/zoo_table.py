"""The zoo table from a `validate.sh zoo` work folder: one row per model with its build time, engine
size, precision error, chunking error, GPU ms per batch (p50 of the busiest profile) and gate verdict,
plus every failed step with the tail of its log. Prints markdown; writes W/zoo.json.

    python benchmarks/gpu/zoo_table.py W
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _fmt(value, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def row(work: Path, name: str, steps: dict, engine_tag: str = "fp16") -> dict:
    """One model's figures; engine_tag picks the engine (fp16, or best for the INT8 row)."""
    folder = work / name
    engine = _load(folder / f"{name}.{engine_tag}.engine.json")
    report = _load(folder / f"run_ref_{engine_tag}.json")
    worst = (report.get("precision_error") or {}).get("worst") or {}
    chunking = report.get("chunking_error") or {}
    gpu = None
    for group, stats in (report.get("latency") or {}).items():
        g = (stats or {}).get("gpu_compute") or {}
        if group != "all" and g.get("count") and (gpu is None or g["count"] > gpu[1]):  # the busiest profile
            gpu = (g.get("p50_ms"), g["count"], group)
    return {
        "model": name if engine_tag == "fp16" else f"{name} ({engine_tag})",
        "steps": {
            k: v.get("rc")
            for k, v in steps.items()
            if k.endswith("-" + name) and (f"-{engine_tag}-" in k or k.split("-")[0] in ("export", "clean"))
        },
        "build_s": engine.get("build_seconds"),
        "engine_mb": engine["engine_bytes"] / 2**20 if engine.get("engine_bytes") else None,
        "profiles": len(engine.get("profiles") or []),
        "precision": worst,
        "chunking": {
            k: chunking.get(k) for k in ("rel_l2", "cosine", "min_pooled_cosine", "pixel_agreement", "scope", "status") if k in chunking
        },
        "gpu_ms_p50": gpu[0] if gpu else None,
        "gpu_group": gpu[2] if gpu else None,
        "batch_size": (report.get("chunking") or {}).get("batch_size"),
        "gates": report.get("gates"),
    }


def main(work: Path) -> None:
    steps = {}
    for line in (work / "steps.jsonl").read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            steps[item["step"]] = item
    names = sorted(d.name for d in work.iterdir() if d.is_dir() and (d / f"{d.name}.clean.onnx.json").is_file())
    rows = [row(work, n, steps) for n in names]
    if "build-best-bert-base" in steps:
        rows.append(row(work, "bert-base", steps, "best"))
    print(
        "| model | steps (rc) | build s | engine MB | profiles | precision rel-L2 / cos / top-1 / pixel | chunking | GPU ms/batch (p50) | gates |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["precision"]
        prec = " / ".join(
            _fmt(p.get(k), f) for k, f in (("rel_l2", ".2e"), ("cosine", ".5f"), ("top1_agreement", ".3f"), ("pixel_agreement", ".4f"))
        )
        chunk = ", ".join(f"{k} {_fmt(v, '.4g') if isinstance(v, float) else v}" for k, v in r["chunking"].items()) or "-"
        gates = r["gates"] or {}
        verdict = "passed" if gates.get("passed") else ("; ".join(gates.get("failures") or []) or "-")
        steps_s = " ".join(f"{k.split('-')[0]}={v}" for k, v in r["steps"].items())
        print(
            f"| {r['model']} | {steps_s} | {_fmt(r['build_s'], '.1f')} | {_fmt(r['engine_mb'], '.1f')} | {r['profiles']} | {prec} | "
            f"{chunk} | {_fmt(r['gpu_ms_p50'], '.3f')} (batch {r['batch_size']}, {r['gpu_group']}) | {verdict} |"
        )
    failed = [s for s in steps.values() if s.get("rc") not in (0, None)]
    for s in failed:
        print(f"\n### {s['step']} rc={s['rc']} ({s.get('seconds')} s)\n`{s.get('cmd')}`\n```\n{s.get('tail', '')[-1200:]}\n```")
    (work / "zoo.json").write_text(json.dumps({"rows": rows, "steps": steps}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
