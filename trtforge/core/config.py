"""One typed config per model, loaded from YAML.

A config describes a model end to end: where it comes from, its inputs with named dynamic axes
(min/opt/max), and one section per pipeline step. Unknown keys are errors that name the file, the
key path and the closest valid key, because a misspelled key silently falling back to a default is
the worst failure a CI config can have.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from trtforge.core.errors import UserError

DTYPES = ("float32", "float16", "int64", "int32", "bool")


def _yaml_switch(value: Any) -> Any:
    """YAML 1.1 reads a bare on / off (and yes / no) as a boolean: take it back as the word the user wrote."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


# An auto|on|off config key; `fuse_gemm: off` in YAML arrives as False and means "off".
Switch = Annotated[Literal["auto", "on", "off"], BeforeValidator(_yaml_switch)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AxisRange(Strict):
    min: int = Field(ge=1)
    opt: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> "AxisRange":
        if not self.min <= self.opt <= self.max:
            raise ValueError(f"needs min <= opt <= max, got {self.min}/{self.opt}/{self.max}")
        return self


class InputSpec(Strict):
    name: str
    dtype: Literal["float32", "float16", "int64", "int32", "bool"] = "float32"
    # Each entry is a fixed size or the name of a dynamic axis declared under `axes`.
    shape: list[Annotated[int, Field(ge=1)] | str]
    # Values drawn for random test inputs: [low, high) for integers, [low, high] for floats.
    value_range: tuple[Annotated[float, Field(allow_inf_nan=False)], Annotated[float, Field(allow_inf_nan=False)]] = (0.0, 1.0)
    # Audio: the samples per second this input takes; WAV files at another rate are refused (never resampled).
    sample_rate: int | None = Field(None, ge=1)

    @field_validator("value_range")
    @classmethod
    def _low_high(cls, value: tuple[float, float]) -> tuple[float, float]:
        if value[0] > value[1]:
            raise ValueError(f"needs [low, high] with low <= high, got {list(value)}")
        return value


OUTPUT_KINDS = ("token", "pooled", "logits", "dense", "boxes")
BOX_KEYS = ("format", "scores", "activation", "no_object", "score_threshold")


class OutputSpec(Strict):
    """What an output means, which decides how chunks merge and which metric judges it:
    token: one vector per position of the sequence axis; pooled: one vector per sequence (never
    softmaxed); logits: class logits per sequence or image; dense: an image [N, C, H, W] at the
    input's resolution times `scale` (0.25 for a segmentation map at 1/4, 2 for super-resolution);
    boxes: a box per query [N, Q, 4] in `format`, scored by the output `scores` names ([N, Q, C] class
    logits or [N, Q] scores), compared and merged as detections (verify/boxes.py)."""

    name: str
    kind: Literal["token", "pooled", "logits", "dense", "boxes"] | None = None
    # Output size / input size along each spatial axis; dense outputs only.
    scale: float | None = Field(None, gt=0)
    # Input samples per output frame (wav2vec2: 320); token outputs only. Measured at export and checked against this.
    stride: int | None = Field(None, ge=1)
    # boxes only: the box coordinates' format; the output holding the class logits or scores; how those become
    # scores (softmax over classes, sigmoid per class, none: already scores); whether the last class is "no object"
    # (DETR, YOLOS); the score a box needs to count.
    format: Literal["cxcywh_norm", "xyxy_norm", "xyxy_px", "xywh_px"] | None = None
    scores: str | None = None
    activation: Literal["softmax", "sigmoid", "none"] = "softmax"
    no_object: bool = False
    score_threshold: float = Field(0.5, ge=0, le=1)

    @model_validator(mode="after")
    def _scale_for_dense(self) -> "OutputSpec":
        if self.scale is not None and self.kind not in (None, "dense"):
            raise ValueError(f"output '{self.name}': 'scale' applies to dense outputs only, not '{self.kind}'")
        if self.stride is not None and self.kind not in (None, "token"):
            raise ValueError(f"output '{self.name}': 'stride' applies to token outputs only, not '{self.kind}'")
        if self.kind == "boxes":
            for key in ("format", "scores"):
                if getattr(self, key) is None:
                    raise ValueError(f"output '{self.name}' is kind boxes and needs '{key}' (see docs/concepts/output-kinds.md)")
        else:
            given = [k for k in BOX_KEYS if getattr(self, k) != type(self).model_fields[k].default]
            if given:
                raise ValueError(f"output '{self.name}': '{given[0]}' applies to boxes outputs only, not '{self.kind}'")
        return self

    def box_keys(self) -> dict[str, Any]:
        """A boxes output's keys, as the export sidecar carries them (verify/boxes.BoxSpec reads them)."""
        return {key: getattr(self, key) for key in BOX_KEYS}


class SourceSpec(Strict):
    # A built-in model name, `path/to/file.py:factory`, a TorchScript file or an ExportedProgram (.pt2).
    source: str
    # Passed to a `file.py:factory` factory as keyword arguments.
    kwargs: dict[str, Any] = Field(default_factory=dict)
    # A local Hugging Face tokenizer directory (relative paths from the working directory); else the
    # tokenizer the factory returns, if any.
    tokenizer: str | None = None


Size = Annotated[int, Field(ge=1)]
# A rel-L2 tolerance: above 0, and below 1, where an all-zero output (rel-L2 exactly 1) would pass.
Tolerance = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]


class ExportSection(Strict):
    opset: int = Field(17, ge=7)
    exporter: Literal["legacy", "dynamo"] = "legacy"
    # Sizes per dynamic axis at which ONNX Runtime is checked against PyTorch, one axis varied at a time: at least
    # two distinct sizes each (unless the axis range holds one size), inside the axis range. One size would pass an
    # exporter that baked that size into the graph as a constant (the failure the check exists to catch).
    check_sizes: dict[str, list[Size]] = Field(default_factory=dict)
    # rel-L2 between torch and ORT outputs above which export fails.
    tolerance: Tolerance = 1e-4
    # External data is used automatically above 2 GB; force it with true.
    external_data: bool = False

    @field_validator("opset")
    @classmethod
    def _known_opset(cls, value: int) -> int:
        try:
            import onnx.defs

            newest = onnx.defs.onnx_opset_version()
        except ImportError:  # the ONNX package is checked where it is needed
            return value
        if value > newest:
            raise ValueError(f"must be at most {newest} (the newest opset the installed onnx {onnx.__version__} knows)")
        return value


class CleanSection(Strict):
    # Constants larger than this are not folded (they would bloat the file).
    fold_size_limit_mb: float = Field(64.0, gt=0)
    tolerance: Tolerance = 1e-5
    # Whose ONNX parser the cleaned graph is rewritten for (trtforge.graph.slim): trt8 (TensorRT 8.6), rtx (TensorRT-RTX),
    # none (no rewrites); auto: the TensorRT the build would load (the pipeline's --backend), trt8 where there is none.
    parser: Literal["auto", "trt8", "rtx", "none"] = "auto"


class CalibrateSection(Strict):
    data: str | None = None
    method: Literal["entropy", "percentile", "minmax"] = "entropy"
    percentile: float = Field(99.99, gt=0, le=100)
    num_bins: int = Field(2048, ge=256, le=1 << 20)
    batch_size: int = Field(16, ge=1)
    max_samples: int | None = Field(None, ge=1)
    smooth: float | None = Field(None, ge=0, le=1)
    eval_data: str | None = None
    min_cosine: float = Field(0.99, ge=-1, le=1)
    # Task-aware gates on held-out data: argmax agreement of logits outputs, per-pixel argmax agreement
    # of dense outputs. Unset: reported, not gated.
    min_top1_agreement: float | None = Field(None, ge=0, le=1)
    min_pixel_agreement: float | None = Field(None, ge=0, le=1)
    min_int8_flops: float = Field(0.8, ge=0, le=1)


class BuildSection(Strict):
    precision: Literal["fp32", "fp16", "int8", "best"] = "fp32"
    # Tier upper bounds per dynamic axis, e.g. {seq: [128, 512, 2048]}.
    tiers: dict[str, Annotated[list[Size], Field(min_length=1)]] = Field(default_factory=dict)
    workspace_mb: int | None = Field(None, ge=1)
    optimization_level: int | None = Field(None, ge=0, le=5)
    timing_cache: str | None = None
    tactic_sources: str | None = None
    hardware_compatibility: Literal["none", "ampere_plus", "same_compute_capability"] = "none"
    version_compatible: bool = False
    compute_capabilities: list[str] = Field(default_factory=list)
    # Attention fusion (trtforge.fusion): auto = where the installed TensorRT runs a fused kernel it would not pick.
    fuse_attention: Switch = "auto"
    # bias+GELU pass: auto = TensorRT 8.x fp16 builds, where the plugin measured faster (docs/performance.md#fusion-passes-auto-modes).
    fuse_gelu: Switch = "auto"
    fuse_skip_layernorm: Switch = "auto"
    # fp16 MatMuls by constant weights as TrtforgeGemm (cuBLASLt, timed per shape): auto = fp16 builds, measured faster.
    fuse_gemm: Switch = "auto"
    # How the attention pass writes each packed QKV projection: MatMul + Reshape, or a 1x1 Conv on [tokens, E, 1, 1].
    # auto: matmul where the GEMM pass takes it into TrtforgeGemm (fp16 with libtrtforge_plugins), else conv.
    qkv_projection: Literal["auto", "matmul", "conv"] = "auto"
    # Shared libraries of TensorRT plugin creators to load first (libtrtforge_plugins.so: cuDNN flash attention).
    plugin_libraries: list[str] = Field(default_factory=list)
    # The GEMM plugins' arithmetic in fp16 builds: fp8 runs them on e4m3 operands (TrtforgeGemmFp8; compute capability
    # 8.9+), gated on the engine: its held-out mean cosine against ONNX Runtime fp32 must reach fp8_min_cosine.
    gemm_precision: Literal["fp16", "fp8"] = "fp16"
    fp8_min_cosine: float = Field(0.99, gt=0, le=1)  # a gate at or below 0 could not fail
    # With fp8, the top-1 agreement of logits outputs on the same feeds; unset: reported, not gated.
    fp8_min_top1_agreement: float | None = Field(None, gt=0, le=1)
    # Real inputs (calibrate's data formats) for the magnitudes the fp16 conversion guards and FP8's scales come from;
    # unset: the data of a calibration cache beside the model, else random feeds.
    calib_data: str | None = None
    # With fp8, FC1 writes e4m3 straight into FC2 (no fp16 FFN activation, no conversion). auto: wherever a pair exists
    # (faster than unchained at the same accuracy; docs/performance.md#fp8-defaults); on: a model without a pair
    # is an error; off: each GEMM converts its own input.
    fp8_chain_ffn: Switch = "auto"


class RunSection(Strict):
    inputs: str | None = None
    chunk: int | None = Field(None, ge=1)
    overlap: int = Field(0, ge=0)
    batch_size: int = Field(8, ge=1)
    merge: Literal["center", "linear", "cosine", "gaussian"] = "center"
    last_window: Literal["full", "short"] = "full"  # a sequence's last window: full length, ending at its end, or the remainder
    warmup: int = Field(2, ge=0)
    max_rel_l2: float = Field(1e-2, gt=0, allow_inf_nan=False)
    min_cosine: float = Field(0.99, ge=-1, le=1)
    # Floor on the pooled cosine of chunked+merged vs whole; unset: reported, not gated.
    min_chunk_cosine: float | None = Field(None, ge=-1, le=1)
    # Task-aware gates on the precision error (target vs ORT fp32): top-1 agreement of logits outputs,
    # per-pixel argmax agreement of dense outputs.
    min_top1_agreement: float | None = Field(None, ge=0, le=1)
    min_pixel_agreement: float | None = Field(None, ge=0, le=1)
    # Detectors (boxes outputs): the overlap of image slices as a share of the slice size (SAHI's overlap ratio; sets
    # `overlap`), how the slices' boxes merge (nms or greedy merging, class by class) and the IoU at which they do.
    slice_overlap: float | None = Field(None, ge=0, lt=1)
    box_merge: Literal["nms", "greedy"] = "nms"
    iou: float = Field(0.5, gt=0, le=1)
    # Box gates: recall of the reference boxes and mean IoU of the matched ones, target vs ORT fp32 (default 0.9 each
    # where the model has a boxes output) and sliced vs whole (unset: reported, not gated).
    min_box_recall: float | None = Field(None, ge=0, le=1)
    min_matched_iou: float | None = Field(None, ge=0, le=1)
    min_chunk_box_recall: float | None = Field(None, ge=0, le=1)
    min_chunk_matched_iou: float | None = Field(None, ge=0, le=1)
    reference: str | None = None
    report: str | None = None


class CacheRange(Strict):
    """A cache-length range; unlike other axes it may start at 0 (the first chunk has no past)."""

    min: int = Field(0, ge=0)
    opt: int = Field(512, ge=0)
    max: int = Field(1024, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> "CacheRange":
        if not self.min <= self.opt <= self.max:
            raise ValueError(f"needs min <= opt <= max, got {self.min}/{self.opt}/{self.max}")
        return self


class KVCacheSection(Strict):
    """Export a causal decoder with explicit past/present key-value tensors (trtforge/kvcache.py)."""

    enabled: bool = False
    # Name of the cache-length axis of past_key_<i>/past_value_<i> [batch, kv_heads, past, head_dim].
    past_axis: str = "past"
    past: CacheRange = Field(default_factory=CacheRange)
    # Build tiers: upper bounds of the past axis (0 gives a profile for the first chunk) and of the
    # chunk (seq) axis for prefill profiles; one decode profile (seq = 1) is always added.
    past_tiers: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    seq_tiers: list[Size] = Field(default_factory=list)
    # Sizes at which the export check varies the past axis (>= 2; 0 included by default).
    check_past: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)


class ModelConfig(Strict):
    name: str
    model: SourceSpec
    inputs: list[InputSpec]
    axes: dict[str, AxisRange] = Field(default_factory=dict)
    # Names, or {name, kind, scale} mappings (OutputSpec); a bare name leaves the kind to be inferred.
    outputs: list[OutputSpec] = Field(default_factory=list)
    export: ExportSection = Field(default_factory=ExportSection)
    clean: CleanSection = Field(default_factory=CleanSection)
    calibrate: CalibrateSection = Field(default_factory=CalibrateSection)
    build: BuildSection = Field(default_factory=BuildSection)
    run: RunSection = Field(default_factory=RunSection)
    kv_cache: KVCacheSection = Field(default_factory=KVCacheSection)

    @field_validator("outputs", mode="before")
    @classmethod
    def _names_to_specs(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"name": v} if isinstance(v, str) else v for v in value]
        return value

    def output_names(self) -> list[str]:
        return [o.name for o in self.outputs]

    @model_validator(mode="after")
    def _axes_declared(self) -> "ModelConfig":
        self._names_unique()
        self._boxes_scores_declared()
        for spec in self.inputs:
            for dim in spec.shape:
                if isinstance(dim, str) and dim not in self.axes:
                    raise ValueError(f"input '{spec.name}' uses axis '{dim}' which is not declared under 'axes'")
        self._check_sizes_valid()
        for axis in self.build.tiers:
            if axis not in self.axes:
                raise ValueError(
                    f"build.tiers names axis '{axis}' which is not declared under 'axes' (declared: {', '.join(self.axes) or 'none'})"
                )
        return self

    def _names_unique(self) -> None:
        """Inputs and outputs are looked up by name: a name given twice is refused."""
        for what, names in (("inputs", [s.name for s in self.inputs]), ("outputs", self.output_names())):
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f"{what} names '{repeated[0]}' more than once")

    def _boxes_scores_declared(self) -> None:
        """A boxes output names another declared output as its scores, and that one takes its kind from it."""
        for i, out in enumerate(self.outputs):
            if out.kind == "boxes":
                j = next((j for j, o in enumerate(self.outputs) if o.name == out.scores), None)
                if j is None or j == i:
                    raise ValueError(
                        f"outputs.{i}.scores names '{out.scores}', which is not another declared output "
                        f"(outputs: {', '.join(self.output_names())}); name the output holding the class logits or scores"
                    )
                if self.outputs[j].kind is not None:
                    raise ValueError(
                        f"outputs.{j}.kind: output '{out.scores}' holds the scores of boxes output '{out.name}' and takes "
                        f"its kind from it; drop its kind '{self.outputs[j].kind}'"
                    )

    def _check_sizes_valid(self) -> None:
        """export.check_sizes names declared axes, within their ranges, with two sizes where the range has two."""
        for axis, sizes in self.export.check_sizes.items():
            if axis not in self.axes:
                raise ValueError(f"export.check_sizes names axis '{axis}' which is not declared under 'axes'")
            rng = self.axes[axis]
            outside = [n for n in sizes if not rng.min <= n <= rng.max]
            if outside:
                raise ValueError(f"export.check_sizes.{axis} has {outside} outside the axis range {rng.min}..{rng.max}")
            if len(set(sizes)) < min(2, rng.max - rng.min + 1):
                raise ValueError(
                    f"export.check_sizes.{axis} needs at least two different sizes (got {sizes}): one size "
                    "cannot show that the exported graph follows the axis"
                )

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """{input name: {dim index: axis name}} for torch.onnx.export."""
        return {spec.name: {i: d for i, d in enumerate(spec.shape) if isinstance(d, str)} for spec in self.inputs}

    def check_sizes_for(self, axis: str) -> list[int]:
        """Sizes to test an axis at: from the config, else min-ish and a larger odd size within range."""
        if axis in self.export.check_sizes:
            return self.export.check_sizes[axis]
        rng = self.axes[axis]
        small = max(rng.min, min(rng.opt, 7 if rng.max >= 7 else rng.min))
        large = min(rng.max, max(small + 1, rng.opt + 3))
        return sorted({small, large})


# ---------------------------------------------------------------------------------------------
# Loading, with errors that name the file, the key and the closest valid key


def _valid_keys(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The field names valid at `path` (the location of an unknown key) in the model tree."""
    current: Any = model
    for part in path[:-1]:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if isinstance(current, type) and issubclass(current, BaseModel) else None
        if field is None:
            return []
        annotation = field.annotation
        current = _unwrap(annotation)
        if current is None:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """The BaseModel class inside list[X], dict[str, X] or X | None, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _unwrap(arg)
        if found is not None:
            return found
    return None


def requirement(error: dict[str, Any]) -> str:
    """A pydantic error as what the value must be ('must be greater than 0'), shared by config keys and flags."""
    msg = error["msg"].removeprefix("Value error, ")
    if msg.startswith("Input should be "):
        return "must be " + msg.removeprefix("Input should be ")
    if msg.startswith("must "):
        return msg
    return f"is invalid: {msg}"


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


_UNION_TAGS = {"str", "int", "float", "bool", "constrained-int", "constrained-float", "constrained-str"}


def _describe(error: dict[str, Any], source: str) -> str:
    # pydantic adds the member of a union it tried (shape entries are int | str) to the location: not a key
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and (p in _UNION_TAGS or p.startswith("function-"))))
    key = ".".join(str(p) for p in loc)
    if error["type"] == "extra_forbidden":
        valid = _valid_keys(ModelConfig, loc)
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys here: {', '.join(valid)}."
        return f"{source}: unknown config key '{key}'{hint}"
    if error["type"] == "missing":
        return f"{source}: config key '{key}' is required; add it."
    where = f"config key '{key}'" if key else "config"
    got = (
        f", got {_shown(error['input'])}"
        if error["type"] not in ("value_error", "assertion_error") and isinstance(error.get("input"), (int, float, str))
        else ""
    )
    return f"{source}: {where} {requirement(error)}{got}."


def field_info(dotted: str) -> Any:
    """The pydantic FieldInfo of a config key ('calibrate.percentile')."""
    model: Any = ModelConfig
    *parents, leaf = dotted.split(".")
    for part in parents:
        model = _unwrap(model.model_fields[part].annotation)
    return model.model_fields[leaf]


def check_option(dotted: str, value: Any, flag: str) -> Any:
    """A command-line value checked against its config key's constraints, with the sentence a config would get:
    '--percentile must be less than or equal to 100, got 150 (config key calibrate.percentile).'"""
    if value is None:
        return None
    from pydantic import TypeAdapter

    info = field_info(dotted)
    annotation = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    try:
        checked = TypeAdapter(annotation).validate_python(value)
    except ValidationError as exc:
        raise UserError(f"{flag} {requirement(exc.errors()[0])}, got {_shown(value)} (config key {dotted}).") from None
    for validator in _FIELD_CHECKS.get(dotted, ()):
        try:
            checked = validator(checked)
        except ValueError as exc:
            raise UserError(f"{flag} {requirement({'msg': str(exc)})}, got {_shown(value)} (config key {dotted}).") from None
    return checked


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error (PyYAML keeps the last silently, so a
    pasted second `tolerance:` would quietly win)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key '{key}' (first on line {first + 1})", key_node.start_mark
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def config_from_dict(data: Any, source: str = "<config>") -> ModelConfig:
    if not isinstance(data, dict):
        raise UserError(f"{source}: the config must be a YAML mapping of keys to values.")
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise UserError(_describe(exc.errors()[0], source)) from None


def load_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file {path} does not exist; pass a path to a YAML config.")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.constructor.ConstructorError as exc:
        if exc.problem and exc.problem.startswith("duplicate key"):
            line = exc.problem_mark.line + 1 if exc.problem_mark else "?"
            raise UserError(f"{path}:{line}: {exc.problem}; keep one of them.") from None
        raise UserError(f"{path}: not valid YAML ({_yaml_reason(exc)}); fix the syntax.") from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{path}: not valid YAML ({_yaml_reason(exc)}); fix the syntax.") from None
    except OSError as exc:
        raise UserError(f"cannot read config file {path}: {exc.strerror or exc}.") from None
    return config_from_dict(data, str(path))


def _yaml_reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return " ".join(str(exc).split())[:200] or type(exc).__name__


_FIELD_CHECKS = {"export.opset": (ExportSection._known_opset,)}


def apply_overrides(config: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    """Return a copy with dotted keys (`export.opset`) set; None values mean 'flag not given'."""
    data = config.model_dump()
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return config_from_dict(data, "command-line flags")
