"""run's merger (Merger): every output of every input put back from batches of chunks, however the batches mix
inputs, split rows over threads, or order the windows. Checked against merging each input's windows on its own."""

from types import SimpleNamespace

import numpy as np
import pytest
from chunk_oracles import merge_windows

from trtforge.runtime.chunking import merge_pooled, plan_windows
from trtforge.runtime.documents import Chunk, Document
from trtforge.runtime.merge import Merger, kept_size, merge_document
from trtforge.runtime.outputs import OutputKind


def _plan(lengths, chunk=12, overlap=4, specials=(1, 1), full_last=False):
    docs, chunks = [], []
    for d, n in enumerate(lengths):
        docs.append(Document(f"d{d}", "text", {}, n))
        for i, w in enumerate(plan_windows(n, chunk - sum(specials), overlap, full_last)):
            chunks.append(Chunk(d, i, {}, w, w.length, slice(specials[0], specials[0] + w.length)))
    return docs, chunks


def _outputs(batch, rng, width=12):
    """Token outputs [B, width, 3] (positions past a window's content hold NaN) and a pooled [B, 3]."""
    tokens = np.full((len(batch), width, 3), np.nan, np.float32)
    for j, c in enumerate(batch):
        tokens[j, c.content] = rng.standard_normal((c.tokens, 3))
    return {"last_hidden_state": tokens, "pooler_output": rng.standard_normal((len(batch), 3)).astype(np.float32)}


@pytest.mark.parametrize("full_last", [True, False])
@pytest.mark.parametrize("merge", ["center", "linear"])
@pytest.mark.parametrize("order", ["in_order", "shuffled"])
def test_batches_mixing_inputs_merge_like_each_input_alone(merge, order, full_last):
    docs, chunks = _plan([40, 9, 23, 30], full_last=full_last)  # the 9-token input is one window
    rng = np.random.default_rng(1)
    kinds = {"last_hidden_state": OutputKind("last_hidden_state", "token"), "pooler_output": OutputKind("pooler_output", "pooled")}
    merger = Merger(docs, chunks, kinds, SimpleNamespace(merge=merge, chunk=12, overlap=4))
    if merge == "center":
        for d in range(len(docs)):
            merger.prepare([c for c in chunks if c.doc == d])  # run's planning threads page the outputs in
    index = np.arange(len(chunks)) if order == "in_order" else rng.permutation(len(chunks))
    parts: dict[tuple[int, str], list] = {}
    for start in range(0, len(chunks), 5):  # batches of 5 straddle inputs; rows merged in two groups, like 2 threads
        batch = [chunks[k] for k in index[start : start + 5]]
        out = _outputs(batch, rng)
        for j, c in enumerate(batch):
            parts.setdefault((c.doc, "t"), []).append((c, out["last_hidden_state"][j, c.content]))
            parts.setdefault((c.doc, "p"), []).append((c, out["pooler_output"][j]))
        for rows in ([0, 1, 2], [3, 4]):
            merger.add(batch, {k: v.copy() for k, v in out.items()}, [r for r in rows if r < len(batch)], copy=True)
    merged = merger.results()
    for d, doc in enumerate(docs):
        t = sorted(parts[(d, "t")], key=lambda p: p[0].index)
        expected = merge_windows([v for _, v in t], [c.window for c, _ in t], doc.length, merge)
        np.testing.assert_allclose(merged[d]["last_hidden_state"], expected, rtol=1e-6, atol=1e-6)
        assert not np.isnan(merged[d]["last_hidden_state"]).any()
        p = sorted(parts[(d, "p")], key=lambda p: p[0].index)
        np.testing.assert_allclose(
            merged[d]["pooler_output"], merge_pooled([v for _, v in p], [kept_size(c.window) for c, _ in p]), rtol=1e-6
        )


def test_center_merge_copies_a_run_of_windows_at_once(monkeypatch):
    """Under 'center', a batch's consecutive windows of one input are merged by one StreamingMerge.take."""
    import trtforge.runtime.chunking as chunking

    docs, chunks = _plan([60, 30])
    calls = []
    take = chunking.StreamingMerge.take
    monkeypatch.setattr(
        chunking.StreamingMerge,
        "take",
        lambda self, first, source, offsets: (calls.append((first, len(offsets))), take(self, first, source, offsets))[1],
    )
    kinds = {"last_hidden_state": OutputKind("last_hidden_state", "token")}
    merger = Merger(docs, chunks, kinds, SimpleNamespace(merge="center", chunk=12, overlap=4))
    first_doc = [c for c in chunks if c.doc == 0]
    batch = first_doc[2:6] + [c for c in chunks if c.doc == 1][:2] + [first_doc[7]]
    merger.add(batch, _outputs(batch, np.random.default_rng(0)))
    assert calls == [(2, 4), (0, 2), (7, 1)]


@pytest.mark.parametrize("full_last", [True, False])
@pytest.mark.parametrize("length", [477, 1000, 4000])
def test_a_pooled_output_weighs_each_window_by_what_it_keeps(length, full_last):
    """A mean-pooled output over MiniLM's windows (254 tokens, overlap 32): chunks weighted by the positions they
    keep give the document's mean; weighted by their length, a full-length last window (mostly a repeat of its
    neighbour) counted the document's end twice (0.077 of the ramp's range at 477 tokens, 0.043 at 1,000)."""
    docs, chunks = _plan([length], chunk=256, overlap=32, full_last=full_last)
    signal = np.arange(length, dtype=np.float64)[:, None] * np.ones((1, 3))
    parts = [(c, signal[c.window.start : c.window.end].mean(axis=0)) for c in chunks]
    merged = merge_document(docs[0], OutputKind("pooler_output", "pooled"), parts, SimpleNamespace(merge="center"))
    truth = signal.mean(axis=0)
    assert np.abs(merged - truth).max() / length < 0.01  # errors relative to the ramp's range


def test_a_token_output_shorter_than_its_windows_is_refused():
    """One np.take per run checks only the batch's bounds; a row shorter than its window would be filled from the
    next row, so each row is checked (as add checks each window)."""
    docs, chunks = _plan([60])
    kinds = {"last_hidden_state": OutputKind("last_hidden_state", "token")}
    merger = Merger(docs, chunks, kinds, SimpleNamespace(merge="center", chunk=12, overlap=4))
    batch = chunks[:3]
    short = {"last_hidden_state": np.zeros((3, 10, 3), np.float32)}  # the windows need positions 1..11
    with pytest.raises(ValueError, match="has 10 positions per row"):
        merger.add(batch, short, [0, 1])


@pytest.mark.parametrize("merge", ["center", "linear"])
def test_each_input_is_handed_on_once_when_finished_and_its_memory_serves_later_inputs(merge):
    """With on_done (run's path), an input goes to on_done as soon as its last chunk is merged, exactly once, with
    what results() gives, and once released its pooled memory holds later inputs' outputs: batches straddle inputs,
    rows are split over "threads", and the first inputs' memory is dirty when the later ones reuse it."""
    from trtforge.runtime.outpool import OutputPool

    lengths = [40, 9, 23, 30, 55, 41, 26, 33]
    docs, chunks = _plan(lengths)
    kinds = {"last_hidden_state": OutputKind("last_hidden_state", "token"), "pooler_output": OutputKind("pooler_output", "pooled")}
    options = SimpleNamespace(merge=merge, chunk=12, overlap=4)
    rng = np.random.default_rng(3)
    batches = [chunks[k : k + 5] for k in range(0, len(chunks), 5)]
    outs = [_outputs(b, rng) for b in batches]
    reference = Merger(docs, chunks, kinds, options)  # no pool, no on_done: every input kept to the end
    for b, o in zip(batches, outs):
        reference.add(b, o)
    expected = reference.results()

    pool, got, finished_after = OutputPool(), {}, {}

    def on_done(d, outputs, release):
        assert d not in got, f"input {d} handed on twice"
        got[d] = {k: v.copy() for k, v in outputs.items()}
        finished_after[d] = batch_no
        for v in outputs.values():  # what an earlier input leaves behind in memory a later one reuses
            if np.issubdtype(v.dtype, np.floating) and v.ndim == 2 and v.base is not None:
                v[...] = np.nan
        release()

    merger = Merger(docs, chunks, kinds, options, pool=pool, on_done=on_done)
    for batch_no, (b, o) in enumerate(zip(batches, outs)):
        for rows in ([0, 1, 2], [3, 4]):
            merger.add(b, {k: v.copy() for k, v in o.items()}, [r for r in rows if r < len(b)], copy=True)
    assert sorted(got) == list(range(len(docs))) and merger.finished == len(docs)
    for d in range(len(docs)):
        last = max(i for i, b in enumerate(batches) if any(c.doc == d for c in b))
        assert finished_after[d] == last  # handed on with its last batch, not at the end
        for name in kinds:
            np.testing.assert_array_equal(got[d][name], expected[d][name], err_msg=f"input {d} {name}")
    assert pool.report()["reused"] > 0


def test_two_threads_finishing_one_input_at_once_hand_it_on_exactly_once():
    """run's merge threads take halves of a batch (or consecutive batches) at the same moment; the input whose last
    chunks they merge must be handed on once, by whichever finishes last, with both halves in it."""
    import threading

    from trtforge.runtime.outpool import OutputPool

    kinds = {"last_hidden_state": OutputKind("last_hidden_state", "token")}
    options = SimpleNamespace(merge="center", chunk=12, overlap=4)
    for trial in range(20):
        docs, chunks = _plan([40, 41, 43, 38])
        rng = np.random.default_rng(trial)
        batches = [chunks[k : k + 6] for k in range(0, len(chunks), 6)]
        outs = [_outputs(b, rng) for b in batches]
        reference = Merger(docs, chunks, kinds, options)
        for b, o in zip(batches, outs):
            reference.add(b, o)
        expected = reference.results()
        done, lock = [], threading.Lock()

        def on_done(d, outputs, release):
            with lock:
                done.append((d, outputs["last_hidden_state"].copy()))
            release()

        merger = Merger(docs, chunks, kinds, options, pool=OutputPool(), on_done=on_done)
        barrier = threading.Barrier(2, timeout=10)  # a thread that failed breaks it: the other fails too, no hang

        errors = []

        def half(rows_of):
            try:
                for b, o in zip(batches, outs):
                    barrier.wait()
                    merger.add(b, o, [r for r in rows_of(len(b))], copy=True)
            except Exception as exc:  # reported below; the barrier breaks for the other thread
                errors.append(exc)
                barrier.abort()

        threads = [
            threading.Thread(target=half, args=(lambda n: range(0, n // 2),)),
            threading.Thread(target=half, args=(lambda n: range(n // 2, n),)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not [e for e in errors if not isinstance(e, threading.BrokenBarrierError)], errors
        assert sorted(d for d, _ in done) == list(range(len(docs))), f"trial {trial}: {sorted(d for d, _ in done)}"
        for d, value in done:
            np.testing.assert_array_equal(value, expected[d]["last_hidden_state"])


@pytest.mark.parametrize("merge", ["center", "linear"])
def test_batches_of_block_runs_merge_like_each_input_alone(merge):
    """run's loop hands the merger run.Batch objects (a block's rows as runs, no chunk per row): every output, token
    and pooled and logits, equals merge_document over that input's chunks alone, as do the same batches given as
    lists of their chunks."""
    from test_runloop import _text_plans

    from trtforge.runtime.documents import Batch
    from trtforge.runtime.loop import Batcher
    from trtforge.runtime.planning import shape_key

    lengths = [40, 9, 23, 3, 61, 14]
    plans = _text_plans(lengths)
    docs = [Document(f"d{d}", "text", {}, n) for d, n in enumerate(lengths)]
    kinds = {
        "last_hidden_state": OutputKind("last_hidden_state", "token"),
        "pooler_output": OutputKind("pooler_output", "pooled"),
        "logits": OutputKind("logits", "logits"),
    }
    options = SimpleNamespace(merge=merge, chunk=16, overlap=4)
    batcher = Batcher(5, shape_key, group=Batch)
    batches = [b for plan in plans for b in batcher.add_many(plan)] + batcher.flush()
    rng = np.random.default_rng(4)
    by_runs, by_rows = (Merger(docs, [], kinds, options) for _ in range(2))
    for merger in (by_runs, by_rows):
        for plan in plans:
            merger.add_plan(plan)
    parts: dict[tuple[int, str], list] = {}
    for batch in batches:
        chunks = list(batch)
        out = _outputs(chunks, rng, width=16)
        out["logits"] = rng.standard_normal((len(batch), 4)).astype(np.float32)
        for j, c in enumerate(chunks):
            parts.setdefault((c.doc, "last_hidden_state"), []).append((c, out["last_hidden_state"][j, c.content]))
            for name in ("pooler_output", "logits"):
                parts.setdefault((c.doc, name), []).append((c, out[name][j]))
        by_runs.add(batch, {k: v.copy() for k, v in out.items()}, copy=True)
        by_rows.add(chunks, {k: v.copy() for k, v in out.items()}, list(range(len(batch))), copy=True)
    assert by_runs.rows and not any(name == "pooler_output" for _, name in by_runs.parts)  # pooled rows kept a run at a time
    for d, (got, listed) in enumerate(zip(by_runs.results(), by_rows.results())):
        for name, kind in kinds.items():
            expected = merge_document(docs[d], kind, parts[(d, name)], options)
            np.testing.assert_allclose(got[name], expected, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(listed[name], got[name])
