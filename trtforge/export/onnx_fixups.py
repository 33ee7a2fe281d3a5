"""What export does to the exporter's ONNX before it is written: the opset the user asked for, attributes that opset lacks, the wrapper scope removed from names."""

from __future__ import annotations

from typing import Any

from trtforge.core.errors import UserError, exception_summary
from trtforge.models import LoadedModel


def default_opset(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def conform_to_opset(model: Any, opset: int) -> tuple[Any, list[str]]:
    """Bring the dynamo exporter's graph to the requested opset; returns it and what was repaired.

    torch's dynamo exporter only implements opset 18: asked for 17 (TensorRT 8.6 parses up to 17) it
    converts the graph down with onnx's version converter, and when that fails it silently keeps 18
    (transformers' ResNet). The converter itself leaves opset-18 attributes on nodes it converts:
    Split's `num_outputs` (GPT-2's attention) and ReduceMean's `noop_with_empty_axes` (ResNet's
    pooling), which the older schemas do not define, so ONNX Runtime refuses the graph ("invalid
    model"). Both are dropped: Split-13 without `split` cuts into as many equal parts as it has
    outputs, and noop_with_empty_axes=0 is opset 13's behaviour. Any semantic change would show in the
    export check against PyTorch that follows."""
    from onnx import version_converter

    repairs = []
    exported = default_opset(model)
    if exported > opset:
        try:
            model = version_converter.convert_version(model, opset)
        except Exception as exc:
            raise UserError(
                f"the dynamo exporter produced opset {exported} and converting it to opset {opset} failed: "
                f"{exception_summary(exc)}; export with --opset {exported} (TensorRT 8.6 parses up to 17)."
            ) from None
        repairs.append(f"converted opset {exported} to {opset}")
    dropped = drop_unknown_attributes(model, opset)
    repairs += [f"dropped '{attr}' from {count} {op} node(s)" for (op, attr), count in sorted(dropped.items())]
    return model, repairs


def drop_unknown_attributes(model: Any, opset: int) -> dict[tuple[str, str], int]:
    """Remove attributes that the default-domain schema at `opset` does not define; count per (op, attr)."""
    from onnx import defs

    dropped: dict[tuple[str, str], int] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            known = set(defs.get_schema(node.op_type, opset).attributes)
        except Exception:
            continue
        unknown = [a for a in node.attribute if a.name not in known]
        if not unknown:
            continue
        kept = [a for a in node.attribute if a.name in known]
        del node.attribute[:]
        node.attribute.extend(kept)
        for attr in unknown:
            dropped[(node.op_type, attr.name)] = dropped.get((node.op_type, attr.name), 0) + 1
    return dropped


WRAPPER_SCOPE = "inner"  # the attribute under which KeywordCall holds the user's module


def strip_wrapper_scope(model: Any) -> None:
    """Give nodes, tensors and weights the names the user's own module has: the exporters prefix
    everything with the wrapper's attribute ('/inner/layer/Reshape_4', 'inner.layer.weight'), and
    these names appear in build errors and reports. A name is kept where stripping would collide."""
    scope_prefixes = (f"/{WRAPPER_SCOPE}/", f"{WRAPPER_SCOPE}.")
    graphs = [model.graph]
    names: set[str] = set()
    while graphs:  # every (sub)graph: node names, tensors, weights, value infos
        graph = graphs.pop()
        names.update(t.name for t in graph.initializer)
        names.update(v.name for v in graph.value_info)
        for node in graph.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
            graphs.extend(a.g for a in node.attribute if a.HasField("g"))
    renamed = {}
    for name in names:
        for prefix in scope_prefixes:
            if name.startswith(prefix):
                short = ("/" if prefix.startswith("/") else "") + name[len(prefix) :]
                if short not in names:
                    renamed[name] = short
    if renamed:
        _rename_everywhere(model.graph, renamed)


def _rename_everywhere(graph: Any, renamed: dict[str, str]) -> None:
    for tensor in list(graph.initializer) + list(graph.value_info):
        tensor.name = renamed.get(tensor.name, tensor.name)
    for node in graph.node:
        node.name = renamed.get(node.name, node.name)
        node.input[:] = [renamed.get(n, n) for n in node.input]
        node.output[:] = [renamed.get(n, n) for n in node.output]
        for attr in node.attribute:
            if attr.HasField("g"):
                _rename_everywhere(attr.g, renamed)


def module_to_export(loaded: LoadedModel, call: Any) -> Any:
    """The keyword call, except for TorchScript: the tracer refuses a loaded ScriptModule inside a Python
    module ("not part of the active trace"), and a ScriptModule is already called positionally, so
    it is exported as it is (its outputs are matched to the declared names by position)."""
    import torch

    return loaded.module if isinstance(loaded.module, torch.jit.ScriptModule) else call


def dry_run(call: Any, args: tuple) -> None:
    """Call the module once before exporting: a declared output it does not return is a UserError here,
    rather than an exception buried inside the exporter's trace."""
    import torch

    try:
        with torch.no_grad():
            call(*args)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"calling the model with its example inputs failed: {exception_summary(exc)}; fix the model or its example inputs."
        ) from None
