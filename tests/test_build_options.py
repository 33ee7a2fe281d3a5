"""build.options_from_config: the one mapping from a config's `build` section (and the CLI's flags) to BuildOptions,
which the CLI and `pipeline` share. Before it, pipeline built its own and dropped build.gemm_precision."""

from dataclasses import fields
from pathlib import Path

from trtforge.backends.tensorrt import BuildOptions
from trtforge.build.step import options_from_config
from trtforge.core.config import BuildSection

ROOT = Path(__file__).resolve().parent.parent


def test_every_build_key_reaches_the_options_and_flags_override_them():
    section = BuildSection(
        workspace_mb=512,
        optimization_level=5,
        timing_cache="t.cache",
        tactic_sources="-CUDNN",
        hardware_compatibility="ampere_plus",
        version_compatible=True,
        compute_capabilities=["SM89"],
        fuse_attention="off",
        fuse_gelu="on",
        fuse_skip_layernorm="off",
        fuse_gemm="on",
        qkv_projection="conv",
        plugin_libraries=["lib.so"],
        gemm_precision="fp8",
        fp8_min_cosine=0.95,
        fp8_chain_ffn="on",
        fp8_min_top1_agreement=0.9,
        calib_data="calib_data/images",
    )
    options = options_from_config(section)
    shared = {f.name for f in fields(BuildOptions)} & set(BuildSection.model_fields)
    defaults = BuildOptions()
    for key in shared:  # every key the section sets differently from the default arrives
        want = Path(getattr(section, key)) if key == "timing_cache" else getattr(section, key)
        assert getattr(options, key) == want, key
        assert getattr(options, key) != getattr(defaults, key), f"the test leaves {key} at its default"
    flagged = options_from_config(section, fp8_min_cosine=0.999, workspace_mb=None, tf32=True)
    assert (flagged.gemm_precision, flagged.fp8_min_cosine, flagged.workspace_mb, flagged.tf32) == ("fp8", 0.999, 512, True)


def test_an_fp8_gate_without_fp8_gemms_is_a_user_error():
    """--fp8-min-cosine (or the config key) with fp16 GEMMs would gate nothing: refused, not ignored."""
    import pytest

    from trtforge.core.errors import UserError

    with pytest.raises(UserError, match="--fp8-min-cosine"):
        options_from_config(BuildSection(gemm_precision="fp8", fp8_min_cosine=0.95), gemm_precision="fp16")
    with pytest.raises(UserError, match="build.fp8_min_cosine"):
        options_from_config(BuildSection(fp8_min_cosine=0.95))
    with pytest.raises(UserError, match="--fp8-min-top1-agreement \\(config key build.fp8_min_top1_agreement\\) gates FP8"):
        options_from_config(BuildSection(), fp8_min_top1_agreement=0.9)
    assert options_from_config(BuildSection(gemm_precision="fp8"), fp8_min_top1_agreement=0.9).fp8_min_top1_agreement == 0.9
    assert options_from_config(BuildSection()).fp8_min_cosine == 0.99  # the default alone is no request


def test_auto_is_the_configs_default_and_yaml_on_off_mean_the_words():
    """YAML 1.1 reads a bare on / off as a boolean; an auto|on|off key takes them back as the words."""
    import yaml

    assert options_from_config(BuildSection()).fp8_chain_ffn == "auto"
    section = BuildSection(**yaml.safe_load("fp8_chain_ffn: off\nfuse_gemm: on\nfuse_gelu: auto"))
    assert (section.fp8_chain_ffn, section.fuse_gemm, section.fuse_gelu) == ("off", "on", "auto")


def test_sample_batches_fit_the_models_batch_axis(tmp_path):
    """--calib-data's samples are stacked at most as many as the batch axis takes: a fixed leading size is whole in
    each sample (one per batch); a named axis takes max // the sample's rows."""
    import numpy as np

    from trtforge.build.precision import _batch_size, sample_feeds
    from trtforge.core.config import AxisRange, InputSpec

    ids = lambda lead: [InputSpec(name="input_ids", dtype="int64", shape=[lead, "seq"])]  # noqa: E731
    axes = {"batch": AxisRange(min=1, opt=2, max=2), "seq": AxisRange(min=1, opt=8, max=16)}
    one_row, two_rows = {"input_ids": np.zeros((1, 8))}, {"input_ids": np.zeros((2, 8))}
    assert _batch_size(ids(1), axes, 4, one_row) == 1 and _batch_size(ids(2), axes, 4, two_rows) == 1
    assert _batch_size(ids("batch"), axes, 4, one_row) == 2 and _batch_size(ids("batch"), axes, 4, two_rows) == 1
    wide = {**axes, "batch": AxisRange(min=1, opt=8, max=64)}
    assert _batch_size(ids("batch"), wide, 4, one_row) == 4 and _batch_size(ids("batch"), wide, 4, two_rows) == 4
    # sample_feeds stacks by it: tiny-fcn's images ([1, 3, H, W] each) for a model whose batch axis stops at 2
    image = lambda lead: [InputSpec(name="image", shape=[lead, 3, "height", "width"])]  # noqa: E731
    sides = {"height": AxisRange(min=16, opt=48, max=64), "width": AxisRange(min=16, opt=48, max=64)}
    data = ROOT / "calib_data" / "tiny_fcn"
    for lead, most in ((1, 1), ("batch", 2)):
        feeds, _ = sample_feeds(tmp_path / "m.onnx", None, image(lead), {**sides, "batch": axes["batch"]}, data)
        assert feeds and max(f["image"].shape[0] for f in feeds) == most
