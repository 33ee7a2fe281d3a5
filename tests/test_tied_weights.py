"""SmoothQuant on tied weights: a random-init ALBERT (one layer's weights shared by every layer) calibrates
with smoothing and its INT8 output stays within the gate (issue 10 done-when)."""

import numpy as np
import pytest

from trtforge.calibrate.options import CalibrateOptions
from trtforge.calibrate.step import calibrate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def albert_onnx(tmp_path_factory):
    from transformers import AlbertConfig, AlbertModel

    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=120,
        embedding_size=16,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    module = AlbertModel(config).eval()

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    folder = tmp_path_factory.mktemp("albert")
    path = folder / "albert.onnx"
    ids = torch.randint(5, 120, (2, 16))
    torch.onnx.export(
        Wrapper(),
        (ids, torch.ones_like(ids)),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        opset_version=17,
        dynamo=False,
        dynamic_axes={
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "last_hidden_state": {0: "batch", 1: "seq"},
        },
    )
    from trtforge.graph.index import clean_file

    clean_file(path)  # folds the exporter's Identity copies: every layer then reads the same initializers
    path = folder / "albert.clean.onnx"
    data = folder / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(24):
        n = 8 + 4 * (i % 3)
        np.savez(data / f"s{i}.npz", input_ids=rng.integers(5, 120, (1, n)).astype(np.int64), attention_mask=np.ones((1, n), np.int64))
    return path, data


def test_albert_shares_weights_and_smoothquant_int8_holds(albert_onnx, tmp_path):
    import onnx

    path, data = albert_onnx
    model = onnx.load(path)
    inits = {i.name for i in model.graph.initializer}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in inits:
            readers[node.input[1]] = readers.get(node.input[1], 0) + 1
    assert max(readers.values()) == 4  # the export really shares each weight across the 4 layers
    options = CalibrateOptions(
        data=data, method="percentile", smooth=0.8, fallback=False, min_cosine=0.99, output=tmp_path / "albert.int8.onnx"
    )
    result = calibrate(path, options)
    assert result.sidecar["smooth"] == 0.8
    assert result.result.accuracy.mean_cosine >= 0.99, result.result.accuracy
