"""`trtforge pipeline`: export -> clean -> calibrate -> build -> run from one config, skipping what is done.

Each step's output sidecar records a fingerprint: the content hashes of the step's inputs, its config
section and the trtforge version, and the content hash of every file the step wrote. A step whose
outputs exist with a matching fingerprint and still hold the bytes it wrote is skipped, so a second
run of an unchanged pipeline only hashes files; an output edited, truncated or replaced since makes
the step run again, and the log says which file. A gate failure (exit 1) is recorded and
the later steps still run; bad input (exit 2) stops the pipeline, since later steps need the output.

On a machine without a GPU the engine is built ahead of time with TensorRT-RTX and `run` checks the
ONNX the engine was built from on ONNX Runtime (the report says so); with TensorRT and a GPU, `run`
executes the engine.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trtforge import __version__
from trtforge.core.artifacts import (
    content_mismatch,
    content_sha256,
    output_lock,
    read_sidecar,
    refuse_overwrite,
    sha256_file,
    write_json_atomic,
    write_sidecar,
)
from trtforge.core.config import ModelConfig
from trtforge.core.errors import GateFailed, TrtforgeError, UserError

STEPS = ("export", "clean", "calibrate", "build", "run")


@dataclass
class StepResult:
    step: str
    status: str  # ran | skipped | gate-failed | error | not-run
    seconds: float = 0.0
    exit_code: int = 0
    outputs: list[str] = field(default_factory=list)
    detail: str = ""


def fingerprint(*parts: Any) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _folder_hash(folder: str | None) -> str | None:
    if not folder:
        return None
    from trtforge.calibrate.data import scan

    path = Path(folder)
    return scan(path).manifest_hash if path.is_dir() else (sha256_file(path) if path.is_file() else None)


def _source_hash(cfg: ModelConfig) -> str:
    """What the exported graph depends on: the model source file (or the built-in's weights) and torch."""
    source = cfg.model.source
    path = Path(source.rpartition(":")[0] if ":" in source and source.rpartition(":")[0].endswith(".py") else source)
    if path.is_file():
        return sha256_file(path)
    if source == "minilm":
        from trtforge.models.minilm import model_dir

        weights = model_dir() / "model.safetensors"
        return f"{weights.stat().st_size}:{int(weights.stat().st_mtime)}"
    return source


class Pipeline:
    def __init__(self, cfg: ModelConfig, out_dir: Path, backend: str = "auto", log: Callable[[str], None] = lambda _: None):
        self.cfg, self.out, self.backend, self.log = cfg, Path(out_dir), backend, log
        name = cfg.name
        self.paths = {
            "onnx": self.out / f"{name}.onnx",
            "clean": self.out / f"{name}.clean.onnx",
            "int8": self.out / f"{name}.int8.onnx",
            "cache": self.out / f"{name}.calib.cache",
            "engine": self.out / f"{name}.{cfg.build.precision}.engine",
            "run": self.out / f"{name}.run.json",
            "report": self.out / f"{name}.pipeline.json",
        }

    # -- fingerprints of each step's inputs ----------------------------------------------------
    def _fp(self, step: str) -> str:
        c, p = self.cfg, self.paths
        if step == "export":
            return fingerprint(
                __version__,
                c.model.model_dump(),
                [i.model_dump() for i in c.inputs],
                {k: v.model_dump() for k, v in c.axes.items()},
                [o.model_dump() for o in c.outputs],
                c.export.model_dump(),
                _source_hash(c),
                _torch(),
            )
        if step == "clean":
            return fingerprint(__version__, sha256_file(p["onnx"]), c.clean.model_dump())
        if step == "calibrate":
            return fingerprint(
                __version__,
                sha256_file(p["clean"]),
                c.calibrate.model_dump(),
                _folder_hash(c.calibrate.data),
                _folder_hash(c.calibrate.eval_data),
            )
        if step == "build":
            src = p["int8"] if c.build.precision in ("int8", "best") else p["clean"]
            # the fp16 magnitudes and FP8 scales come from build.calib_data's files, else from the calibration cache's
            # data (calibrate.data): other files, another engine
            return fingerprint(
                __version__,
                sha256_file(src),
                c.build.model_dump(),
                self.backend,
                _folder_hash(c.build.calib_data),
                _folder_hash(c.calibrate.data),
            )
        if step == "run":
            return fingerprint(
                __version__,
                sha256_file(p["engine"]),
                sha256_file(p["clean"]),
                c.run.model_dump(),
                _folder_hash(c.run.inputs),
                _engine_runs_here(),
            )
        raise ValueError(step)

    def _outputs(self, step: str) -> list[Path]:
        p = self.paths
        return {
            "export": [p["onnx"]],
            "clean": [p["clean"]],
            "calibrate": [p["int8"], p["cache"]],
            "build": [p["engine"]],
            "run": [p["run"]],
        }[step]

    def _up_to_date(self, step: str, fp: str) -> tuple[bool, str]:
        """(whether the step can be skipped, why not): its outputs exist, its fingerprint matches and every output
        holds the bytes recorded when the step wrote it."""
        marker = self._outputs(step)[0]
        if not all(o.exists() for o in self._outputs(step)):
            return False, ""
        try:
            side = read_sidecar(marker, required=False) or {}
        except UserError as exc:
            return False, str(exc).rstrip(".")
        if side.get("pipeline_fingerprint") != fp:
            return False, ""
        recorded = side.get("pipeline_outputs_sha256") or {}
        for output in self._outputs(step):
            why = content_mismatch(output, recorded.get(output.name))
            if why:
                return False, why
        return True, ""

    def _stamp(self, step: str, fp: str) -> None:
        marker = self._outputs(step)[0]
        side = read_sidecar(marker, required=False) or {}
        side["pipeline_fingerprint"] = fp
        side["pipeline_outputs_sha256"] = {o.name: content_sha256(o) for o in self._outputs(step)}
        write_sidecar(marker, side)

    # -- the steps -----------------------------------------------------------------------------
    def _export(self) -> str:
        from trtforge.export.step import export_model

        result = export_model(self.cfg, self.paths["onnx"])
        return f"{len(result.checks)} axis checks passed"

    def _clean(self) -> str:
        from trtforge.graph.index import clean_file

        result = clean_file(self.paths["onnx"], self.paths["clean"], self.cfg.clean.fold_size_limit_mb, self.cfg.clean.tolerance)
        return f"{result.before.nodes} -> {result.after.nodes} nodes, rel-L2 {max(result.rel_l2.values()):.1e}"

    def _calibrate(self) -> str:
        from trtforge.calibrate.options import gate_failures, options_from_section
        from trtforge.calibrate.step import calibrate

        options = options_from_section(self.cfg.calibrate, output=self.paths["int8"])
        # An int8/best build step re-checks its own engine with the same gate: one engine build, not two.
        if self.cfg.build.precision in ("int8", "best"):
            options.engine_check, options.engine_check_off = False, "the pipeline's int8/best build step re-checks its engine"
        result = calibrate(self.paths["clean"], options, progress=self.log)
        acc = result.sidecar["accuracy"] or {}
        check = result.sidecar.get("engine_check") or {}
        detail = (
            f"mean cosine {acc.get('mean_cosine', float('nan')):.4f}, INT8 GEMM FLOPs "
            f"{result.sidecar['int8_gemm_flops_fraction']:.1%} ({result.reason}); engine re-check {check.get('status')}"
            + (f" ({check.get('reason')})" if check.get("status") == "skipped" else "")
        )
        failures = gate_failures(result.sidecar, options)
        if failures:
            raise GateFailed("; ".join(failures))
        return detail

    def _build(self) -> str:
        from trtforge.build.step import build, options_from_config

        b = self.cfg.build
        src = self.paths["int8"] if b.precision in ("int8", "best") else self.paths["clean"]
        options = options_from_config(b)
        from trtforge.core import ui

        with ui.build_progress(f"building {src.name}") as tick:
            result = build(
                src,
                self.paths["engine"],
                b.precision,
                None,
                b.tiers,
                self.backend,
                options,
                on_tick=tick,
                tick_s=ui.heartbeat_interval(),
                warn=ui.warn,
            )
        check = result.sidecar.get("engine_check") or {}
        if check.get("status") == "failed":
            raise GateFailed("; ".join(check["failures"]))
        recheck = f", engine re-check {check['status']}" if check else ""
        return f"{result.sidecar['backend']} {result.sidecar['tensorrt_version']}, {len(result.profiles)} profiles, {result.sidecar['build_seconds']:.1f} s{recheck}"

    def _run(self) -> str:
        from trtforge.runtime.options import options_from_section
        from trtforge.runtime.step import run

        r = self.cfg.run
        if not r.inputs:
            raise UserError(f"config key 'run.inputs' of '{self.cfg.name}' is not set; give the inputs to run.")
        target, note = self.paths["engine"], ""
        if not _engine_runs_here():
            side = read_sidecar(self.paths["engine"]) or {}
            target = Path(side.get("built_onnx") or self.paths["clean"])
            note = f" (engine not executable here: ran {target.name} on ONNX Runtime)"
        options = options_from_section(
            r,
            reference=self.paths["clean"],
            report=self.paths["run"],
            tokenizer=Path(self.cfg.model.tokenizer) if self.cfg.model.tokenizer else None,
        )
        report = run(target, options, progress=self.log)
        precision = report["precision_error"]
        measured = f"precision rel-L2 {precision['worst']['rel_l2']:.2e}" if precision["measured"] else f"precision {precision['reason']}"
        detail = f"{measured}, {report['throughput']['tokens_per_s']:.0f} {report['throughput']['unit']}/s{note}"
        if not report["gates"]["passed"]:
            raise GateFailed("; ".join(report["gates"]["failures"]))
        return detail

    # -- driver ----------------------------------------------------------------------------------
    def execute(self, from_step: str | None = None, only: str | None = None) -> dict[str, Any]:
        for name, value in (("--from", from_step), ("--only", only)):
            if value is not None and value not in STEPS:
                raise UserError(f"{name} '{value}' is not a step; use one of {', '.join(STEPS)}.")
        chosen = [only] if only else list(STEPS[STEPS.index(from_step) :] if from_step else STEPS)
        if "build" in chosen:  # a build section that contradicts itself fails now, not after export and calibrate
            from trtforge.build.step import check_options, options_from_config

            check_options(options_from_config(self.cfg.build), self.cfg.build.precision)
        self._refuse_overwrite()
        # Two pipelines on one out-dir would interleave their steps' files: the second waits for the first.
        with output_lock(self.paths["report"], waiting=self.log):
            return self._execute(chosen, from_step, only)

    def _execute(self, chosen: list[str], from_step: str | None, only: str | None) -> dict[str, Any]:
        start = time.perf_counter()
        results: list[StepResult] = []
        stopped = False
        for step in STEPS:
            if step not in chosen or stopped:
                results.append(StepResult(step, "not-run"))
                continue
            t = time.perf_counter()
            try:
                fp = self._fp(step)
                forced = step == only or step == from_step
                current, why = (False, "") if forced else self._up_to_date(step, fp)
                if current:
                    results.append(
                        StepResult(
                            step,
                            "skipped",
                            time.perf_counter() - t,
                            0,
                            [str(o) for o in self._outputs(step)],
                            "inputs and options unchanged",
                        )
                    )
                    self.log(f"{step}: skipped (inputs and options unchanged)")
                    continue
                self.log(f"{step}: running" + (f" again: {why}" if why else ""))
                detail = getattr(self, f"_{step}")() + (f" (ran again: {why})" if why else "")
                self._stamp(step, fp)
                results.append(StepResult(step, "ran", time.perf_counter() - t, 0, [str(o) for o in self._outputs(step)], detail))
            except GateFailed as exc:
                self._stamp_failed(step)
                results.append(StepResult(step, "gate-failed", time.perf_counter() - t, 1, [], str(exc)))
            except FileNotFoundError as exc:
                results.append(
                    StepResult(
                        step,
                        "error",
                        time.perf_counter() - t,
                        2,
                        [],
                        f"{exc.filename} is missing; run the earlier steps (drop --only/--from).",
                    )
                )
                stopped = True
            except TrtforgeError as exc:
                results.append(StepResult(step, "error", time.perf_counter() - t, exc.exit_code, [], str(exc)))
                stopped = True
        codes = [r.exit_code for r in results]
        exit_code = 2 if 2 in codes else (1 if 1 in codes else 0)
        report = {
            "schema": "trtforge.pipeline/1",
            "trtforge_version": __version__,
            "config": self.cfg.name,
            "seconds": time.perf_counter() - start,
            "exit_code": exit_code,
            "steps": [vars(r) for r in results],
        }
        write_json_atomic(self.paths["report"], report)
        return report

    def _refuse_overwrite(self) -> None:
        """Before any step: none of the pipeline's files is a file the config names as an input (each step checks its
        own files again)."""
        c, p = self.cfg, self.paths
        source = c.model.source.rpartition(":")[0] if ".py:" in c.model.source else c.model.source
        inputs = [
            Path(source) if Path(source).exists() else None,
            c.model.tokenizer,
            c.calibrate.data,
            c.calibrate.eval_data,
            c.build.calib_data,
            c.run.inputs,
        ]
        refuse_overwrite("pipeline", inputs, [p["onnx"], p["clean"], p["int8"], p["cache"], p["engine"]], [p["run"], p["report"]])

    def _stamp_failed(self, step: str) -> None:
        """A step that failed its gate is never skipped next time: drop any old fingerprint."""
        marker = self._outputs(step)[0]
        side = read_sidecar(marker, required=False) if marker.exists() else None
        if side and "pipeline_fingerprint" in side:
            del side["pipeline_fingerprint"]
            write_sidecar(marker, side)


def _torch() -> str | None:
    """torch's version from its metadata (importing torch would cost a second on every skip check)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def _engine_runs_here() -> bool:
    """A GPU and a TensorRT flavour that runs engines on it (TensorRT-RTX too, where it supports the GPU)."""
    from trtforge.core.platform import engine_flavour_here

    return engine_flavour_here() is not None
