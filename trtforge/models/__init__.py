"""Model sources: the embedded defaults, a user's `file.py:factory`, TorchScript and ExportedProgram.

Every source resolves to a `LoadedModel`: a torch module in eval mode plus example inputs keyed by
the ONNX input names. torch is imported lazily so the rest of trtforge works without it.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from trtforge.core.errors import UserError
from trtforge.models.loaded import LoadedModel

BUILTIN_CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def _builtin_factories() -> dict[str, Callable[..., LoadedModel]]:
    from trtforge.models import minilm, tiny_fcn

    return {"minilm": minilm.load, "tiny-fcn": tiny_fcn.load}


BUILTIN_NAMES = ("minilm", "tiny-fcn")


def builtin_config_path(name: str) -> Path:
    return BUILTIN_CONFIG_DIR / f"{name}.yaml"


def _require_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise UserError("PyTorch is not installed; install it with `pip install torch` (extra 'torch').") from None
    return torch


def load_model(
    source: str, kwargs: dict[str, Any] | None = None, inputs: list[Any] | None = None, axes: dict[str, Any] | None = None
) -> LoadedModel:
    """Resolve a model source string to a LoadedModel, or raise UserError naming what is wrong.

    `inputs` (the config's InputSpecs) and `axes` give serialized modules their example inputs and
    names: a TorchScript file carries none."""
    kwargs = kwargs or {}
    if source in BUILTIN_NAMES:
        return _builtin_factories()[source](**kwargs)
    path_part, sep, factory_name = source.rpartition(":")
    if sep and path_part.endswith(".py"):
        return _load_factory(Path(path_part), factory_name, kwargs, source)
    path = Path(source)
    if path.suffix == ".py":
        raise UserError(f"model source {source} names no factory; use {source}:FUNCTION_NAME.")
    if path.suffix in (".pt", ".pth", ".ts", ".pt2"):
        if not path.is_file():
            raise UserError(f"model file {path} does not exist; check the path.")
        return _load_serialized(path, inputs or [], axes or {})
    if not path.exists() and "/" not in source and "." not in source:
        raise UserError(f"unknown model '{source}'; built-in models are: {', '.join(BUILTIN_NAMES)}, or pass file.py:factory.")
    if not path.exists():
        raise UserError(f"model file {path} does not exist; check the path.")
    raise UserError(f"model source {source} is not a .py factory, TorchScript (.pt/.ts) or ExportedProgram (.pt2) file.")


def _load_factory(path: Path, factory_name: str, kwargs: dict[str, Any], source: str) -> LoadedModel:
    _require_torch()
    if not path.is_file():
        raise UserError(f"model file {path} does not exist; check the path in {source}.")
    spec = importlib.util.spec_from_file_location(f"trtforge_user_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as exc:
        raise UserError(f"importing {path} failed: {_last_frame(exc)}; fix the file.") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise UserError(f"{path} has no function '{factory_name}'; name an existing factory after the colon.")
    try:
        result = factory(**kwargs)
    except Exception as exc:
        raise UserError(f"factory {source} raised {_last_frame(exc)}; fix the factory.") from None
    return _as_loaded(result, source)


def _last_frame(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _as_loaded(result: Any, source: str) -> LoadedModel:
    """A factory returns (module, example_inputs[, output_names[, tokenizer]]), example_inputs a dict
    name -> tensor; the module is called with them as keyword arguments."""
    if isinstance(result, LoadedModel):
        return result
    torch = _require_torch()
    if not (isinstance(result, tuple) and len(result) in (2, 3, 4)):
        raise UserError(
            f"factory {source} must return (module, {{input_name: example_tensor}}[, output_names[, tokenizer]]), "
            f"got {type(result).__name__}."
        )
    module, examples = result[0], result[1]
    outputs = list(result[2] or []) if len(result) >= 3 else []
    tokenizer = result[3] if len(result) == 4 else None
    if not isinstance(module, torch.nn.Module):
        raise UserError(f"factory {source} returned {type(module).__name__} where a torch.nn.Module was expected.")
    if not isinstance(examples, dict) or not all(isinstance(v, torch.Tensor) for v in examples.values()):
        raise UserError(f"factory {source} must return example inputs as a dict of input name -> torch.Tensor.")
    return LoadedModel(module.eval(), examples, outputs, source, tokenizer)


def _load_serialized(path: Path, inputs: list[Any], axes: dict[str, Any]) -> LoadedModel:
    torch = _require_torch()
    if path.suffix == ".pt2":
        return _load_exported_program(torch, path, inputs)
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:
        raise UserError(f"{path} is not a loadable TorchScript file ({type(exc).__name__}); save it with torch.jit.save.") from None
    return LoadedModel(module.eval(), torchscript_examples(path, inputs, axes), [], str(path))


def torchscript_examples(path: Path, inputs: list[Any], axes: dict[str, Any]) -> dict[str, Any]:
    """Example inputs for a TorchScript module, which carries none: random tensors from the config's
    `inputs` (dtype, value_range) with every named axis at its opt size. TorchScript modules are
    called POSITIONALLY with them, in the order the config lists its inputs."""
    import torch

    from trtforge.runtime.feeds import random_feeds

    if not inputs:
        raise UserError(
            f"{path} is TorchScript, which carries no example inputs; give a config (--config) whose 'inputs' list "
            "the module's forward arguments in order, with their dtypes and shapes."
        )
    sizes = {name: rng.opt for name, rng in axes.items()}
    feeds = random_feeds(inputs, sizes, seed=0)
    return {spec.name: torch.from_numpy(feeds[spec.name]) for spec in inputs}


def _load_exported_program(torch: Any, path: Path, inputs: list[Any]) -> LoadedModel:
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise UserError(f"{path} is not a loadable ExportedProgram ({type(exc).__name__}); save it with torch.export.save.") from None
    args = program.example_inputs[0] if program.example_inputs else ()
    if not args:
        raise UserError(f"{path} carries no example inputs; wrap it in a file.py:factory that returns (module, example_inputs).")
    names = [spec.name for spec in inputs] or [f"input_{i}" for i in range(len(args))]
    module = program.module()
    module.trtforge_positional = True  # its example inputs are positional: export calls it that way
    return LoadedModel(module, dict(zip(names, args)), [], str(path))


def called_positionally(module: Any, input_names: list[str]) -> bool:
    """Whether `module` gets its inputs positionally (in the config's input order) rather than by keyword.

    Keywords wherever the forward accepts the input names (transformers 5 needs them: its decorators
    inject `use_cache` and friends, and GPT-2's second positional parameter is `past_key_values`, not
    the attention mask). Positionally for TorchScript and ExportedProgram modules, and for forwards
    whose parameter names differ from the input names (nn.Sequential's `input` fed as 'image')."""
    import inspect

    import torch

    if isinstance(module, torch.jit.ScriptModule) or getattr(module, "trtforge_positional", False):
        return True
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return False
    keyword_names = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return not set(input_names) <= keyword_names
