"""`trtforge run --stateful`: exact chunked prefill and greedy decode on a KV-cache model (kvcache.py).

Each input is fed chunk by chunk; chunk k attends to the cache of chunks 0..k-1, so the result equals
one full pass up to float rounding (unlike overlap windows, which lose the context before the window).
The cache stays where the runtime keeps it between steps:
- TensorRT: two device buffers per cache tensor, each sized at the engine's largest past + seq; step k
  reads past from buffer k % 2 and writes present into the other (present of one step *is* the past of
  the next, no copy and no host round trip). Only token ids go up and logits come down.
- ONNX Runtime: IOBinding; the present OrtValues of a step are bound as the next step's past inputs.
Checked against one full pass (past 0) over the whole input: the chunking error. `--generate N`
greedy-decodes N tokens with the cache and checks them against a full recompute: by causality, one
full pass over prompt + generated tokens gives at every position the argmax a recompute from scratch
would give there, so token k is checked against argmax(full pass)[len(prompt) + k - 1].
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trtforge import __version__
from trtforge.core.artifacts import read_sidecar, refuse_overwrite, write_json_atomic
from trtforge.core.errors import UserError
from trtforge.runtime.stateful_inputs import load_token_docs, tokenizer_encoder
from trtforge.runtime.steppers import OrtStepper, TrtStepper, cache_plan

SCHEMA = "trtforge.stateful/1"


@dataclass
class StatefulOptions:
    inputs: Path
    chunk: int = 128
    generate: int = 0
    reference: Path | None = None  # the full pass runs here (ONNX or engine); default: the target itself
    backend: str = "auto"
    providers: list[str] = field(default_factory=list)
    max_rel_l2: float | None = None  # chunking gate; default 1e-4 on ONNX Runtime (fp32), 1e-2 on engines
    report: Path | None = None
    max_tokens: int | None = None  # cut inputs to this many tokens (benchmarks)
    measure_memory: bool = True


# -- planning (pure) -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    phase: str  # prefill | decode
    start: int  # first position of the step
    end: int  # one past its last position
    profile: int | None = None

    @property
    def past(self) -> int:
        return self.start

    @property
    def seq(self) -> int:
        return self.end - self.start


def plan_steps(
    length: int, chunk: int, generate: int = 0, choose: Callable[[str, int, int], int | None] = lambda phase, seq, past: None
) -> list[Step]:
    """Prefill chunks [0, c), [c, 2c), ... then `generate` decode steps of one token each; `choose`
    picks (or refuses, raising UserError) the profile of each step from its phase, seq and past."""
    if chunk < 1:
        raise UserError(f"--chunk must be >= 1, got {chunk}.")
    if length < 1:
        raise UserError("an input holds no tokens; give non-empty texts.")
    steps = []
    for start in range(0, length, chunk):
        end = min(length, start + chunk)
        steps.append(Step("prefill", start, end, choose("prefill", end - start, start)))
    for k in range(max(0, generate - 1)):  # the first generated token comes from the prefill's last logits
        steps.append(Step("decode", length + k, length + k + 1, choose("decode", 1, length + k)))
    return steps


# -- memory ----------------------------------------------------------------------------------------


class RssPeak:
    """Peak resident memory above the level at entry, sampled every ms in a thread (ONNX Runtime
    releases the GIL while it runs); ru_maxrss cannot do this, it never goes down."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak = 0

    def _rss(self) -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * self.page

    def __enter__(self) -> "RssPeak":
        self.base = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss() - self.base)
            self._stop.wait(0.001)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss() - self.base)


# -- runtimes --------------------------------------------------------------------------------------


@dataclass
class _Target:
    path: Path
    kind: str  # onnx | engine
    sidecar: dict[str, Any] | None
    kv: dict[str, Any]
    export_side: dict[str, Any]
    export_path: Path
    profiles: list[Any]
    phases: dict[str, Any]
    where: str


def _resolve(path: Path) -> _Target:
    """The target with its cache metadata and the profiles that govern it (the engine's, or for an
    ONNX the ones its export config plans), or the one-sentence error for a model without a cache."""
    from trtforge.build.kv_profiles import plan_kv_profiles
    from trtforge.build.profiles import profiles_from_json
    from trtforge.core.config import AxisRange, InputSpec
    from trtforge.export.kvcache import kv_axes, kv_meta

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist; pass an ONNX from `trtforge export --kv-cache` or an engine built from it.")
    side = read_sidecar(path, required=False)
    kind = "engine" if (side or {}).get("kind") == "engine" or path.suffix in (".engine", ".plan") else "onnx"
    kv, export_side, export_path = kv_meta(path, side)
    if kv is None:
        raise UserError(
            f"{path.name} has no cache inputs (past_key_<i>/past_value_<i>); --stateful needs a model exported "
            "with `trtforge export --kv-cache`."
        )
    assert export_side is not None and export_path is not None
    if kind == "engine":
        if not (side or {}).get("phases"):
            raise UserError(f"{path.name} was built without prefill/decode profiles; rebuild it with this trtforge's `trtforge build`.")
        return _Target(
            path, kind, side, kv, export_side, export_path, profiles_from_json(side["profiles"]), side["phases"], f"engine {path.name}"
        )
    specs = [InputSpec(**s) for s in export_side["inputs"]]
    axes = kv_axes({k: AxisRange(**v) for k, v in export_side["axes"].items()}, kv)
    from trtforge.build.profiles import tier_ranges

    tiers = {a: tier_ranges(list(b), axes[a], a) for a, b in kv["tiers"].items()}
    profiles, phases = plan_kv_profiles(specs, axes, tiers, kv)
    return _Target(path, kind, side, kv, export_side, export_path, profiles, phases, f"the export of {path.name}")


def _stepper(target: _Target, options: StatefulOptions) -> Any:
    if target.kind == "onnx":
        return OrtStepper(target.path, target.kv["layout"], options.providers)
    from trtforge.backends.engine_layers import runtime_identity
    from trtforge.backends.tensorrt import load_trt
    from trtforge.build.engine_record import check_engine_compat, read_engine_sidecar

    mod = load_trt(options.backend)
    side = read_engine_sidecar(target.path, verify=True)
    check_engine_compat(target.path, side, runtime_identity(mod))
    return TrtStepper(mod, target.path, side, target.kv["layout"])


def run_stateful(target_path: Path, options: StatefulOptions, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    start_all = time.perf_counter()
    refuse_overwrite("run", [target_path, options.reference, options.inputs], files=[options.report])
    target = _resolve(target_path)
    layout = target.kv["layout"]
    kind = "logits" if layout["output"] == "logits" else None
    if options.generate and layout["output"] != "logits":
        raise UserError(f"--generate needs a model with a logits output; {target.path.name} returns {layout['output']}.")
    reference = _resolve(options.reference) if options.reference else target
    encode = tokenizer_encoder(target.export_side, target.export_path)
    docs = load_token_docs(options.inputs, encode, options.max_tokens)
    plans, full_profiles = _plan_inputs(docs, target, reference, options)

    stepper = _stepper(target, options)
    chunked = _run_chunked(stepper, docs, plans, options, target.kind == "onnx" and options.measure_memory, progress)
    # The full pass: the reference (default: the target itself), one step with an empty cache.
    full_stepper = stepper if reference is target and target.kind == "onnx" else _stepper(reference, options)
    if full_stepper is stepper:
        full_stepper.reset()
    full = _run_full(full_stepper, reference, docs, full_profiles, chunked, kind, options)
    check = _check_chunking(docs, chunked, full, layout, reference, kind, target, options)
    report = _stateful_report(target, stepper, options, chunked, full, check)
    report["seconds"] = time.perf_counter() - start_all
    if options.report:
        write_json_atomic(options.report, report)
    return report


def _plan_inputs(
    docs: list[tuple[str, np.ndarray]], target: _Target, reference: _Target, options: StatefulOptions
) -> tuple[list[list[Step]], list[int | None]]:
    """Every input planned before anything runs (a bad input fails in one sentence, fast): the target's steps, and
    the reference engine's profile for the full pass (None on ONNX Runtime)."""
    from trtforge.build.kv_profiles import select_phase_profile

    layout = target.kv["layout"]

    def choose_for(t: _Target) -> Callable[[str, int, int], int]:
        return lambda phase, seq, past: (
            select_phase_profile(t.profiles, t.phases, phase, seq, past, where=t.where, engine=t.kind == "engine").index
        )

    plans = []
    for name, ids in docs:
        if ids.size + options.generate > layout["max_positions"]:
            raise UserError(
                f"input {name} plus --generate {options.generate} is {ids.size + options.generate} tokens, "
                f"beyond the model's {layout['max_positions']} positions; shorten it."
            )
        plans.append(plan_steps(int(ids.size), options.chunk, options.generate, choose_for(target)))
    full_profiles: list[int | None] = []
    for name, ids in docs:
        if reference.kind == "engine":
            full_profiles.append(
                select_phase_profile(
                    reference.profiles, reference.phases, "prefill", int(ids.size), 0, where=reference.where, engine=True
                ).index
            )
        else:
            full_profiles.append(None)
    return plans, full_profiles


@dataclass
class _ChunkedPass:
    """What the stateful pass gives the checks and the report: each input's entry and concatenated logits, tokens
    and seconds of prefill (per profile too) and decode, and the peak memory."""

    docs_out: list[dict[str, Any]] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)
    per_profile: dict[int, dict[str, float]] = field(default_factory=dict)
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    peak: int = 0

    def run_input(self, stepper: Any, name: str, ids: np.ndarray, steps: list[Step], generate: int) -> None:
        """One input chunk by chunk on a reset cache, then its greedy decode."""
        stepper.reset()
        parts, generated = [], []
        for step in steps:
            if step.phase == "prefill":
                t0 = time.perf_counter()
                out = stepper.step(ids[step.start : step.end], step.past, step.profile)
                dt = time.perf_counter() - t0
                parts.append(out)
                self.prefill_tokens += step.seq
                self.prefill_seconds += dt
                rec = self.per_profile.setdefault(step.profile, {"steps": 0, "tokens": 0, "seconds": 0.0})
                rec["steps"] += 1
                rec["tokens"] += step.seq
                rec["seconds"] += dt
            else:
                if not generated:
                    generated.append(int(parts[-1][-1].argmax()))
                t0 = time.perf_counter()
                out = stepper.step(np.asarray([generated[-1]], dtype=np.int64), step.past, step.profile)
                self.decode_seconds += time.perf_counter() - t0
                self.decode_tokens += 1
                generated.append(int(out[-1].argmax()))
        if generate and not generated:
            generated.append(int(parts[-1][-1].argmax()))
        self.logits.append(np.concatenate(parts, axis=0))
        self.docs_out.append(
            {"name": name, "tokens": int(ids.size), "chunks": sum(s.phase == "prefill" for s in steps), "generated": generated}
        )


def _run_chunked(
    stepper: Any,
    docs: list[tuple[str, np.ndarray]],
    plans: list[list[Step]],
    options: StatefulOptions,
    sample_rss: bool,
    progress: Callable[[str], None],
) -> _ChunkedPass:
    """Every input through the stepper chunk by chunk; the stepper is closed afterwards, failed or not."""
    chunked = _ChunkedPass()
    rss = RssPeak() if sample_rss else None
    try:
        with rss or _Null():
            for (name, ids), steps in zip(docs, plans):
                progress(f"stateful: {name}, {ids.size} tokens in {sum(s.phase == 'prefill' for s in steps)} chunks")
                chunked.run_input(stepper, name, ids, steps, options.generate)
        chunked.peak = rss.peak if rss else stepper.peak_bytes
    finally:
        stepper.close()
    return chunked


@dataclass
class _FullPass:
    """The full pass's logits paired with the stateful ones per input, the generation checks' matches, its tokens,
    seconds and peak memory."""

    per_doc: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    agreement: list[list[int]] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    peak: int = 0


def _run_full(
    full_stepper: Any,
    reference: _Target,
    docs: list[tuple[str, np.ndarray]],
    full_profiles: list[int | None],
    chunked: _ChunkedPass,
    kind: str | None,
    options: StatefulOptions,
) -> _FullPass:
    """One full pass per input on the reference, each input's chunking error written into its entry, then the
    generation check; the stepper is closed afterwards, failed or not."""
    from trtforge.verify.compare import compare_arrays

    rss_full = RssPeak() if reference.kind == "onnx" and options.measure_memory else None
    full_pass = _FullPass()
    try:
        with rss_full or _Null():
            for i, (name, ids) in enumerate(docs):
                t0 = time.perf_counter()
                full = full_stepper.full(ids, full_profiles[i]) if reference.kind == "engine" else full_stepper.full(ids)
                full_pass.seconds += time.perf_counter() - t0
                full_pass.tokens += int(ids.size)
                metrics = compare_arrays(full, chunked.logits[i], kind)
                chunked.docs_out[i]["chunking_error"] = metrics
                full_pass.per_doc.append((full, chunked.logits[i]))
        full_pass.peak = rss_full.peak if rss_full else full_stepper.peak_bytes
        if options.generate:
            full_pass.agreement = _check_generation(full_stepper, reference, docs, chunked.docs_out)
    finally:
        full_stepper.close()
    return full_pass


def _check_generation(
    full_stepper: Any, reference: _Target, docs: list[tuple[str, np.ndarray]], docs_out: list[dict[str, Any]]
) -> list[list[int]]:
    """Each input's generated tokens against the argmax of one full pass over prompt + generated tokens (written
    into its entry); returns the matches per input."""
    from trtforge.build.kv_profiles import select_phase_profile

    agreement = []
    for i, (name, ids) in enumerate(docs):
        gen = docs_out[i]["generated"]
        seq = np.concatenate([ids, np.asarray(gen[:-1], dtype=np.int64)])
        full = (
            full_stepper.full(
                seq,
                select_phase_profile(reference.profiles, reference.phases, "prefill", int(seq.size), 0, where=reference.where).index,
            )
            if reference.kind == "engine"
            else full_stepper.full(seq)
        )
        expected = [int(v) for v in full[ids.size - 1 :].argmax(axis=-1)]
        match = [int(a == b) for a, b in zip(gen, expected)]
        first = next((k for k, m in enumerate(match) if not m), None)
        docs_out[i]["generation"] = {"expected": expected, "agreement": float(np.mean(match)), "first_mismatch": first}
        agreement.append(match)
    return agreement


@dataclass
class _ChunkingCheck:
    """The chunking error over all inputs, the gate it is held to and the failures."""

    error: dict[str, Any]
    gate: float
    failures: list[str]


def _check_chunking(
    docs: list[tuple[str, np.ndarray]],
    chunked: _ChunkedPass,
    full: _FullPass,
    layout: dict[str, Any],
    reference: _Target,
    kind: str | None,
    target: _Target,
    options: StatefulOptions,
) -> _ChunkingCheck:
    """The stateful logits against the full pass's over all inputs, and per input against the gate."""
    from trtforge.verify.compare import compare_arrays
    from trtforge.verify.gates import check_outputs

    ref_all = np.concatenate([f for f, _ in full.per_doc])
    got_all = np.concatenate([g for _, g in full.per_doc])
    per_input = {f"input {i} ({docs[i][0]})": d["chunking_error"] for i, d in enumerate(chunked.docs_out)}
    worst_name = max(per_input, key=lambda n: per_input[n]["rel_l2"] if per_input[n]["rel_l2"] == per_input[n]["rel_l2"] else np.inf)
    chunk_err = {
        "output": layout["output"],
        **compare_arrays(ref_all, got_all, kind),
        "worst_input_rel_l2": per_input[worst_name]["rel_l2"],
        "reference": f"one full pass (past 0) on {reference.path.name} ({reference.kind})",
    }
    gate = options.max_rel_l2 if options.max_rel_l2 is not None else (1e-4 if target.kind == "onnx" else 1e-2)
    failures = check_outputs(
        per_input,
        [("rel_l2", "max", gate, "stateful chunking error rel-L2", "--max-rel-l2")],
        "stateful run's check against one full pass",
        "the stateful run",
    )
    return _ChunkingCheck(chunk_err, gate, failures)


def _stateful_report(
    target: _Target, stepper: Any, options: StatefulOptions, chunked: _ChunkedPass, full: _FullPass, check: _ChunkingCheck
) -> dict[str, Any]:
    """The report, but for its closing `seconds`."""
    layout = target.kv["layout"]
    profiles_by_index = {p.index: p for p in target.profiles}
    agreement = full.agreement
    return {
        "schema": SCHEMA,
        "trtforge_version": __version__,
        "target": str(target.path),
        "backend": "onnxruntime" if target.kind == "onnx" else f"tensorrt {getattr(stepper, 'mod', None) and stepper.mod.version}",
        "model": {k: layout[k] for k in ("layers", "heads", "kv_heads", "head_dim", "output")},
        "chunk": options.chunk,
        "inputs": chunked.docs_out,
        "chunking_error": check.error,
        "generation": None
        if not options.generate
        else {
            "tokens_per_input": options.generate,
            "agreement": float(np.mean([m for ms in agreement for m in ms])),
            "exact": all(all(ms) for ms in agreement),
            "decode_tokens_per_s": chunked.decode_tokens / chunked.decode_seconds if chunked.decode_seconds else None,
            "decode_steps": chunked.decode_tokens,
            "check": "argmax of one full pass over prompt + generated tokens at each generated position (causal: equal to a recompute per step)",
        },
        "throughput": {
            "prefill_tokens_per_s": chunked.prefill_tokens / chunked.prefill_seconds if chunked.prefill_seconds else None,
            "full_pass_tokens_per_s": full.tokens / full.seconds if full.seconds else None,
            "per_profile": [
                {
                    "profile": idx,
                    "phase": "prefill",
                    "axes": {a: [t.min, t.opt, t.max] for a, t in profiles_by_index[idx].axes.items()},
                    **rec,
                    "tokens_per_s": rec["tokens"] / rec["seconds"] if rec["seconds"] else None,
                }
                for idx, rec in sorted(chunked.per_profile.items())
            ],
            "profiles_note": None
            if target.kind == "engine"
            else "ONNX Runtime has no profiles: steps are grouped by the profile a build from this export would use",
        },
        "memory": {
            "method": "peak RSS above the level before the phase, sampled every ms, ONNX Runtime arena off"
            if target.kind == "onnx"
            else "device memory in use (cudaMemGetInfo) from engine load: contexts, activations and the cache buffers",
            "stateful_prefill_peak_mb": chunked.peak / 2**20,
            "full_pass_peak_mb": full.peak / 2**20,
            "cache_plan": getattr(stepper, "plan", None)
            or cache_plan(layout, max(d["tokens"] for d in chunked.docs_out) + options.generate, options.chunk, 4),
        },
        "gates": {"max_rel_l2": check.gate, "passed": not check.failures, "failures": check.failures},
    }


class _Null:
    def __enter__(self) -> "_Null":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def run_command(
    target: Path,
    inputs: Path | None,
    chunk: int | None,
    generate: int,
    reference: Path | None,
    report: Path | None,
    backend: str,
    providers: list[str] | None,
    max_rel_l2: float | None,
    json_out: bool,
) -> None:
    """`trtforge run --stateful [--generate N]`: run, render, gate (exit 1 on a failed gate)."""
    from trtforge.core import ui
    from trtforge.core.errors import GateFailed

    if inputs is None:
        raise UserError("no inputs given; pass --inputs FOLDER (texts) for --stateful.")
    options = StatefulOptions(
        inputs=inputs,
        chunk=chunk or 128,
        generate=generate or 0,
        reference=reference,
        backend=backend,
        providers=list(providers or []),
        max_rel_l2=max_rel_l2,
        report=report,
    )
    log = (lambda msg: None) if json_out else (lambda msg: ui.console(stderr=True).print(msg, markup=False))
    r = run_stateful(target, options, log)
    if json_out:
        ui.print_json(r)
    else:
        con = ui.console()
        c = r["chunking_error"]
        con.print(
            f"{len(r['inputs'])} inputs, {sum(i['tokens'] for i in r['inputs'])} tokens, chunk {r['chunk']} on {r['backend']}", markup=False
        )
        con.print(
            f"chunking error (stateful vs one full pass): rel-L2 {c['rel_l2']:.2e} (worst input {c['worst_input_rel_l2']:.2e}), "
            f"max-abs {c['max_abs']:.2e}, top-1 {c.get('top1_agreement', float('nan')):.4f}",
            markup=False,
        )
        rows = [
            [p["profile"], " ".join(f"{a} {v[0]}..{v[2]}" for a, v in p["axes"].items()), p["steps"], p["tokens"], p["tokens_per_s"]]
            for p in r["throughput"]["per_profile"]
        ]
        con.print(ui.table("prefill per profile", ["profile", "axes", "steps", "tokens", "tokens/s"], rows))
        m = r["memory"]
        con.print(
            f"prefill {r['throughput']['prefill_tokens_per_s']:.0f} tokens/s stateful, {r['throughput']['full_pass_tokens_per_s']:.0f} "
            f"tokens/s full pass; peak memory {m['stateful_prefill_peak_mb']:.1f} MiB stateful vs {m['full_pass_peak_mb']:.1f} MiB full",
            markup=False,
        )
        if r["generation"]:
            g = r["generation"]
            con.print(
                f"generate: agreement with full recompute {g['agreement']:.4f} (exact: {g['exact']}), "
                f"decode {g['decode_tokens_per_s'] or 0:.0f} tokens/s",
                markup=False,
            )
        con.print("gates: " + ("passed" if r["gates"]["passed"] else "FAILED: " + "; ".join(r["gates"]["failures"])), markup=False)
    if not r["gates"]["passed"]:
        raise GateFailed("; ".join(r["gates"]["failures"]) + (f"; see {report}" if report else "") + ".")
