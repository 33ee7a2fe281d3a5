"""Text inputs planned in worker processes (`run --plan-processes`): the workers come up before the clock, plan every
input as the planning threads do (the same blocks, windows and feeds, from text and from ids), and their errors
reach the caller as the same one-sentence UserErrors."""

import copy
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from trtforge.core.errors import UserError
from trtforge.runtime.documents import Document, DocumentPlan
from trtforge.runtime.options import RunOptions
from trtforge.runtime.planning import plan_document
from trtforge.runtime.planning_processes import PlanningProcesses, PlanSettings, _worker_ready
from trtforge.runtime.prepare import prepare

ROOT = Path(__file__).resolve().parent.parent


def _prepared(minilm_clean, chunk=48, overlap=16):
    p = prepare(minilm_clean, RunOptions(inputs=ROOT / "calib_data/minilm_long", chunk=chunk, overlap=overlap), plan=False)
    assert p.docs and all(d.kind == "text" and d.ids is None for d in p.docs)
    return p


def _settings(p, chunk=48, overlap=16, limits=None):
    return PlanSettings(p.specs, p.layout, chunk, overlap, limits or p.limits, True)


def _assert_same_plan(got, want):
    assert type(got) is type(want) and len(got) == len(want)
    if isinstance(want, DocumentPlan):
        assert len(got.blocks) == len(want.blocks)
        for g, w in zip(got.blocks, want.blocks):
            assert (g.doc, g.first, g.windows, g.content, g.key) == (w.doc, w.first, w.windows, w.content, w.key)
            assert sorted(g.feeds) == sorted(w.feeds)
            for k in w.feeds:
                assert g.feeds[k].dtype == w.feeds[k].dtype
                np.testing.assert_array_equal(g.feeds[k], w.feeds[k], err_msg=k)
    else:
        for g, w in zip(got, want):
            assert (g.doc, g.index, g.window, g.tokens, g.content) == (w.doc, w.index, w.window, w.tokens, w.content)
            for k in w.feeds:
                np.testing.assert_array_equal(g.feeds[k], w.feeds[k], err_msg=k)


def test_planning_processes_are_all_up_after_start_and_plan_as_the_planning_threads(minilm_clean):
    """run starts the workers before its clock: after start every worker has loaded its tokenizer (the H200 box
    showed a run whose first batches waited on workers still starting). Each input's plan equals the one the
    planning threads make, for inputs given as text (the worker's ids come back) and as ids (none come back)."""
    p = _prepared(minilm_clean)
    as_text = {d: doc for d, doc in enumerate(p.docs)}
    tok = p.tokenizer
    n = len(p.docs)
    as_ids = {
        n + d: Document(doc.name, "text", {}, *(lambda ids: (int(ids.size), ids))(tok.document(doc.text))) for d, doc in enumerate(p.docs)
    }
    procs = PlanningProcesses(tok.directory, 3, _settings(p))
    try:
        procs.start()
        assert len(procs.ready) == 3 and os.getpid() not in procs.ready
        t0 = time.perf_counter()
        pids = {f.result() for f in [procs.pool.submit(_worker_ready, 0.5) for _ in range(3)]}
        assert pids == procs.ready and time.perf_counter() - t0 < 1.4  # three idle workers, one task each (not 2 x 0.5 s)
        procs.submit(as_text)
        procs.submit(as_ids)
        time.sleep(1.0)  # the workers do not run ahead of the loop: 2 per process with them, the rest queued
        assert procs.ahead == 6 and len(procs.futures) == 6 and len(procs.queued) == 2 * n - 6
        order = [0, 1, 2, 2 * n - 1] + list(range(3, 2 * n - 1))  # then one asked out of order: handed over up to it
        everything = {**as_text, **as_ids}
        for taken, d in enumerate(order, 1):
            doc = everything[d]
            chunks, ids, seconds, cpu_seconds = procs.plan(d)
            assert seconds > 0 and cpu_seconds >= 0
            mine = copy.deepcopy(doc)
            want = plan_document(d, mine, p.specs, p.layout, 48, 16, p.limits, tok, [], True)
            assert len(want) > 3
            _assert_same_plan(chunks, want)
            if d < n:
                np.testing.assert_array_equal(ids, mine.ids)
                assert doc.ids is None  # the caller's document is left as it was
            else:
                assert ids is None
            left = 2 * n - taken  # topped up to `ahead` as plans are taken, until the last input's ask hands all over
            assert len(procs.futures) == (left if taken >= 4 else min(procs.ahead, left)), (taken, d)
        assert procs.futures == {} and not procs.queued
    finally:
        procs.close()


def test_a_workers_user_error_reaches_the_caller_as_one(minilm_clean):
    """An input longer than the model takes without chunking: the worker's UserError is raised by plan(d), the
    same sentence the planning threads give."""
    p = _prepared(minilm_clean)
    doc = p.docs[0]
    procs = PlanningProcesses(p.tokenizer.directory, 1, _settings(p, chunk=None, overlap=0, limits=replace(p.limits, seq=32)))
    try:
        procs.start()
        procs.submit({0: doc})
        with pytest.raises(UserError, match=f"input '{doc.name}' has \\d+ tokens but the model takes at most 32; enable chunking"):
            procs.plan(0)
    finally:
        procs.close()


def test_planning_processes_that_cannot_start_say_so(tmp_path, minilm_clean):
    """A worker that fails to load its tokenizer breaks the pool: start() says so in one sentence (exit 2 from the
    CLI) and leaves no pool behind, instead of a BrokenProcessPool traceback."""
    p = _prepared(minilm_clean)
    procs = PlanningProcesses(tmp_path, 2, _settings(p))  # no tokenizer.json there
    with pytest.raises(UserError, match="the 2 planning processes could not start .*run without --plan-processes"):
        procs.start()
    assert procs.pool._shutdown_thread


def test_a_planning_process_that_dies_is_one_sentence(minilm_clean):
    """A worker killed (out of memory, say) breaks the pool, before inputs are handed to the workers or while one
    waits for its plan: either way one sentence saying what to do, instead of a BrokenProcessPool traceback."""
    import signal

    p = _prepared(minilm_clean)
    died = "a planning process died .* run without --plan-processes, or with fewer"
    for when in ("before", "waiting"):
        procs = PlanningProcesses(p.tokenizer.directory, 2, _settings(p))
        try:
            procs.start()
            if when == "before":
                for pid in procs.ready:
                    os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 20
                while not procs.pool._broken and time.monotonic() < deadline:
                    time.sleep(0.05)
                with pytest.raises(UserError, match=died):
                    procs.submit({0: p.docs[0]})
            else:
                busy = [procs.pool.submit(_worker_ready, 2.0) for _ in range(2)]  # input 0 queues behind these
                procs.submit({0: p.docs[0]})
                for pid in procs.ready:
                    os.kill(pid, signal.SIGKILL)
                with pytest.raises(UserError, match=died):
                    procs.plan(0)
                del busy
        finally:
            procs.close()
