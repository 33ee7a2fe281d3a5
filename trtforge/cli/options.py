"""Option checks shared by the commands: each value is checked when parsed, with the sentence its config key
would get; and how a command finds its config."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trtforge.core.errors import UserError

JsonOpt = typer.Option(False, "--json", help="Print the result as JSON on stdout.")


# -- option checks: each value is checked when parsed, with the sentence its config key would get -----------------


def config_key(dotted: str, flag: str):
    """A typer callback checking a flag's value against its config key's constraints (trtforge.config.check_option)."""

    def check(value):
        if value is None:
            return None
        from trtforge.core.config import check_option

        return check_option(dotted, value, flag)

    return check


def at_least(low: float, flag: str):
    """A typer callback: the value must be >= low (None: not given)."""

    def check(value):
        if value is not None and value < low:
            raise UserError(f"{flag} must be at least {low:g}, got {value:g}.")
        return value

    return check


def between(low: float, high: float, flag: str):
    def check(value):
        if value is not None and not low <= value <= high:
            raise UserError(f"{flag} must be between {low:g} and {high:g}, got {value:g}.")
        return value

    return check


def one_of(choices: tuple[str, ...], flag: str):
    def check(value):
        if value is not None and value not in choices:
            raise UserError(f"{flag} must be one of {', '.join(choices)}, got '{value}'.")
        return value

    return check


def folder(flag: str):
    """A typer callback: an output folder that is a folder or can be created (no file in the way)."""

    def check(value):
        if value is None:
            return None
        probe = Path(value)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            raise UserError(f"{flag} {value}: {probe} is a file, not a folder; choose another folder.")
        return value

    return check


def existing_file(flag: str):
    def check(value):
        if value is not None and not Path(value).is_file():
            what = "a folder, not a file" if Path(value).is_dir() else "does not exist"
            raise UserError(f"{flag} {value} {what}; pass an existing file.")
        return value

    return check


def check_providers(values):
    """--provider: each must be one ONNX Runtime offers here; an unavailable one would silently run on the CPU."""
    if not values:
        return values
    try:
        import onnxruntime as ort
    except ImportError:
        raise UserError("--provider needs onnxruntime; install it (pip install onnxruntime).") from None
    available = ort.get_available_providers()
    for name in values:
        if name not in available:
            raise UserError(
                f"--provider {name} is not offered by this onnxruntime (it offers {', '.join(available)}); "
                "pick one of those or install the onnxruntime build that has it."
            )
    return values


def pipeline_step(flag: str):
    """--from/--only: a pipeline step, checked before the config is read (Pipeline.execute says the same)."""

    def check(value):
        from trtforge.pipeline import STEPS

        if value is not None and value not in STEPS:
            raise UserError(f"{flag} '{value}' is not a step; use one of {', '.join(STEPS)}.")
        return value

    return check


BACKENDS = ("auto", "tensorrt", "tensorrt_rtx")


def resolve_config(model: Optional[str], config: Optional[Path]):
    """The config from --config, else the built-in one for a built-in --model, else None."""
    from trtforge.core.config import apply_overrides, load_config
    from trtforge.models import BUILTIN_NAMES, builtin_config_path

    if config is not None:
        cfg = load_config(config)
        return apply_overrides(cfg, {"model.source": model}) if model else cfg
    if model is None:
        raise UserError("no model given; pass --model NAME|file.py:factory|file.pt2 or --config configs/NAME.yaml.")
    if model in BUILTIN_NAMES:
        return load_config(builtin_config_path(model))
    return None


def positive(value: Optional[int], flag: str) -> Optional[int]:
    if value is not None and value < 1:
        raise UserError(f"{flag} must be at least 1, got {value}.")
    return value


def builtin_section(onnx_path: Path, section: str):
    """The built-in config's section for a model exported from a built-in (by its sidecar), else None."""
    from trtforge.core.artifacts import read_sidecar
    from trtforge.core.config import load_config
    from trtforge.models import BUILTIN_NAMES, builtin_config_path

    try:
        side = read_sidecar(onnx_path, required=False) or {}
    except UserError:
        return None
    source = side.get("source")
    return getattr(load_config(builtin_config_path(source)), section) if source in BUILTIN_NAMES else None


def section_for_target(target: Path):
    """The built-in config's run section for an engine/ONNX made from a built-in model."""
    from trtforge.core.artifacts import read_sidecar

    try:
        side = read_sidecar(target, required=False) or {}
    except UserError:
        return None
    source_onnx = side.get("reference_onnx") or side.get("source_onnx")
    if side.get("source") is None and source_onnx:
        return builtin_section(Path(source_onnx), "run")
    return builtin_section(target, "run")
