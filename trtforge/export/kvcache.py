"""Causal decoders with an explicit KV cache: export, and the prefill/decode profiles to build them with.

The exported graph takes `input_ids` and `position_ids` [batch, seq] and one pair per layer
`past_key_<i>`, `past_value_<i>` [batch, kv_heads, past, head_dim] (kv_heads < heads under grouped-query
attention), and returns `logits` (or `last_hidden_state`) [batch, seq, ...] and `present_key_<i>`,
`present_value_<i>` [batch, kv_heads, past+seq, head_dim]. `past` may be 0: ONNX Runtime takes
0-sized dims, and the graph is traced at past 3 so that no branch on an empty cache is baked in.

Why explicit `position_ids` for both GPT-2 (absolute) and LLaMA (rotary): the caller knows the offset
(the cache length), the graph stays free of shape arithmetic, and left-padded or packed batches stay
possible. Rows of a batch must be unpadded (all of one length); there is no attention_mask input. The
adapter passes an all-ones mask built from the tensor shapes: under tracing this keeps transformers
from replacing the causal mask by SDPA's `is_causal` (upper-left aligned, wrong when past > 0).

transformers 5 keeps the cache in `DynamicCache` objects: `_CacheAdapter` (trtforge's own, the user
hands over the plain model) converts flat tensors to a DynamicCache and the updated cache back to
flat tensors.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtforge import __version__
from trtforge.core.artifacts import onnx_graph_hash, sidecar_chain, write_sidecar
from trtforge.core.config import AxisRange, CacheRange, InputSpec, ModelConfig, load_config
from trtforge.core.errors import GateFailed, UserError, exception_summary

PAST = ("past_key_{}", "past_value_{}")
PRESENT = ("present_key_{}", "present_value_{}")
TOTAL_AXIS = "total"  # past + seq, on the present outputs


@dataclass
class CacheLayout:
    """What the cache tensors look like, read off the transformers config."""

    layers: int
    kv_heads: int
    heads: int
    head_dim: int
    max_positions: int
    vocab_size: int
    output: str  # logits | last_hidden_state

    def past_names(self) -> list[str]:
        return [p.format(i) for i in range(self.layers) for p in PAST]

    def present_names(self) -> list[str]:
        return [p.format(i) for i in range(self.layers) for p in PRESENT]


def cache_layout(module: Any, source: str) -> CacheLayout:
    """The layout of a transformers causal decoder; a clear error for anything else."""
    config = getattr(module, "config", None)
    params = inspect.signature(module.forward).parameters
    causal = {getattr(m, "is_causal", None) for m in module.modules() if hasattr(m, "is_causal")}  # attention modules say it
    if config is None or not ({"cache", "past_key_values"} & set(params)) or True not in causal:
        raise UserError(
            f"model {source} is not a causal decoder with a key/value cache (no 'past_key_values' argument or no causal attention); --kv-cache needs a "
            "transformers causal decoder such as GPT2LMHeadModel or LlamaForCausalLM."
        )
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    max_positions = int(getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", 0) or 1 << 20)
    output = (
        "logits"
        if hasattr(module, "lm_head") or "ForCausalLM" in type(module).__name__ or "LMHead" in type(module).__name__
        else "last_hidden_state"
    )
    return CacheLayout(int(text.num_hidden_layers), kv_heads, heads, head_dim, max_positions, int(text.vocab_size), output)


def _cache_kwarg(module: Any) -> str:
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def make_cache(module: Any, past: list[Any]) -> Any:
    """A DynamicCache holding flat [k0, v0, k1, v1, ...] tensors (empty when past is 0 long)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=module.config)
    if past and past[0].shape[2] > 0:
        for i in range(len(past) // 2):
            cache.update(past[2 * i], past[2 * i + 1], i)
    return cache


def _adapter(module: Any, layout: CacheLayout) -> Any:
    import torch

    kwarg = _cache_kwarg(module)

    class _CacheAdapter(torch.nn.Module):
        """Flat tensors in and out around the user's unchanged module (see the module doc)."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, input_ids, position_ids, *past):
            from transformers import DynamicCache

            cache = DynamicCache(config=self.inner.config)
            for i in range(layout.layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            mask = torch.ones(input_ids.shape[0], past[0].shape[2] + input_ids.shape[1], dtype=torch.int64)
            out = self.inner(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=True, **{kwarg: cache})
            presents = []
            for i in range(layout.layers):
                presents += [cache.layers[i].keys, cache.layers[i].values]
            return (out[layout.output], *presents)

    return _CacheAdapter().eval()


def reference_forward(module: Any, layout: CacheLayout, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The plain model called with a DynamicCache of the feeds' past length: the export's ground truth."""
    import torch

    past = [torch.from_numpy(feeds[n]) for n in layout.past_names()]
    cache = make_cache(module, past)
    with torch.no_grad():
        out = module(
            input_ids=torch.from_numpy(feeds["input_ids"]),
            position_ids=torch.from_numpy(feeds["position_ids"]),
            use_cache=True,
            **{_cache_kwarg(module): cache},
        )
    presents = []
    for i in range(layout.layers):
        presents += [cache.layers[i].keys.numpy(), cache.layers[i].values.numpy()]
    return [out[layout.output].numpy(), *presents]


def kv_feeds(layout: CacheLayout, batch: int, past: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random tokens, positions past..past+seq-1 and a random cache of `past` positions."""
    rng = np.random.default_rng(seed)
    feeds = {
        "input_ids": rng.integers(0, layout.vocab_size, (batch, seq), dtype=np.int64),
        "position_ids": np.broadcast_to(np.arange(past, past + seq, dtype=np.int64), (batch, seq)).copy(),
    }
    for name in layout.past_names():
        feeds[name] = rng.standard_normal((batch, layout.kv_heads, past, layout.head_dim)).astype(np.float32)
    return feeds


# -- config ----------------------------------------------------------------------------------------


def _seq_axes(config: ModelConfig) -> tuple[str, str]:
    spec = next((s for s in config.inputs if s.name == "input_ids"), None)
    if spec is None or len(spec.shape) != 2 or not all(isinstance(d, str) for d in spec.shape):
        raise UserError(
            f"config '{config.name}': --kv-cache needs an input 'input_ids' with shape [batch, seq] (two named axes) under 'inputs'."
        )
    return str(spec.shape[0]), str(spec.shape[1])


def kv_config(model: str | None, config_path: Path | None) -> ModelConfig:
    """The config to export with: the file's (kv_cache enabled), or defaults for a bare --model."""
    if config_path is not None:
        cfg = load_config(config_path)
        if model:
            cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"source": model})})
    elif model is None:
        raise UserError("no model given; pass --model file.py:factory or --config configs/NAME.yaml.")
    else:
        cfg = ModelConfig(
            name=Path(model.split(":")[0]).stem if ":" in model else model,
            model={"source": model},
            inputs=[{"name": "input_ids", "dtype": "int64", "shape": ["batch", "seq"]}],
            axes={"batch": {"min": 1, "opt": 1, "max": 8}, "seq": {"min": 1, "opt": 128, "max": 512}},
        )
    return cfg.model_copy(update={"kv_cache": cfg.kv_cache.model_copy(update={"enabled": True})})


RANGE_KEYS = ("past.max", "past.opt", "seq")  # what the user may leave to fit_ranges: kv_cache.past.*, the seq axis


def unset_ranges(config_path: Path | None, config: ModelConfig) -> set[str]:
    """The range keys of RANGE_KEYS that the user left to trtforge: all of them for a bare --model (the
    seq axis is kv_config's default), else kv_cache.past.max / .opt where the config file does not set
    them (its seq axis is always its own). Read before flags are applied: applying them re-validates
    the config, and every key then reads as set."""
    if config_path is None:
        return set(RANGE_KEYS)
    kv = config.kv_cache
    given = kv.past.model_fields_set if "past" in kv.model_fields_set else set()
    return {f"past.{key}" for key in ("max", "opt") if key not in given}


def fit_ranges(config: ModelConfig, positions: int, unset: set[str]) -> tuple[ModelConfig, list[str]]:
    """The config with the ranges the user left unset chosen so that a full cache plus a full chunk fits
    the model's positions (past max + seq max <= positions), and what was chosen, as 'key value' strings.
    The defaults (seq max 512, past max 1024) are kept where they fit; else the chunk gets at most half the
    positions and the cache the rest. Values the user set are kept as they are (kv_specs refuses them,
    naming the key, when they do not fit); an unset range that cannot fit next to a set one is refused,
    naming the set one."""
    _, seq_axis = _seq_axes(config)
    seq, past = config.axes[seq_axis], config.kv_cache.past
    chosen: list[str] = []
    if "seq" in unset:
        room = positions - (past.max if "past.max" not in unset else 0)
        seq_max = min(seq.max, room if "past.max" not in unset else max(1, positions // 2))
        if seq_max < 1:
            raise UserError(
                f"config '{config.name}': kv_cache.past.max {past.max} leaves no position for new tokens in the "
                f"model's {positions}; lower kv_cache.past.max."
            )
        if seq_max != seq.max:
            seq = AxisRange(min=min(seq.min, seq_max), opt=min(seq.opt, seq_max), max=seq_max)
            chosen.append(f"axes.{seq_axis}.max {seq_max}")
    if "past.max" in unset:
        past_max = min(past.max, positions - seq.max)
        if past_max < 1:
            raise UserError(
                f"config '{config.name}': axes.{seq_axis}.max {seq.max} leaves no position for a cache in the "
                f"model's {positions}; lower axes.{seq_axis}.max."
            )
        if past.min > past_max:
            raise UserError(
                f"config '{config.name}': kv_cache.past.min {past.min} exceeds the {past_max} cache positions that "
                f"fit beside axes.{seq_axis}.max {seq.max} in the model's {positions}; lower kv_cache.past.min."
            )
        if past.opt > past_max and "past.opt" not in unset:
            raise UserError(
                f"config '{config.name}': kv_cache.past.opt {past.opt} exceeds the {past_max} cache positions that "
                f"fit beside axes.{seq_axis}.max {seq.max} in the model's {positions}; lower kv_cache.past.opt."
            )
        tiers = config.kv_cache.past_tiers
        if tiers and max(tiers) > past_max:
            raise UserError(
                f"config '{config.name}': kv_cache.past_tiers go up to {max(tiers)} but {past_max} cache positions fit "
                f"beside axes.{seq_axis}.max {seq.max} in the model's {positions}; lower kv_cache.past_tiers."
            )
        if past_max != past.max:
            past = CacheRange(min=past.min, opt=min(past.opt, past_max), max=past_max)
            chosen.insert(0, f"kv_cache.past.max {past_max}")
    fitted = config.model_copy(
        update={"axes": {**config.axes, seq_axis: seq}, "kv_cache": config.kv_cache.model_copy(update={"past": past})}
    )
    return fitted, chosen


def config_wants_kv(config_path: Path | None) -> bool:
    return config_path is not None and load_config(config_path).kv_cache.enabled


def kv_specs(config: ModelConfig, layout: CacheLayout) -> tuple[list[InputSpec], dict[str, AxisRange], CacheRange]:
    """Input specs of the cache graph and its axes; the sidecar's `past` axis starts at >= 1 (AxisRange
    cannot say 0, and clean's check needs a non-empty cache), its real range is in `kv_cache.past`."""
    batch, seq = _seq_axes(config)
    kv = config.kv_cache
    past_axis = kv.past_axis
    if past_axis in config.axes or past_axis == TOTAL_AXIS:
        raise UserError(f"config '{config.name}': kv_cache.past_axis '{past_axis}' clashes with an axis under 'axes'; pick another name.")
    seq_max = config.axes[seq].max
    if kv.past.max + seq_max > layout.max_positions:
        raise UserError(
            f"config '{config.name}': kv_cache.past.max {kv.past.max} plus seq max {seq_max} exceeds the model's "
            f"{layout.max_positions} positions; lower kv_cache.past.max."
        )
    specs = [
        InputSpec(name="input_ids", dtype="int64", shape=[batch, seq], value_range=(0, layout.vocab_size)),
        InputSpec(name="position_ids", dtype="int64", shape=[batch, seq], value_range=(0, layout.max_positions - seq_max)),
    ]
    specs += [
        InputSpec(name=n, dtype="float32", shape=[batch, layout.kv_heads, past_axis, layout.head_dim], value_range=(-1.0, 1.0))
        for n in layout.past_names()
    ]
    axes = {
        batch: config.axes[batch],
        seq: config.axes[seq],
        past_axis: AxisRange(min=max(1, kv.past.min), opt=max(1, kv.past.opt), max=kv.past.max),
    }
    return specs, axes, kv.past


# -- export ----------------------------------------------------------------------------------------


def export_kv(
    config: ModelConfig, output: Path, check: bool = True, unset: set[str] | None = None, note: Callable[[str], None] | None = None
) -> Any:
    """Export with explicit cache I/O, check ORT against the plain model at varied seq, past and batch.
    `unset`: the range keys (RANGE_KEYS) the user left to trtforge, chosen to fit the model's positions
    (fit_ranges); `note` gets one line for what was chosen and one for each rewrite made for the exporter
    (default: stderr). Grouped-query SDPA is exported as export_model does (grouped_query_attention_unrolled):
    transformers passes enable_gqa where its SDPA integration wants it (backend- and version-dependent)."""
    from trtforge.core.onnxio import load_onnx, save_onnx
    from trtforge.export.step import (
        AxisCheck,
        ExportResult,
        output_specs,
        refuse_export_overwrite,
        save_tokenizer,
        stderr_note,
        tokenizer_source,
        unrolled_attention_rewrites,
    )
    from trtforge.models import load_model

    if config.export.exporter != "legacy":
        raise UserError("--kv-cache exports with the legacy exporter (checked at past 0); drop --exporter dynamo.")
    refuse_export_overwrite(config, Path(output))
    start = time.perf_counter()
    loaded = load_model(config.model.source, config.model.kwargs, ["input_ids"])
    module = loaded.module.eval()
    layout = cache_layout(module, config.model.source)
    config, chosen = fit_ranges(config, layout.max_positions, unset or set())
    if chosen:
        _note_ranges_chosen(config, layout, chosen, note or stderr_note)
    specs, axes, past_range = kv_specs(config, layout)
    trace = _trace_setup(module, layout, config, specs)
    output = Path(output)
    with tempfile.TemporaryDirectory(prefix="trtforge-kv-") as tmp:
        raw = Path(tmp) / "raw.onnx"
        rewrites = unrolled_attention_rewrites(_run_exporter(trace, module, config, raw))
        for rewrite in rewrites:
            (note or stderr_note)(f"legacy exporter: {rewrite}.")
        model = load_onnx(raw)
        checks = _check(raw, module, layout, config, past_range) if check else []
        tokenizer = tokenizer_source(config, loaded)
        save_onnx(model, output, external_data=True if config.export.external_data else None)
        if tokenizer is not None:
            save_tokenizer(tokenizer, output.with_name(output.name.removesuffix(".onnx") + ".tokenizer"))

    out_specs = output_specs(model, config, loaded)
    for spec in out_specs:
        spec["kind"], spec["scale"] = ("token" if spec["name"] == layout.output else None), None
    sidecar = {
        **_export_record(config, rewrites, specs, axes, out_specs),
        "graph_hash": onnx_graph_hash(model),
        "tokenizer": output.name.removesuffix(".onnx") + ".tokenizer" if tokenizer is not None else None,
        "kv_cache": _kv_cache_record(config, layout, past_range, chosen),
        "check": [{"axis": c.axis, "size": c.size, "sizes": c.sizes, "metrics": c.metrics} for c in checks],
        "check_tolerance": config.export.tolerance,
        "checked": check,
    }
    seconds = time.perf_counter() - start
    sidecar["seconds"] = round(seconds, 3)
    write_sidecar(output, sidecar)
    return ExportResult(
        output, sidecar, [AxisCheck(**{k: c[k] for k in ("axis", "size", "sizes", "metrics")}) for c in sidecar["check"]], seconds
    )


def _note_ranges_chosen(config: ModelConfig, layout: CacheLayout, chosen: list[str], note: Callable[[str], None]) -> None:
    """Say which ranges trtforge chose to fit the model's positions, and which keys choose others."""
    _, seq_name = _seq_axes(config)
    note(
        f"{' and '.join(chosen)} chosen so that a cache of {config.kv_cache.past.max} plus a chunk of "
        f"{config.axes[seq_name].max} tokens fits the model's {layout.max_positions} positions; set "
        f"kv_cache.past.max and axes.{seq_name}.max to choose others."
    )


@dataclass
class _Trace:
    """What torch.onnx.export is given: the adapter around the module, example tensors, names and dynamic axes."""

    adapter: Any
    args: tuple[Any, ...]
    names: list[str]
    outputs: list[str]
    dynamic: dict[str, dict[int, str]]


def _trace_setup(module: Any, layout: CacheLayout, config: ModelConfig, specs: list[InputSpec]) -> _Trace:
    """The adapter and an example at distinct sizes with past > 0, so that nothing degenerate gets traced in."""
    import torch

    batch_axis, seq_axis = _seq_axes(config)
    adapter = _adapter(module, layout)
    names = [s.name for s in specs]
    outputs = [layout.output, *layout.present_names()]
    dynamic = {n: {0: batch_axis, 1: seq_axis} for n in ("input_ids", "position_ids", layout.output)}
    dynamic.update({n: {0: batch_axis, 2: config.kv_cache.past_axis} for n in layout.past_names()})
    dynamic.update({n: {0: batch_axis, 2: TOTAL_AXIS} for n in layout.present_names()})
    example = kv_feeds(layout, 2, 3, 5)  # distinct sizes, past > 0: nothing degenerate gets traced in
    args = tuple(torch.from_numpy(example[n]) for n in names)
    return _Trace(adapter, args, names, outputs, dynamic)


def _run_exporter(trace: _Trace, module: Any, config: ModelConfig, raw: Path) -> Any:
    """The legacy exporter's graph at `raw`, its chatter silenced; returns what the grouped-query rewrite recorded.
    A failed export is a user error naming the opset."""
    import torch

    from trtforge.export.step import grouped_query_attention_unrolled

    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
            with grouped_query_attention_unrolled() as rewritten:
                torch.onnx.export(
                    trace.adapter,
                    trace.args,
                    str(raw),
                    input_names=trace.names,
                    output_names=trace.outputs,
                    dynamic_axes=trace.dynamic,
                    opset_version=config.export.opset,
                    dynamo=False,
                    do_constant_folding=True,
                )
    except Exception as exc:
        raise UserError(
            f"exporting {config.model.source} with a KV cache failed at opset {config.export.opset}: "
            f"{exception_summary(exc)}; try another --opset."
        ) from None
    finally:
        trace.adapter.eval()  # the exporter restores the adapter's train flag onto the inner module
        module.eval()
    return rewritten[0]


def _export_record(
    config: ModelConfig, rewrites: list[str], specs: list[InputSpec], axes: dict[str, AxisRange], out_specs: list[dict[str, Any]]
) -> dict[str, Any]:
    """The export sidecar's account of how the graph was made and what it takes and gives."""
    import torch

    return {
        "kind": "onnx",
        "step": "export",
        "trtforge_version": __version__,
        "source": config.model.source,
        "config_name": config.name,
        "torch_version": torch.__version__,
        "exporter": "legacy",
        "opset": config.export.opset,
        "exporter_rewrites": rewrites,
        "inputs": [s.model_dump() for s in specs],
        "axes": {k: v.model_dump() for k, v in axes.items()},
        "outputs": out_specs,
    }


def _kv_cache_record(config: ModelConfig, layout: CacheLayout, past_range: CacheRange, chosen: list[str]) -> dict[str, Any]:
    """The sidecar's `kv_cache`: the cache layout and axes, and the tiers build makes profiles of."""
    batch_axis, seq_axis = _seq_axes(config)
    return {
        "layout": asdict(layout),
        "batch_axis": batch_axis,
        "seq_axis": seq_axis,
        "past_axis": config.kv_cache.past_axis,
        "total_axis": TOTAL_AXIS,
        "past": past_range.model_dump(),
        "position_input": "position_ids",
        "ranges_chosen": chosen,
        "tiers": {
            seq_axis: config.kv_cache.seq_tiers or [config.axes[seq_axis].max],
            config.kv_cache.past_axis: config.kv_cache.past_tiers or sorted({past_range.min, past_range.max}),
        },
    }


def check_plan(config: ModelConfig, past_range: CacheRange) -> list[tuple[str, dict[str, int]]]:
    """(axis varied, {batch, past, seq}) pairs: each axis alone over >= 2 sizes, past 0 included."""
    batch_axis, seq_axis = _seq_axes(config)
    base = {batch_axis: 1, config.kv_cache.past_axis: 4, seq_axis: 6}
    past_sizes = config.kv_cache.check_past or sorted({past_range.min, max(past_range.min, 1), min(past_range.max, 37)})
    if len(set(past_sizes)) < 2:
        raise UserError(f"config '{config.name}': kv_cache.check_past needs >= 2 sizes, got {past_sizes}.")
    plan = [(seq_axis, {**base, seq_axis: s}) for s in config.check_sizes_for(seq_axis)]
    plan += [(config.kv_cache.past_axis, {**base, config.kv_cache.past_axis: p}) for p in past_sizes]
    plan += [(batch_axis, {**base, batch_axis: b}) for b in config.check_sizes_for(batch_axis)]
    return plan


def _check(onnx_path: Path, module: Any, layout: CacheLayout, config: ModelConfig, past_range: CacheRange) -> list[Any]:
    from trtforge.backends.onnxruntime import OrtRunner
    from trtforge.export.step import AxisCheck
    from trtforge.verify.compare import compare_outputs
    from trtforge.verify.gates import screen

    runner = OrtRunner(onnx_path)
    batch_axis, seq_axis = _seq_axes(config)
    past_axis = config.kv_cache.past_axis
    checks = []
    for i, (axis, sizes) in enumerate(check_plan(config, past_range)):
        feeds = kv_feeds(layout, sizes[batch_axis], sizes[past_axis], sizes[seq_axis], seed=i)
        expected = reference_forward(module, layout, feeds)
        try:
            got = runner.run(feeds)
        except Exception as exc:
            raise UserError(
                f"the KV-cache graph fails in ONNX Runtime at {axis}={sizes[axis]} "
                f"({' '.join(str(exc).split())[:200]}); the exporter baked a size into the graph."
            ) from None
        check = AxisCheck(axis, sizes[axis], dict(sizes))
        references = dict(zip([layout.output, *layout.present_names()], expected))
        for name, ref in references.items():
            cand = got[name]
            if cand.shape != ref.shape:
                raise UserError(
                    f"the KV-cache graph is not dynamic in axis '{axis}': at {axis}={sizes[axis]} output '{name}' "
                    f"has shape {list(cand.shape)} in ONNX Runtime but {list(ref.shape)} in PyTorch."
                )
        check.metrics.update(compare_outputs({name: None for name in references}, references, got))
        where = f"the KV-cache export check at {axis}={sizes[axis]}"
        nonfinite = screen(check.metrics, where, "the KV-cache graph (ONNX Runtime)")
        if nonfinite:
            raise GateFailed(f"{where}: {nonfinite[0]}; the export was not kept.")
        for name in references:
            if not check.metrics[name]["rel_l2"] <= config.export.tolerance:
                raise UserError(
                    f"the KV-cache graph differs from PyTorch at {axis}={sizes[axis]}: output '{name}' rel-L2 "
                    f"{check.metrics[name]['rel_l2']:.2e} > {config.export.tolerance:.0e}; a size was baked into the graph."
                )
        checks.append(check)
    return checks


# -- sidecars and profiles -------------------------------------------------------------------------


def kv_meta(path: Path, sidecar: dict[str, Any] | None = None) -> tuple[dict[str, Any] | None, dict[str, Any] | None, Path | None]:
    """(kv_cache metadata, export sidecar, export ONNX path): the nearest export up the sidecar chain that records one.
    A corrupt sidecar on the way is an error: stopping there would build or run a KV-cache model as a plain one."""
    for current, side in sidecar_chain(path, sidecar, strict=True):
        if "kv_cache" in side and side.get("step") == "export":
            return side["kv_cache"], side, current
    return None, None, None


def kv_axes(axes: dict[str, Any], kv: dict[str, Any]) -> dict[str, Any]:
    """The axes with the past axis' real range (its min may be 0)."""
    return {**axes, kv["past_axis"]: CacheRange(**kv["past"])}


def export_command(
    model: str | None,
    config: Path | None,
    output: Path | None,
    opset: int | None,
    exporter: str | None,
    external_data: bool | None,
    check: bool,
    json_out: bool,
) -> None:
    """`trtforge export --kv-cache` (or a config with kv_cache.enabled): export, then render."""
    from trtforge.core import ui
    from trtforge.core.config import apply_overrides

    base = kv_config(model, config)
    cfg = apply_overrides(base, {"export.opset": opset, "export.exporter": exporter, "export.external_data": external_data})
    output = output or Path("out") / f"{cfg.name}.kv.onnx"
    result = export_kv(cfg, output, check=check, unset=unset_ranges(config, base))
    if json_out:
        ui.print_json({"path": str(result.path), **result.sidecar})
        return
    con = ui.console()
    rows = [
        [c.axis, c.size, name, m["rel_l2"], m["max_abs"]]
        for c in result.checks
        for name, m in c.metrics.items()
        if not name.startswith("present_") or name.endswith("_0")
    ]
    con.print(
        ui.table("ONNX Runtime vs PyTorch (DynamicCache), one axis varied at a time", ["axis", "size", "output", "rel-L2", "max-abs"], rows)
    )
    lay = result.sidecar["kv_cache"]["layout"]
    con.print(
        f"wrote {result.path}: {lay['layers']} layers x (past_key, past_value) [batch, {lay['kv_heads']}, past, {lay['head_dim']}] "
        f"in {result.seconds:.1f} s",
        markup=False,
    )
