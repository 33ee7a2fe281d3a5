"""A pool of Ray actors that runs units with retries (Ray is imported here and in the step drivers only).

Each worker is one actor (one GPU, or a CPU slot). Units go to workers a few at a time (`depth` in
flight each, so a worker never idles while the driver merges); a worker that dies (RayActorError)
loses its in-flight units back to the ledger, which retries them on another worker, and a fresh actor
replaces it while the replacement budget lasts. Results are committed once, by the ledger.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trtforge.core.errors import TrtforgeError, UserError
from trtforge.scaleout.shard import Ledger


def require_ray():
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray, which is not installed; install it with pip install 'trtforge[ray]'.") from None
    return ray


def connect(address: str) -> bool:
    """Join the Ray cluster at `address` ('auto': a local one, started here unless RAY_ADDRESS names one).
    Returns True when this call connected (and so should disconnect at the end)."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    import trtforge

    if address != "auto" and not address.startswith("ray://"):
        _probe(address)  # ray.init retries an address nobody serves for minutes before it fails
    # Workers import this very trtforge (a checkout need not be installed on the local cluster).
    root = str(Path(trtforge.__file__).resolve().parent.parent)
    paths = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    try:
        ray.init(
            address=None if address == "auto" else address,
            include_dashboard=False,
            logging_level="WARNING",
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}},
        )
    except (ConnectionError, ValueError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(
            f"cannot join the Ray cluster at '{address}' ({first[:200]}); pass --ray auto for a local "
            "cluster or the address printed by `ray start --head`."
        ) from None
    return True


def _probe(address: str) -> None:
    import socket

    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=10).close()
    except (OSError, ValueError):
        raise UserError(
            f"no Ray cluster answers at '{address}' (expected HOST:PORT of a head node, as `ray start --head` "
            "prints); check the address, or pass --ray auto for a local cluster."
        ) from None


def raise_cause(exc: BaseException) -> None:
    """A trtforge error raised inside an actor reaches the user as itself (one sentence, its exit code)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, TrtforgeError):
        raise cause from None
    raise exc


@dataclass
class Worker:
    id: int
    handle: Any
    ready_ref: Any = None  # set while the actor starts (setup + warm-up)
    info: dict[str, Any] = field(default_factory=dict)
    alive: bool = True
    units: int = 0
    retried_units: int = 0  # units it took over from a dead worker


class Pool:
    """`make(worker_id)` creates an actor; `start(handle)` returns the ref that resolves once it is ready
    (its info dict). `replacements`: how many dead workers may be replaced by fresh actors."""

    def __init__(
        self,
        make: Callable[[int], Any],
        start: Callable[[Any], Any],
        count: int,
        replacements: int | None = None,
        progress: Callable[[str], None] = lambda _: None,
    ):
        self.make, self.start, self.progress = make, start, progress
        self.replacements = count if replacements is None else replacements
        self.workers: list[Worker] = []
        for _ in range(count):
            self._spawn()

    def _spawn(self) -> Worker:
        handle = self.make(len(self.workers))
        worker = Worker(len(self.workers), handle, self.start(handle))
        self.workers.append(worker)
        return worker

    def wait_ready(self) -> None:
        """Block until every starting worker is ready (their setup errors surface here)."""
        ray = require_ray()
        for w in self.workers:
            if w.ready_ref is not None:
                try:
                    w.info = ray.get(w.ready_ref)
                except ray.exceptions.RayTaskError as exc:
                    raise_cause(exc)
                w.ready_ref = None

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.alive and w.ready_ref is None]

    def died(self, worker: Worker) -> None:
        ray = require_ray()
        worker.alive = False
        try:
            ray.kill(worker.handle, no_restart=True)
        except Exception:  # already gone
            pass
        if self.replacements > 0:
            self.replacements -= 1
            fresh = self._spawn()
            self.progress(f"Ray worker {worker.id} died; its units are retried, worker {fresh.id} replaces it")
        else:
            self.progress(f"Ray worker {worker.id} died; its units are retried on the others")

    def run(self, ledger: Ledger, submit: Callable[[Any, int], Any], commit: Callable[[int, Worker, Any], None], depth: int = 2) -> None:
        """Every unit of `ledger` through `submit(handle, unit) -> ref`, each result to `commit` exactly once."""
        ray = require_ray()
        refs: dict[Any, tuple[int, Worker]] = {}
        while not ledger.complete:
            loads = ledger.loads()
            for w in self.live():
                for _ in range(depth - loads.get(w.id, 0)):
                    unit = ledger.take(w.id)
                    if unit is None:
                        break
                    if ledger.attempts[unit] > 1:
                        w.retried_units += 1
                    refs[submit(w.handle, unit)] = (unit, w)
            starting = {w.ready_ref: w for w in self.workers if w.alive and w.ready_ref is not None}
            if not refs and not starting:
                raise RuntimeError("no Ray worker is left to run the remaining units; see the Ray logs (/tmp/ray/session_latest/logs).")
            ready, _ = ray.wait(list(refs) + list(starting), num_returns=1)
            ref = ready[0]
            if ref in starting:
                w = starting[ref]
                try:
                    w.info = ray.get(ref)
                    w.ready_ref = None
                except ray.exceptions.RayActorError:
                    self.died(w)
                except ray.exceptions.RayTaskError as exc:
                    raise_cause(exc)
                continue
            unit, w = refs.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError:
                if w.alive:
                    ledger.lost(w.id)
                    for other in [r for r, (_, ow) in refs.items() if ow is w]:
                        del refs[other]  # also lost: retried from the ledger, never committed
                    self.died(w)
                continue
            except ray.exceptions.RayTaskError as exc:
                raise_cause(exc)
            ledger.finish(unit, w.id)
            w.units += 1
            commit(unit, w, result)
