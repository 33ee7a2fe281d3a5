"""`trtforge compare TARGET REFERENCE --inputs DIR`: a target's outputs against a reference's on the same inputs.

TARGET is an ONNX (ONNX Runtime: an fp16 or Q/DQ copy of the fp32 REFERENCE, say) or an engine (only where an engine
can execute: TensorRT on a GPU). Inputs come from the readers `calibrate` uses (npz/npy folders, images, text through
the reference's own tokenizer), whole, one sample a batch. Every output goes through the one comparator
(verify/compare.py) with its declared kind and its tolerance (--atol/--rtol, on the --error-stat statistic); outputs
without a tolerance are judged by the gates: those set (--max-rel-l2, --min-cosine; they judge every output), else the
defaults of the target's precision (verify/gates.py), which the report names.

Layer-wise (--layerwise): every intermediate tensor both graphs produce under the same name (an fp16
copy adds Casts, a Q/DQ copy adds Q/DQ pairs, a cleaned copy folds constants: those names are in one graph only) is
marked as a graph output of a copy of each model, both run on ONNX Runtime with the same inputs, and each pair goes
through the same comparator, in the reference's topological order. Skipped: tensors shape inference types as
non-float, tensors whose values differ in dtype kind or shape between the two, and tensors whose reference proves
nothing (constant, all zeros, NaN/Inf there: shape arithmetic, an all-ones mask's bias).

The first tensor whose error jumps (the rule): the first tensor, in the reference's topological order, whose target
values hold NaN/Inf or whose metrics miss a layer gate (rel-L2 above max_rel_l2, cosine below min_cosine; a NaN
metric misses it). Every tensor before it is within the gates, so it is where the error crosses them; its `growth`
(its rel-L2 over the largest rel-L2 of its compared inputs) tells a jump made there from error carried in. The layer
gates are the output gates (set, else the target precision's defaults) even where the outputs have tolerances,
which name outputs only. Layer-wise is a diagnosis: the exit code follows the outputs' check, and a tensor over the
gates while the outputs pass is reported, not failed.

On an engine target, layer-wise rebuilds: TensorRT fuses layers, so the ONNX the engine was built from is built
again with the shared tensors marked as outputs (engine_layerwise), and that twin runs the samples.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core.artifacts import declared_output_kinds, linked_path, read_sidecar, refuse_overwrite, write_json_atomic, write_sidecar
from trtforge.core.errors import UserError, exception_summary
from trtforge.core.onnxio import PROTOBUF_LIMIT, load_onnx, save_onnx
from trtforge.graph.index import expose_tensors, float_tensor_types, io_specs, toposorted
from trtforge.runtime.outputs import declared_boxes
from trtforge.runtime.report import target_precision
from trtforge.verify.boxes import BoxSpec
from trtforge.verify.compare import Comparator
from trtforge.verify.gates import GATES, Gate, evaluate_gates, gate_notes, gates_from, passes
from trtforge.verify.tolerances import Tolerance, check_statistic, parse_tolerances, tolerances_for

SCHEMA = "trtforge.compare/1"
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
_ORT_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}
METRIC_LABELS = {"rel_l2": "rel-L2", "cosine": "cosine"}  # what an intermediate tensor (no declared kind) is gated on
LAYER_METRICS = tuple(METRIC_LABELS)


@dataclass
class CompareOptions:
    inputs: Path
    atol: list[str] = field(default_factory=list)  # NAME:VALUE or VALUE
    rtol: list[str] = field(default_factory=list)
    error_stat: str | None = None  # elemwise (the default with a tolerance), max, mean, median, qNN
    max_rel_l2: float | None = None
    min_cosine: float | None = None
    layerwise: bool = False
    max_samples: int | None = None
    report: Path | None = None


@dataclass
class EngineAccess:
    """How an engine target executes: (can one execute here, why not) and engine + sidecar -> a runner. The defaults
    are the TensorRT runtime's (calibrate/engine_check.py); tests inject a fake."""

    available: Callable[[], tuple[bool, str]]
    runner: Callable[[Path, dict[str, Any]], Any]


def default_engine_access() -> EngineAccess:
    from trtforge.calibrate.engine_check import runtime_here

    return EngineAccess(runtime_here, trt_runner)


def trt_runner(engine: Path, sidecar: dict[str, Any]) -> Any:
    """The TensorRT runtime's runner for an engine built for this runtime and GPU (else one sentence, build.py)."""
    from trtforge.backends.engine_layers import runtime_identity
    from trtforge.backends.tensorrt import load_trt
    from trtforge.backends.tensorrt_runtime import TrtRunner
    from trtforge.build.engine_record import check_engine_compat

    mod = load_trt(sidecar.get("backend", "auto"))
    check_engine_compat(engine, sidecar, runtime_identity(mod))
    return TrtRunner(mod, engine, sidecar, cuda_graphs=False)


def check_options(options: CompareOptions) -> tuple[dict[str | None, float], dict[str | None, float], str]:
    """The parsed --atol and --rtol tables and the statistic; one sentence for any bad value."""
    atol, rtol = parse_tolerances(options.atol, "--atol"), parse_tolerances(options.rtol, "--rtol")
    if options.error_stat is not None and not (atol or rtol):
        raise UserError(f"--error-stat {options.error_stat} needs a tolerance to apply to; add --atol or --rtol.")
    statistic = check_statistic(options.error_stat or "elemwise")
    if options.max_rel_l2 is not None and not (np.isfinite(options.max_rel_l2) and options.max_rel_l2 >= 0):
        raise UserError(f"--max-rel-l2 {options.max_rel_l2:g} is not a finite number >= 0; e.g. --max-rel-l2 1e-3.")
    if options.min_cosine is not None and not (-1.0 <= options.min_cosine <= 1.0):
        raise UserError(f"--min-cosine {options.min_cosine:g} is outside [-1, 1], where cosines lie; e.g. --min-cosine 0.99.")
    if options.max_samples is not None and options.max_samples < 1:
        raise UserError(f"--max-samples {options.max_samples} must be at least 1.")
    return atol, rtol, statistic


def load_inputs(reference: Path, model: onnx.ModelProto, folder: Path, max_samples: int | None) -> tuple[list[dict[str, np.ndarray]], str]:
    """The samples of `folder` as `calibrate` reads them (the reference's input specs and tokenizer), and their kind."""
    from trtforge.calibrate import data as data_mod
    from trtforge.calibrate.data import max_sample_length, tokenizer_factory

    specs, axes, _ = io_specs(reference, model)
    dataset, samples = data_mod.load_samples(folder, specs, tokenizer_factory(reference), max_sample_length(specs, axes), max_samples)
    if not samples:
        raise UserError(f"{folder} holds no samples; add inputs.")
    return samples, dataset.kind


class _OnnxTarget:
    """An ONNX target on ONNX Runtime; float feeds are cast to the type its inputs declare (fp16 I/O models)."""

    def __init__(self, model: str | Path | bytes):
        self.runner = OrtRunner(model)
        self.input_names, self.output_names = self.runner.input_names, self.runner.output_names
        self.dtypes = {i.name: _ORT_FLOATS[i.type] for i in self.runner.session.get_inputs() if i.type in _ORT_FLOATS}

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        cast = {k: (v.astype(self.dtypes[k]) if k in self.dtypes and v.dtype.kind == "f" else v) for k, v in feeds.items()}
        return self.runner.run(cast, outputs)

    def close(self) -> None:
        pass


def open_target(target: Path, access: EngineAccess | None) -> tuple[Any, dict[str, Any] | None]:
    """(a runner for the target, the engine's sidecar or None); an engine only where one can execute."""
    if target.suffix == ".onnx":
        load_onnx(target, load_external_data=False)  # a missing or unreadable file: one sentence
        return _OnnxTarget(target), None
    from trtforge.build.engine_record import read_engine_sidecar

    sidecar = read_engine_sidecar(target, verify=True)
    access = access or default_engine_access()
    ok, why = access.available()
    if not ok:
        raise UserError(
            f"{target.name} is an engine and no TensorRT engine can execute on this machine ({why}); compare its "
            f"ONNX ({sidecar.get('built_onnx') or sidecar.get('source_onnx')}) here, or run this on a GPU machine."
        )
    return access.runner(target, sidecar), sidecar


def run_sample(runner: Any, feeds: dict[str, np.ndarray], what: str, index: int, outputs: list[str] | None = None) -> dict[str, np.ndarray]:
    """One sample through a runner; a runtime's failure (a shape or value the model does not take) is one sentence."""
    try:
        return runner.run(feeds, outputs) if outputs is not None else runner.run(feeds)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"{what} failed on input sample {index} ({exception_summary(exc, 300)}); check that the inputs "
            "fit the model (names, shapes, value ranges)."
        ) from None


def check_io(target: Any, reference: OrtRunner, target_path: Path, reference_path: Path) -> None:
    if sorted(target.input_names) != sorted(reference.input_names):
        raise UserError(
            f"{target_path.name} takes inputs {sorted(target.input_names)} but {reference_path.name} takes "
            f"{sorted(reference.input_names)}; compare two versions of the same model."
        )
    missing = [n for n in reference.output_names if n not in target.output_names]
    if missing:
        raise UserError(
            f"{target_path.name} has no output '{missing[0]}' of {reference_path.name} (it has "
            f"{', '.join(target.output_names)}); compare two versions of the same model."
        )


def _declared(target: Path, reference: Path, read: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """What the outputs' declarations say: the reference's sidecar over an ONNX target's (an engine's declares none)."""
    return {**(read(target) if target.suffix == ".onnx" else {}), **read(reference)}


def output_boxes(target: Path, reference: Path, kinds: dict[str, str | None]) -> dict[str, BoxSpec]:
    """Each declared boxes output's BoxSpec, so that boxes are matched by IoU as `run` matches them, not compared as
    plain numbers."""
    declared = _declared(target, reference, lambda path: declared_boxes((read_sidecar(path, required=False) or {}).get("outputs")))
    return {name: spec for name, spec in declared.items() if kinds.get(name) == "boxes"}


def output_kinds(target: Path, reference: Path, names: list[str]) -> dict[str, str | None]:
    """Each reference output's declared kind; None where undeclared."""
    declared = _declared(target, reference, declared_output_kinds)
    return {name: declared.get(name) for name in names}


def judge(
    per_output: dict[str, dict[str, Any]],
    kinds: dict[str, str | None],
    tolerances: dict[str, Tolerance],
    values: dict[str, float | None],
    precision: str,
    boxes: bool = False,
) -> dict[str, Any]:
    """The outputs' verdict: NaN/Inf screen and tolerances on every output, the gates set on every output, and the
    precision's default gates on the outputs without a tolerance (with `boxes`, the box defaults too).
    {precision, passed, failures, checked, notes}."""
    gates = gates_from(values, precision, boxes=boxes)
    set_gates = [g for g in gates if g.source == "set"]
    defaults = [g for g in gates if g.source != "set"]

    def section(outputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return {"precision_error": {"measured": True, "per_output": outputs}, "outputs": {n: {"kind": kinds.get(n)} for n in outputs}}

    verdict = evaluate_gates(section(per_output), set_gates + ([] if tolerances else defaults), where="compare")
    untoleranced = {n: m for n, m in per_output.items() if n not in tolerances}
    if tolerances and defaults and untoleranced:
        rest = evaluate_gates(section(untoleranced), defaults, where="compare")
        for entry in rest["checked"]:
            entry["outputs"] = sorted(untoleranced)
        verdict["failures"] = list(dict.fromkeys(verdict["failures"] + rest["failures"]))
        verdict["checked"] += rest["checked"]
        verdict["passed"] = not verdict["failures"]
    notes = gate_notes(values, precision) if not tolerances else []
    return {"precision": precision, **verdict, **({"notes": notes} if notes else {})}


def layer_gates(values: dict[str, float | None], precision: str) -> list[Gate]:
    """The gates intermediate tensors are held to: those on rel-L2 and cosine, set or the precision's defaults."""
    return [g for g in gates_from(values, precision) if GATES[g.key].metric in LAYER_METRICS]


def over_gates(metrics: dict[str, Any], gates: list[Gate]) -> list[str]:
    """Why one tensor's comparison misses the layer gates (NaN/Inf in the target, a metric out of bounds or NaN)."""
    why = []
    if metrics.get("candidate_nonfinite"):
        why.append(f"{metrics['candidate_nonfinite']} NaN/Inf values of {metrics.get('values')}")
    for gate in gates:
        spec = GATES[gate.key]
        value = metrics.get(spec.metric)
        if value is not None and not passes(value, spec.bound, gate.threshold):
            label = METRIC_LABELS[spec.metric]
            why.append(
                f"{label} is NaN ({gate.key} {gate.threshold:g})"
                if value != value
                else f"{label} {value:.3g} {'>' if spec.bound == 'max' else '<'} {gate.threshold:g} ({gate.key})"
            )
    return why


def first_jump(rows: list[dict[str, Any]], gates: list[Gate]) -> dict[str, Any] | None:
    """The first row (rows in the reference's topological order) whose tensor misses the layer gates, with why; None
    when every tensor is within them. Pure: the module docstring states the rule."""
    for index, row in enumerate(rows):
        why = over_gates(row, gates)
        if why:
            return {
                "tensor": row["tensor"],
                "op": row["op"],
                "target_op": row.get("target_op", row["op"]),
                "node": row["node"],
                "index": index,
                "reasons": why,
                "rel_l2": row["rel_l2"],
                "growth": row.get("growth"),
            }
    return None


def growth_factors(rows: list[dict[str, Any]], inputs_of: dict[str, list[str]]) -> None:
    """Each row's `growth`: its rel-L2 over the largest rel-L2 among its node's inputs that were compared (None where
    none was, or where that largest is 0 or not finite: nothing to grow from)."""
    errors = {row["tensor"]: row["rel_l2"] for row in rows}
    for row in rows:
        carried = [errors[t] for t in inputs_of.get(row["tensor"], []) if t in errors]
        base = max(carried) if carried and all(e == e for e in carried) else None
        value = row["rel_l2"]
        row["growth"] = float(value / base) if base and np.isfinite(base) and value == value else None


def skip_counts(skipped: dict[str, str]) -> dict[str, int]:
    """How many tensors were skipped for each kind of reason (the reason up to its first '(' or ':')."""
    counts: dict[str, int] = {}
    for reason in skipped.values():
        key = reason.split(":")[0].split(" (")[0]
        counts[key] = counts.get(key, 0) + 1
    return counts


@dataclass
class _Layers:
    """The reference graph in topological order: each node output's producing op, node and that node's inputs."""

    order: list[str]
    op: dict[str, str]
    node: dict[str, str]
    inputs_of: dict[str, list[str]]


def _layers(model: onnx.ModelProto) -> _Layers:
    graph_inputs = {i.name for i in model.graph.input}
    order, op, node_of, inputs_of = [], {}, {}, {}
    for i, node in enumerate(toposorted(model).graph.node):
        for out in node.output:
            if out and out not in graph_inputs and out not in op:
                order.append(out)
                op[out], node_of[out] = node.op_type, node.name or f"{node.op_type}_{i}"
                inputs_of[out] = [t for t in node.input if t]
    return _Layers(order, op, node_of, inputs_of)


def _non_float(model: onnx.ModelProto) -> set[str]:
    """Tensors shape inference types as something other than a float (ids, shapes, masks); untyped ones are kept."""
    return {name for name, t in float_tensor_types(model).items() if t and t not in FLOAT_TYPES}


def _session_source(model: onnx.ModelProto, spill: Path) -> bytes | Path:
    """The model as bytes for ONNX Runtime, or, over protobuf's 2 GB, saved to `spill` with its weights beside it."""
    if model.ByteSize() <= PROTOBUF_LIMIT:
        return model.SerializeToString()
    return save_onnx(model, spill, external_data=True)


def _compare_tensors(
    reference: OrtRunner, target: Any, names: list[str], samples: list[dict[str, np.ndarray]], skipped: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """The comparator's metrics of every named tensor over the samples; a tensor that is no float or whose shapes differ
    goes to `skipped` with why."""
    comparator = Comparator({t: None for t in names})
    for i, feeds in enumerate(samples):
        live = [t for t in names if t not in skipped]
        r = run_sample(reference, feeds, "the reference with its tensors marked as outputs", i, live)
        c = run_sample(target, feeds, "the target with its tensors marked as outputs", i, live)
        for t in live:
            a, b = np.asarray(r[t]), np.asarray(c[t])
            if a.dtype.kind != "f" or b.dtype.kind != "f":
                skipped[t] = f"not a float tensor ({a.dtype} / {b.dtype})"
            elif a.shape != b.shape:
                skipped[t] = f"shapes differ (reference {list(a.shape)}, target {list(b.shape)})"
            else:
                comparator.add_output(t, a, b)
    with np.errstate(all="ignore"):  # a reference holding +-Inf (a mask's bias) has NaN metrics; it is skipped later
        return comparator.result()


@dataclass
class _Matched:
    """The tensors both graphs produce under one name, in the reference's topological order."""

    ref: _Layers
    target_ops: dict[str, str]
    matched: list[str]
    names: list[str]  # the float ones, to compare
    skipped: dict[str, str]


def _match(reference_model: onnx.ModelProto, target_model: onnx.ModelProto, progress: Callable[[str], None]) -> _Matched:
    ref = _layers(reference_model)
    target_ops = {o: n.op_type for n in target_model.graph.node for o in n.output if o}
    matched = [t for t in ref.order if t in target_ops]
    non_float = _non_float(reference_model) | _non_float(target_model)
    names = [t for t in matched if t not in non_float]
    progress(
        f"layer-wise: {len(matched)} tensors matched by name ({len(ref.order)} in the reference, "
        f"{len(target_ops)} in the target); comparing {len(names)} float tensors"
    )
    return _Matched(ref, target_ops, matched, names, {t: "not a float tensor" for t in matched if t in non_float})


def _layer_report(m: _Matched, per: dict[str, dict[str, Any]], gates: list[Gate]) -> dict[str, Any]:
    rows = []
    for t in m.names:
        if t in m.skipped or t not in per:
            continue
        metrics = per[t]
        if metrics["reference_problem"]:
            m.skipped[t] = f"the reference proves nothing there: {metrics['reference_problem']}"
            continue
        rows.append(
            {
                "tensor": t,
                "op": m.ref.op[t],
                "target_op": m.target_ops[t],
                "node": m.ref.node[t],
                "rel_l2": metrics["rel_l2"],
                "cosine": metrics["cosine"],
                "max_abs": metrics["max_abs"],
                "candidate_nonfinite": metrics["candidate_nonfinite"],
                "values": metrics["values"],
            }
        )
    growth_factors(rows, m.ref.inputs_of)
    jump = first_jump(rows, gates)
    for row in rows:
        row["status"] = "over gates" if over_gates(row, gates) else "ok"
    return {
        "matched": len(m.matched),
        "reference_tensors": len(m.ref.order),
        "target_tensors": len(m.target_ops),
        "compared": len(rows),
        "skipped": m.skipped,
        "skipped_counts": skip_counts(m.skipped),
        "gates": [{"gate": g.key, "threshold": g.threshold, "source": g.source} for g in gates],
        "rows": rows,
        "first_jump": jump,
    }


def layerwise(
    reference_model: onnx.ModelProto,
    target_model: onnx.ModelProto,
    samples: list[dict[str, np.ndarray]],
    gates: list[Gate],
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every tensor both graphs produce under one name, compared in the reference's topological order (module docstring)."""
    m = _match(reference_model, target_model, progress)
    with tempfile.TemporaryDirectory(prefix="trtforge-layerwise-") as scratch:
        spill = Path(scratch)
        ref_runner = OrtRunner(_session_source(expose_tensors(reference_model, m.names, typed=False), spill / "reference.onnx"))
        target_runner = _OnnxTarget(_session_source(expose_tensors(target_model, m.names, typed=False), spill / "target.onnx"))
        per = _compare_tensors(ref_runner, target_runner, m.names, samples, m.skipped)
    return _layer_report(m, per, gates)


class _EveryOutput:
    """An engine runner (which returns every output it has) behind the ONNX targets' run(feeds, outputs)."""

    def __init__(self, runner: Any):
        self.runner, self.input_names, self.output_names = runner, runner.input_names, runner.output_names

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        out = self.runner.run(feeds)
        return out if outputs is None else {k: out[k] for k in outputs}

    def close(self) -> None:
        close = getattr(self.runner, "close", None)
        if close:
            close()


def engine_layerwise(
    engine: Path,
    engine_sidecar: dict[str, Any],
    reference_model: onnx.ModelProto,
    samples: list[dict[str, np.ndarray]],
    gates: list[Gate],
    access: EngineAccess,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Layer-wise on an engine. TensorRT fuses layers, so an engine holds its intermediate tensors only when built to
    keep them: the ONNX the engine was built from gets every tensor it shares with the reference marked as a graph
    output and is built again, with the engine's precision and build options and one profile over the axes' ranges,
    and that engine runs the samples. Marking a tensor as an output keeps the fusions that would consume it from
    happening, so this engine is a diagnostic twin of the deployed one, not the same engine (as Polygraphy's
    `--trt-outputs mark all`); the report says so."""
    from trtforge.backends.tensorrt import BuildOptions
    from trtforge.build.engine_record import read_engine_sidecar
    from trtforge.build.step import build

    source = linked_path(engine, str(engine_sidecar.get("source_onnx") or ""))
    if not source.is_file():
        raise UserError(
            f"{engine.name}'s sidecar names {source} as the ONNX it was built from, which is not here; --layerwise "
            "rebuilds from it: put it back, or compare that ONNX layer-wise."
        )
    source_model = load_onnx(source)
    m = _match(reference_model, source_model, progress)
    fields = set(BuildOptions.__dataclass_fields__) - {"timing_cache"}
    options = BuildOptions(**{k: v for k, v in (engine_sidecar.get("build_options") or {}).items() if k in fields})
    with tempfile.TemporaryDirectory(prefix="trtforge-layerwise-engine-") as scratch:
        debug = Path(scratch) / source.name
        save_onnx(expose_tensors(source_model, m.names), debug)
        source_side = read_sidecar(source, required=False)
        if source_side:
            write_sidecar(debug, {**source_side, "parent": str(source)})
        progress(f"layer-wise: building {engine.name}'s ONNX again with {len(m.names)} tensors marked as outputs")
        built = build(
            debug,
            Path(scratch) / "layerwise.engine",
            precision=engine_sidecar.get("precision", "fp32"),
            backend=str(engine_sidecar.get("backend") or "auto"),
            options=options,
            engine_check=False,
        )
        runner = _EveryOutput(access.runner(built.engine_path, read_engine_sidecar(built.engine_path)))
        try:
            with tempfile.TemporaryDirectory(prefix="trtforge-layerwise-") as spill:
                ref_runner = OrtRunner(_session_source(expose_tensors(reference_model, m.names, typed=False), Path(spill) / "r.onnx"))
                per = _compare_tensors(ref_runner, runner, m.names, samples, m.skipped)
        finally:
            close = getattr(runner, "close", None)
            if close:
                close()
    report = _layer_report(m, per, gates)
    report["engine"] = (
        f"a twin of {engine.name} built from {source.name} with the compared tensors marked as outputs "
        "(fusions that would consume them are not applied)"
    )
    return report


def compare(
    target: Path,
    reference: Path,
    options: CompareOptions,
    access: EngineAccess | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """The comparison's report (schema trtforge.compare/1); `report["passed"]` is the outputs' verdict."""
    target, reference = Path(target), Path(reference)
    atol, rtol, statistic = check_options(options)
    if target.exists() and reference.exists() and os.path.samefile(target, reference):
        raise UserError(f"{target} is its own reference, so comparing it proves nothing; pass the model it was made from as REFERENCE.")
    refuse_overwrite("compare", [target, reference, options.inputs], files=[options.report])
    ref_model = load_onnx(reference, load_external_data=options.layerwise)  # weights only where a copy is run
    runner, engine_sidecar = open_target(target, access)
    try:
        ref_runner = OrtRunner(reference)
        check_io(runner, ref_runner, target, reference)
        kinds = output_kinds(target, reference, ref_runner.output_names)
        tolerances = tolerances_for(list(kinds), atol, rtol, statistic)
        samples, data_kind = load_inputs(reference, ref_model, Path(options.inputs), options.max_samples)
        progress(f"comparing {target.name} against {reference.name} on {len(samples)} samples of {options.inputs}")
        boxes = output_boxes(target, reference, kinds)
        comparator = Comparator(kinds, tolerances, boxes)
        for i, feeds in enumerate(samples):
            ref_out = run_sample(ref_runner, feeds, f"the reference {reference.name}", i)
            out = run_sample(runner, {k: v for k, v in feeds.items() if k in runner.input_names}, f"the target {target.name}", i)
            for name in kinds:
                if np.shape(ref_out[name]) != np.shape(out[name]):
                    raise UserError(
                        f"output '{name}' has shape {list(np.shape(out[name]))} in {target.name} but "
                        f"{list(np.shape(ref_out[name]))} in {reference.name} on sample {i}; compare two "
                        "versions of the same model."
                    )
            comparator.add(ref_out, {k: np.asarray(v) for k, v in out.items()}, feeds.get("attention_mask"))
    finally:
        close = getattr(runner, "close", None)
        if close:
            close()
    per_output = comparator.result()
    onnx_sidecar = None if engine_sidecar else read_sidecar(target, required=False)
    precision = target_precision(engine_sidecar, onnx_sidecar, None if engine_sidecar else target)
    values = {"max_rel_l2": options.max_rel_l2, "min_cosine": options.min_cosine}
    gates = judge(per_output, kinds, tolerances, values, precision, boxes=bool(boxes))
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "target": str(target),
        "target_kind": "engine" if engine_sidecar else "onnx",
        "reference": str(reference),
        "inputs": {"path": str(options.inputs), "kind": data_kind, "samples": len(samples)},
        "precision": precision,
        "outputs": {n: {"kind": k} for n, k in kinds.items()},
        "tolerances": {n: {"atol": t.atol, "rtol": t.rtol, "statistic": t.statistic} for n, t in tolerances.items()},
        "per_output": per_output,
        "gates": gates,
        "passed": gates["passed"],
    }
    if options.layerwise and engine_sidecar is not None:
        report["layerwise"] = engine_layerwise(
            target, engine_sidecar, ref_model, samples, layer_gates(values, precision), access or default_engine_access(), progress
        )
    elif options.layerwise:
        report["layerwise"] = layerwise(ref_model, load_onnx(target), samples, layer_gates(values, precision), progress)
    if options.report:
        write_json_atomic(options.report, report)
    return report
