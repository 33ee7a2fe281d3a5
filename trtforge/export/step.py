"""`trtforge export`: PyTorch -> ONNX, then prove the ONNX dynamic by running it.

An exporter can silently bake an example size into the graph (the legacy exporter does this to the
reshapes of nn.TransformerEncoderLayer). So after exporting, every dynamic axis is varied on its own
over >= 2 sizes while the others stay at the example size, and ONNX Runtime's outputs are compared
with PyTorch's. A failure names the axis and the size, which is what the user needs to fix it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtforge import __version__
from trtforge.backends.onnxruntime import OrtRunner
from trtforge.core import ui
from trtforge.core.artifacts import ensure_writable_dir, onnx_graph_hash, publish, refuse_overwrite, write_sidecar
from trtforge.core.config import AxisRange, InputSpec, ModelConfig
from trtforge.core.errors import UserError, exception_summary
from trtforge.core.onnxio import load_onnx, save_onnx
from trtforge.export.check import AxisCheck, check_against_torch, example_axis_sizes
from trtforge.export.onnx_fixups import WRAPPER_SCOPE, conform_to_opset, default_opset, dry_run, module_to_export, strip_wrapper_scope
from trtforge.models import LoadedModel, called_positionally, load_model
from trtforge.runtime.feeds import random_feeds

TORCH_DTYPES = {"float32": "float32", "float16": "float16", "int64": "int64", "int32": "int32", "bool": "bool"}


@dataclass
class ExportResult:
    path: Path
    sidecar: dict[str, Any]
    checks: list[AxisCheck]
    seconds: float


def specs_from_examples(loaded: LoadedModel) -> tuple[list[InputSpec], dict[str, AxisRange]]:
    """Without a config: dim 0 of every input is a dynamic 'batch' axis; dim 1 of every 2-D integer
    input is a dynamic 'seq' axis (token ids, attention masks and token types are [batch, seq] in every
    text model; a fixed-size integer input would fail the export check at another 'seq', loudly, rather
    than the text model silently keeping the example's length). Other dims are fixed. Integer inputs
    draw values from the examples' own range, so random ids stay inside the vocabulary."""
    specs, sizes = [], {}
    for name, tensor in loaded.example_inputs.items():
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in TORCH_DTYPES:
            raise UserError(f"example input '{name}' has dtype {dtype}, which trtforge cannot feed; use float32/float16/int64/int32/bool.")
        shape: list[int | str] = list(tensor.shape)
        integer = dtype.startswith("int")
        for dim, axis in ((0, "batch"), (1, "seq")):
            if len(shape) > dim and (axis == "batch" or (integer and len(shape) == 2)):
                sizes.setdefault(axis, int(shape[dim]))
                shape[dim] = axis
        specs.append(InputSpec(name=name, dtype=dtype, shape=shape, value_range=_example_range(tensor, integer)))
    axes = {}
    if "batch" in sizes:
        axes["batch"] = AxisRange(min=1, opt=sizes["batch"], max=max(16, 4 * sizes["batch"]))
    if "seq" in sizes:
        axes["seq"] = AxisRange(min=1, opt=sizes["seq"], max=max(128, sizes["seq"]))
    return specs, axes


def _example_range(tensor: Any, integer: bool) -> tuple[float, float]:
    """Values for random integer inputs: [min, max + 1) of the example, so ids stay in the vocabulary.
    A 0/1 example is an attention mask: it gets all ones, because random zeros leave some query
    positions of a causal model with no visible key at all, whose outputs are undefined (torch and
    ONNX Runtime legitimately disagree there: GPT-2's dynamo export, rel-L2 2e-2, only on those rows).
    Floats: [0, 1]."""
    if not integer or tensor.numel() == 0:
        return (0.0, 1.0)
    low, high = float(tensor.min()), float(tensor.max())
    if (low, high) == (0.0, 1.0):
        return (1.0, 2.0)
    return (low, high + 1.0)


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def named_outputs(out: Any, prefix: str = "") -> list[tuple[str | None, Any]]:
    """Flatten what a module returned into (name, tensor) pairs, in the order the exporters flatten it.

    ModelOutput and dict outputs are named by their keys (ModelOutput's keys skip fields that are None);
    tuples and bare tensors are unnamed (None). Nested containers get dotted names ('hidden_states.0')."""
    if _is_tensor(out):
        return [(prefix or None, out)]
    if hasattr(out, "keys") and hasattr(out, "__getitem__"):  # dict, OrderedDict, transformers ModelOutput
        pairs: list[tuple[str | None, Any]] = []
        for key in out.keys():
            pairs += named_outputs(out[key], f"{prefix}.{key}" if prefix else str(key))
        return pairs
    if isinstance(out, (tuple, list)):
        pairs = []
        for i, item in enumerate(out):
            pairs += named_outputs(item, f"{prefix}.{i}" if prefix else "")
        return pairs
    return []  # None, ints, caches: nothing an ONNX graph can return


def select_outputs(pairs: list[tuple[str | None, Any]], declared: list[str], source: str) -> list[Any]:
    """The tensors of `declared` outputs, in declared order: by name when the module names its outputs,
    else by position. Declaring an output the module does not return is an error naming it."""
    if not declared:
        return [tensor for _, tensor in pairs]
    names = [name for name, _ in pairs]
    if names and all(names):
        missing = [n for n in declared if n not in names]
        if missing:
            raise UserError(
                f"outputs {', '.join(missing)} are declared but {source} returns only {', '.join(names)}; "
                "fix 'outputs' in the config (or the factory's output names)."
            )
        by_name = dict(pairs)
        return [by_name[n] for n in declared]
    if len(declared) > len(pairs):
        raise UserError(
            f"outputs {', '.join(declared[len(pairs) :])} are declared but {source} returns only {len(pairs)} "
            "tensor(s); fix 'outputs' in the config (or the factory's output names)."
        )
    return [tensor for _, tensor in pairs[: len(declared)]]


def keyword_call(loaded: LoadedModel, input_names: list[str], output_names: list[str]) -> Any:
    """A torch module that both exporters and the torch check call POSITIONALLY in the config's input
    order, and that calls the user's module with KEYWORD inputs and returns the declared outputs as a
    flat tuple.

    Why not hand the user's module to torch.onnx.export with kwargs: the legacy exporter's
    `_decide_input_format` turns kwargs (and every defaulted parameter of the signature) into positional
    arguments, and transformers 5's `merge_with_config_defaults` decorator then also injects `use_cache`
    as a keyword ("forward() got multiple values for argument 'use_cache'"). A `*inputs` signature has
    no defaults for it to fill in. Modules that cannot take the input names as keywords (TorchScript,
    nn.Sequential) get them positionally, in the config's input order (models.called_positionally)."""
    import torch

    positional = called_positionally(loaded.module, input_names)
    source = loaded.source or "the model"

    class KeywordCall(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, WRAPPER_SCOPE, loaded.module)

        def forward(self, *inputs: Any) -> tuple:
            inner = getattr(self, WRAPPER_SCOPE)
            out = inner(*inputs) if positional else inner(**dict(zip(input_names, inputs)))
            return tuple(select_outputs(named_outputs(out), output_names, source))

    return KeywordCall().eval()


def returned_output_names(loaded: LoadedModel, config: ModelConfig) -> list[str]:
    """Names for the module's outputs when neither the config nor the factory names them: the keys of a
    ModelOutput/dict return, else output_0, output_1, ..."""
    import torch

    names = [s.name for s in config.inputs]
    args = tuple(loaded.example_inputs[n] for n in names)
    with torch.no_grad():
        out = loaded.module(*args) if called_positionally(loaded.module, names) else loaded.module(**dict(zip(names, args)))
    pairs = named_outputs(out)
    if not pairs:
        raise UserError(f"{loaded.source or 'the model'} returned no tensors; return a tensor, tuple, dict or ModelOutput.")
    if all(name for name, _ in pairs):
        return [str(name) for name, _ in pairs]
    return [f"output_{i}" for i in range(len(pairs))]


def export_inputs(loaded: LoadedModel, config: ModelConfig, seed: int) -> tuple[Any, ...]:
    """The inputs the exporter traces with, in the config's order: the factory's examples, unless one of
    them has size 1 on a dynamic axis (torch.export specialises sizes 0 and 1 to constants, which then
    fails the dynamic-shape constraints): then random inputs at each axis' opt size (at least 2)."""
    import torch

    base = example_axis_sizes(config, loaded)
    if all(base.get(axis, 2) >= 2 for axis in config.axes):
        return tuple(loaded.example_inputs[s.name] for s in config.inputs)
    sizes = {axis: max(2, min(rng.max, rng.opt)) if rng.max >= 2 else rng.max for axis, rng in config.axes.items()}
    feeds = random_feeds(config.inputs, sizes, seed)
    return tuple(torch.from_numpy(feeds[s.name]) for s in config.inputs)


def _dynamic_shapes(config: ModelConfig) -> dict[str, tuple[dict[int, Any], ...]]:
    """torch.export dynamic shapes for the `*inputs` of the keyword call: one Dim per named axis, shared
    by every input that uses it (so batch/seq agree across inputs), bounded by the config's min/max."""
    import torch

    dims = {axis: torch.export.Dim(_dim_name(axis), min=rng.min, max=rng.max) for axis, rng in config.axes.items()}
    per_input = tuple({i: dims[d] for i, d in enumerate(s.shape) if isinstance(d, str)} for s in config.inputs)
    return {"inputs": per_input}


def _dim_name(axis: str) -> str:
    """torch.export Dim names must be Python identifiers."""
    name = re.sub(r"\W", "_", axis)
    return name if name.isidentifier() else f"axis_{name}"


def _torch_export(call: Any, args: tuple, config: ModelConfig) -> Any:
    """torch.export (non-strict) with the config's axis ranges, called here rather than inside
    torch.onnx.export: on a constraint violation torch.onnx silently retries in strict mode and then
    with draft_export, which ignores the violation (a graph that claims sizes it was never proven for)
    and triples the time. SegFormer at 32x32: its last stage is 1 pixel, torch specialises size 1,
    and torch.export says which range it can prove ('Suggested fixes: height = Dim(..., min=33)')."""
    import torch

    shapes = _dynamic_shapes(config) if config.axes else None
    try:
        return torch.export.export(call, args, dynamic_shapes=shapes, strict=False)
    except Exception as exc:
        summary = exception_summary(exc)
        if "Suggested fixes" in summary:
            hint = "narrow the ranges under 'axes' as torch.export suggests (its Dim names are the axis names)"
        elif "Constraints violated" in summary:
            hint = (
                "raise the 'min' of those axes under 'axes' (a size at which a feature map shrinks to 1 is "
                "specialised by torch.export) or use --exporter legacy"
            )
        else:
            hint = "try --exporter legacy"
        raise UserError(f"torch.export could not trace the model for the dynamo exporter: {summary}; {hint}.") from None


@contextlib.contextmanager
def grouped_query_attention_unrolled() -> Any:
    """While active, `scaled_dot_product_attention(..., enable_gqa=True)` runs on K and V repeated to the
    query heads (each K/V head once per query head of its group, as enable_gqa pairs them), with
    enable_gqa off: the legacy exporter cannot convert enable_gqa (transformers passes it for Qwen2 and
    LLaMA when there is no padding mask). Yields a one-item list holding the number of calls rewritten.

    A torch function mode rather than patching `torch.nn.functional`: it also catches modules that
    imported the function by name. The repeat is unsqueeze/expand/flatten, which the legacy exporter
    writes as Unsqueeze/Expand/Reshape on the traced shapes, so batch and sequence stay dynamic. PyTorch's
    own outputs (the export check's reference) are computed outside the mode, with enable_gqa."""
    import torch
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention
    rewritten = [0]

    def repeat_heads(tensor: Any, groups: int) -> Any:
        return tensor.unsqueeze(-3).expand(*tensor.shape[:-2], groups, *tensor.shape[-2:]).flatten(-4, -3)

    class UnrollGroupedQueries(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = dict(kwargs or {})
            if func is sdpa and kwargs.get("enable_gqa"):
                query, key, value, *rest = args
                groups = query.shape[-3] // key.shape[-3]
                kwargs["enable_gqa"] = False
                rewritten[0] += 1
                return func(query, repeat_heads(key, groups), repeat_heads(value, groups), *rest, **kwargs)
            return func(*args, **kwargs)

    with UnrollGroupedQueries():
        yield rewritten


def unrolled_attention_rewrites(count: int) -> list[str]:
    """The sidecar's `exporter_rewrites` entry for `count` calls rewritten by grouped_query_attention_unrolled."""
    if not count:
        return []
    return [
        (
            f"{count} scaled_dot_product_attention call(s) with enable_gqa exported with K/V repeated to the query heads "
            "(enable_gqa has no legacy conversion)"
        )
    ]


def _run_exporter(call: Any, args: tuple, config: ModelConfig, output_names: list[str], path: Path) -> list[str]:
    """Export to `path`; returns the rewrites made for the exporter (recorded in the sidecar)."""
    import torch

    input_names = [s.name for s in config.inputs]
    common = dict(input_names=input_names, output_names=output_names, opset_version=config.export.opset)
    sink = io.StringIO()
    native: list[str] = []
    try:
        with (
            warnings.catch_warnings(),
            ui.native_output_captured() as native,
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("ignore")
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
            if config.export.exporter == "dynamo":
                program = _torch_export(call, args, config)
                onnx_program = torch.onnx.export(program, dynamo=True, verbose=False, **common)
                onnx_program.save(str(path), external_data=config.export.external_data)
            else:
                dynamic_axes = {k: v for k, v in config.dynamic_axes().items() if v}
                with grouped_query_attention_unrolled() as rewritten:
                    torch.onnx.export(
                        call, args, str(path), dynamo=False, do_constant_folding=True, dynamic_axes=dynamic_axes or None, **common
                    )
                return unrolled_attention_rewrites(rewritten[0])
    except UserError:
        raise
    except Exception as exc:
        # torch's C++ side prints the whole IR graph on a failed legacy export: it goes to the log, not the terminal.
        printed = "".join(native) + sink.getvalue()
        raise UserError(
            f"the {config.export.exporter} exporter failed at opset {config.export.opset}: {exception_summary(exc)}; "
            "try another --opset or --exporter.",
            detail=printed or None,
        ) from None
    return []


def frame_rates(onnx_path: Path, config: ModelConfig, loaded: LoadedModel, output_names: list[str], seed: int = 0) -> dict[str, Any]:
    """Token outputs that advance at a stride of the input (audio frames), their frame rates measured on ONNX Runtime
    (runtime/audio.py), the config's declared strides checked against them."""
    from trtforge.runtime.audio import output_frame_rates

    declared = {o.name: o for o in config.outputs}
    tokens = {
        name: (declared[name].stride if name in declared else None)
        for name in output_names
        if (declared[name].kind if name in declared and declared[name].kind else loaded.output_kinds.get(name)) == "token"
        or (name in declared and declared[name].stride is not None)
    }
    if not tokens:
        return {}
    runner = OrtRunner(onnx_path)

    def shapes_at(sizes: dict[str, int]) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in runner.run(random_feeds(config.inputs, sizes, seed)).items()}

    return output_frame_rates(shapes_at, config.inputs, config.axes, tokens, example_axis_sizes(config, loaded))


def output_specs(model: Any, config: ModelConfig, loaded: LoadedModel, rates: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The sidecar's `outputs`: name, dtype and shape from the graph, kind and scale from the config's
    OutputSpec (else the built-in model's known kind, else None for later steps to infer); a strided token output's
    frame rate (`stride` input samples per frame, `frame_offset`: frames(L) = (L - frame_offset) // stride)."""
    from trtforge.runtime.feeds import ONNX_DTYPES

    declared = {o.name: o for o in config.outputs}
    specs = []
    for value in model.graph.output:
        tensor = value.type.tensor_type
        dims = [d.dim_param or (d.dim_value if d.HasField("dim_value") else None) for d in tensor.shape.dim]
        spec = declared.get(value.name)
        kind = spec.kind if spec and spec.kind else loaded.output_kinds.get(value.name)
        specs.append(
            {
                "name": value.name,
                "dtype": ONNX_DTYPES.get(tensor.elem_type, str(tensor.elem_type)),
                "shape": dims,
                "kind": kind,
                "scale": spec.scale if spec else None,
                **({"boxes": spec.box_keys()} if spec and spec.kind == "boxes" else {}),
            }
        )
        rate = (rates or {}).get(value.name)
        if rate is not None:
            specs[-1].update(stride=rate.stride, frame_offset=rate.offset)
    return specs


def tokenizer_source(config: ModelConfig, loaded: LoadedModel) -> Any:
    """The tokenizer to ship beside the ONNX: `model.tokenizer` (a local HF directory), else the one
    the factory returned, else None."""
    if not config.model.tokenizer:
        return loaded.tokenizer
    folder = Path(config.model.tokenizer)
    if not folder.is_dir():
        raise UserError(f"config key 'model.tokenizer': {folder} is not a directory; give a local Hugging Face tokenizer folder.")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UserError("config key 'model.tokenizer' needs transformers to read the tokenizer; run `pip install transformers`.") from None
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise UserError(
            f"config key 'model.tokenizer': {folder} is not a loadable tokenizer ({exception_summary(exc, 200)}); "
            "point it at a folder with tokenizer.json or the tokenizer's vocabulary files."
        ) from None


def source_files(config: ModelConfig) -> list[Path]:
    """The files an export reads besides the config: the model file (`file.py:factory`, TorchScript, .pt2) and the
    tokenizer folder the config names. An export must never write over them."""
    source = config.model.source
    module_file = source.rpartition(":")[0] if ".py:" in source else source
    files = [Path(module_file)] if Path(module_file).exists() else []
    return files + ([Path(config.model.tokenizer)] if config.model.tokenizer else [])


def refuse_export_overwrite(config: ModelConfig, output: Path) -> None:
    """Before an export runs: its ONNX, sidecar, weights and tokenizer folder are none of the files it reads."""
    refuse_overwrite("export", source_files(config), [output], [tokenizer_dir_for(Path(output))])


def tokenizer_dir_for(onnx_path: Path) -> Path:
    """`NAME.tokenizer/` beside `NAME.onnx`: later steps find it through the sidecar's relative path."""
    return onnx_path.with_name(onnx_path.name.removesuffix(".onnx") + ".tokenizer")


def save_tokenizer(tokenizer: Any, folder: Path) -> None:
    """Write the tokenizer to `folder` atomically: into a temp folder beside it, then renamed, so a
    reader never sees half a tokenizer. transformers tokenizers use save_pretrained (tokenizer.json for
    fast ones, which the `tokenizers` library reads where transformers is absent); a bare
    `tokenizers.Tokenizer` is saved as tokenizer.json."""
    import shutil
    import tempfile

    ensure_writable_dir(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(str(tmp))
        elif hasattr(tokenizer, "save"):
            tokenizer.save(str(tmp / "tokenizer.json"))
        else:
            raise UserError(f"the model's tokenizer ({type(tokenizer).__name__}) cannot be saved; return a Hugging Face tokenizer.")
        old = None
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
            os.replace(folder, old / "t")
        publish(tmp, folder)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise UserError(f"could not write {folder}: {exc.strerror or exc}; free space or choose another path.") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def stderr_note(message: str) -> None:
    """A 'note:' line on stderr: what trtforge chose or rewrote for the user (stdout stays clean for --json)."""
    print(f"note: {message}", file=sys.stderr, flush=True)


def export_model(
    config: ModelConfig, output: Path, seed: int = 0, check: bool = True, note: Callable[[str], None] | None = None
) -> ExportResult:
    """Export, check against PyTorch, write the ONNX and its sidecar. `note` gets one line for each
    rewrite made so that the exporter could convert the model (default: stderr)."""
    import tempfile

    import torch

    start = time.perf_counter()
    refuse_export_overwrite(config, Path(output))
    loaded = load_model(config.model.source, config.model.kwargs, config.inputs, config.axes)
    output_names = config.output_names() or loaded.output_names or returned_output_names(loaded, config)
    call = keyword_call(loaded, [s.name for s in config.inputs], output_names)
    args = export_inputs(loaded, config, seed)
    dry_run(call, args)
    tokenizer = tokenizer_source(config, loaded)
    output = Path(output)
    with tempfile.TemporaryDirectory(prefix="trtforge-export-") as tmp:
        raw = Path(tmp) / "raw.onnx"
        rewrites = _run_exporter(module_to_export(loaded, call), args, config, output_names, raw)
        for rewrite in rewrites:
            (note or stderr_note)(f"{config.export.exporter} exporter: {rewrite}.")
        model = load_onnx(raw)
        repairs: list[str] = []
        if config.export.exporter == "dynamo":
            model, repairs = conform_to_opset(model, config.export.opset)
        strip_wrapper_scope(model)
        save_onnx(model, raw)
        # ORT must see the final file layout; check the raw export, then save it atomically.
        checks = check_against_torch(raw, call, loaded, config, output_names, seed) if check else []
        rates = frame_rates(raw, config, loaded, output_names, seed)
        sidecar = {
            "kind": "onnx",
            "step": "export",
            "trtforge_version": __version__,
            "source": config.model.source,
            "config_name": config.name,
            "torch_version": torch.__version__,
            "exporter": config.export.exporter,
            "opset": default_opset(model),
            "exporter_repairs": repairs,
            "exporter_rewrites": rewrites,
            "inputs": [s.model_dump() for s in config.inputs],
            "axes": {k: v.model_dump() for k, v in config.axes.items()},
            "outputs": output_specs(model, config, loaded, rates),
            "tokenizer": None,
            "graph_hash": onnx_graph_hash(model),
            "check": [{"axis": c.axis, "size": c.size, "sizes": c.sizes, "metrics": c.metrics} for c in checks],
            "check_tolerance": config.export.tolerance,
            "checked": check,
        }
        save_onnx(model, output, external_data=True if config.export.external_data else None)
    if tokenizer is not None:
        folder = tokenizer_dir_for(output)
        save_tokenizer(tokenizer, folder)
        sidecar["tokenizer"] = folder.name
    seconds = time.perf_counter() - start
    sidecar["seconds"] = round(seconds, 3)
    write_sidecar(output, sidecar)
    return ExportResult(output, sidecar, checks, seconds)
