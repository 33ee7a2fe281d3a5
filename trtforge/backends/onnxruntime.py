"""ONNX Runtime runner: the reference every other result is checked against."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from trtforge.backends.base import RunnerLifecycle
from trtforge.core.errors import UserError


def session_options(threads: int | None = None):
    """Quiet sessions that run Q/DQ as written: fake quantization in float, the ONNX semantics TensorRT
    implements, not ONNX Runtime's fused int8 kernels, whose u8s8 path saturates on x86 CPUs without VNNI
    (onnxruntime 1.32 on the 2-core dev machine: rel-L2 0.27 on a 2-layer MLP whose Q/DQ graph is 0.012 from fp32)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    return options


class OrtRunner(RunnerLifecycle):
    def __init__(self, model: str | os.PathLike | bytes, providers: list[str] | None = None, threads: int | None = None):
        import onnxruntime as ort

        ort.set_default_logger_severity(3)
        options = session_options(threads)
        wanted = providers or ["CPUExecutionProvider"]
        wanted = [p for p in wanted if p in ort.get_available_providers()] or ["CPUExecutionProvider"]
        source = model if isinstance(model, bytes) else str(model)
        try:
            self.session = ort.InferenceSession(source, options, providers=wanted)
        except Exception as exc:
            name = "the in-memory model" if isinstance(model, bytes) else Path(str(model)).name
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"ONNX Runtime cannot load {name}: {first[:300]}") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.providers = self.session.get_providers()
        self._run_options = ort.RunOptions()
        self._run_options.log_severity_level = 4  # failures reach the caller as exceptions, not stderr

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        names = outputs or self.output_names
        values = self.session.run(names, {k: feeds[k] for k in self.input_names}, self._run_options)
        return dict(zip(names, values))

    def close(self) -> None:
        self.session = None  # ONNX Runtime frees the session's memory with the last reference
