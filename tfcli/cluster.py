"""`--ray ADDRESS`: a dataset analysis (`patch --dataset`, `attribute --dataset`, `heads --file`) spread over a Ray
cluster. tfcli grows no scheduler of its own: the dataset is cut into blocks, a Ray actor per worker loads the model
once, and each block comes back as what the one-process aggregate reads (each pair's or prompt's result; for
`heads`, the block's sums per head and detector, float64). The driver combines them in dataset order, with the
same code as one process, so the aggregate is the same.

Faults: an actor whose process dies is restarted by Ray (it loads the model again) and the block it held is run
again (`max_restarts`, `max_task_retries`); a block's result is taken once, by its index, so nothing is counted
twice or lost. Ctrl-C cancels the blocks not finished and the command shows the aggregate of those finished.

Ray is optional (`pip install "tfcli[ray]"`) and imported only here, only with --ray.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tfcli.errors import TfcliError, usage_error

LOCAL = "local"
BLOCK = 8  # items per block at most: small enough that a dead worker's block is cheap to run again
SHARES = 4  # blocks per worker at least, where the dataset allows: the last blocks end close together
RESTARTS = 3  # times Ray restarts a worker whose process died (each restart loads the model again)
POLL = 0.5  # seconds between two looks at the blocks in flight (and the workers' health)


@dataclass
class RaySettings:
    """Where and how: `address` (`local` starts a cluster on this machine), workers (None: one per CPU of the
    cluster), GPUs per worker."""

    address: str
    workers: int | None = None
    gpus: float = 0.0


def check_settings(address: str | None, workers: int | None, gpus: float | None) -> RaySettings | None:
    """--ray, --ray-workers, --ray-gpus-per-worker checked before any work: None without --ray; a usage error for
    options without --ray or Ray not installed."""
    if address is None:
        if workers is not None or gpus is not None:
            raise usage_error("--ray-workers and --ray-gpus-per-worker go with --ray ADDRESS (or TFCLI_RAY_ADDRESS)")
        return None
    try:
        import ray  # noqa: F401
    except ImportError:
        raise usage_error("--ray needs Ray, which is not installed", "pip install \"tfcli[ray]\" (or pip install "
                          "ray) in tfcli's environment") from None
    if workers is not None and workers < 1:
        raise usage_error(f"--ray-workers must be at least 1, got {workers}")
    if gpus is not None and gpus < 0:
        raise usage_error(f"--ray-gpus-per-worker must be 0 or more, got {gpus:g}")
    if address != LOCAL:
        check_reachable(address)
    return RaySettings(address, workers, gpus or 0.0)


@dataclass
class ModelSpec:
    """What a worker needs to build the model as the driver would: the source as given, and the build options."""

    source: str | None  # None: the bundled default
    revision: str | None
    device: str
    dtype: str
    seed: int
    local_path: bool  # the source names a path on the driver's machine: every worker must read it too


def _worker_class():
    """The Ray actor class (made here: Ray is imported only with --ray)."""
    import ray

    @ray.remote(max_restarts=RESTARTS, max_task_retries=RESTARTS, concurrency_groups={"health": 1, "work": 1})
    class Worker:
        """One model, loaded once; runs blocks of a dataset analysis."""

        def __init__(self, spec: ModelSpec):
            self.problem: tuple[str, str | None] | None = None  # why the model could not be built here
            try:
                self._build(spec)
            except TfcliError as error:  # said by the driver (Ray's own report of a failed actor loses the error)
                self.problem = (error.message, error.hint)

        def _build(self, spec: ModelSpec) -> None:
            import torch

            from tfcli.api import build_model, load_tokenizer_for
            from tfcli.sources import resolve_source

            node = ray.util.get_node_ip_address()
            if spec.local_path and not os.path.exists(spec.source):
                raise TfcliError(f"the worker on {node} cannot read the model at {spec.source}",
                                 "every node needs the same path (a shared folder) or its own copy")
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
            torch.set_num_threads(max(1, int(cpus or 1)))
            source = resolve_source(spec.source, spec.revision)
            self.model = build_model(source, device=spec.device, dtype=spec.dtype, seed=spec.seed)
            self.tokenizer = load_tokenizer_for(source)

        @ray.method(concurrency_group="health")
        def alive(self) -> int:
            return os.getpid()

        @ray.method(concurrency_group="health")
        def failure(self) -> tuple[str, str | None] | None:
            return self.problem

        @ray.method(concurrency_group="work")
        def run(self, work: Callable[..., Any], items: list[Any], options: Any) -> Any:
            return work(self.model, self.tokenizer, items, options)

    return Worker


class Cluster:
    """Workers on a Ray cluster, each with the model loaded (`with Cluster(settings, spec) as cluster:`)."""

    def __init__(self, settings: RaySettings, spec: ModelSpec):
        self.settings, self.spec = settings, spec
        self.workers: list[Any] = []
        self.started_here = False

    def __enter__(self) -> Cluster:
        import ray

        if not ray.is_initialized():
            address = None if self.settings.address == LOCAL else self.settings.address
            if address is None:  # a cluster of our own: Ray's note that it made an access token for it is noise
                import logging

                logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="error",
                         configure_logging=False)
            except (ConnectionError, ValueError, RuntimeError) as error:
                raise TfcliError(f"--ray {self.settings.address}: cannot reach a Ray cluster ({error})",
                                 "start one with `ray start --head`, or give --ray local") from None
            self.started_here = True
        resources = ray.cluster_resources()
        cpus, gpus = int(resources.get("CPU", 1)), resources.get("GPU", 0)
        count = self.settings.workers or max(1, cpus)
        if self.settings.gpus * count > gpus:  # Ray would wait for them forever
            self.__exit__(None, None, None)
            raise usage_error(f"--ray-gpus-per-worker {self.settings.gpus:g} x {count} workers: the cluster at "
                              f"{self.settings.address} has {gpus:g} GPUs", "ask for fewer workers or GPUs each")
        # an equal share of the CPUs, a fraction of one when the workers outnumber them (Ray would wait otherwise)
        per_worker = cpus // count if count <= cpus else cpus / count
        options = {"num_cpus": per_worker, "num_gpus": self.settings.gpus}
        spec = self.spec
        if self.settings.gpus and spec.device == "cpu":
            spec = ModelSpec(**{**spec.__dict__, "device": "cuda"})
        self.workers = [_worker_class().options(**options).remote(spec) for _ in range(count)]
        problems = [problem for problem in ray.get([worker.failure.remote() for worker in self.workers]) if problem]
        if problems:
            self.__exit__(None, None, None)
            raise TfcliError(*problems[0])
        return self

    def __exit__(self, *exc: Any) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        if self.started_here:
            ray.shutdown()

    def alive(self) -> int:
        """How many workers answer now (a restarting one does not)."""
        import ray

        pings = [worker.alive.remote() for worker in self.workers]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=POLL)
        return len(ready)

    def map(self, work: Callable[..., list[Any]], items: list[Any], options: Any,
            progress: Callable[[int, int, int], None] | None = None, block: int = BLOCK) -> Iterator[Any]:
        """work(model, tokenizer, block of items, options) -> a list (one per item, or a block's sums) on the
        workers, in blocks of at most `block` items, at least SHARES per worker so that none waits on another's
        last long block; yields (the block's first index in `items`, its list) in the order of `items`, as the
        blocks finish (`progress(items done, items, workers alive)`). Ctrl-C cancels the blocks not finished, yields
        those finished (in order, with gaps) and then raises KeyboardInterrupt."""
        import ray

        size = max(1, min(block, -(-len(items) // (SHARES * len(self.workers)))))
        blocks = [items[k:k + size] for k in range(0, len(items), size)]
        pending = {self.workers[k % len(self.workers)].run.remote(work, part, options): k
                   for k, part in enumerate(blocks)}
        finished: dict[int, Any] = {}
        following, done = 0, 0
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL)
                for ref in ready:
                    index = pending.pop(ref)
                    try:
                        finished[index] = ray.get(ref)
                    except Exception as error:
                        raise _cause(error) from None
                    done += len(blocks[index])
                while following in finished:
                    yield following * size, finished.pop(following)
                    following += 1
                if progress is not None:
                    progress(done, len(items), self.alive())
        except KeyboardInterrupt:
            for ref in pending:  # a queued block is dropped; one running ends with its worker (Cluster.__exit__)
                ray.cancel(ref)
            for index in sorted(finished):
                yield index * size, finished[index]
            raise


def check_reachable(address: str, seconds: float = 5.0) -> None:
    """A HOST:PORT (or ray://HOST:PORT) that takes no connection within `seconds` is refused now: Ray itself would
    keep trying for minutes. `auto` and other forms are left to Ray."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as error:
        raise TfcliError(f"--ray {address}: no Ray cluster answers there ({error.strerror or error})",
                         "start one with `ray start --head` (its address: HOST:6379, or ray://HOST:10001 for Ray "
                         "Client), or give --ray local") from None


def _cause(error: Exception) -> Exception:
    """A worker's own error (a TfcliError: its message) out of Ray's wrapping; anything else as it is."""
    cause = getattr(error, "cause", None) or getattr(error, "__cause__", None)
    while cause is not None and not isinstance(cause, TfcliError):
        cause = getattr(cause, "cause", None) or getattr(cause, "__cause__", None)
    if isinstance(cause, TfcliError):
        return cause
    return TfcliError(f"a Ray worker failed: {str(error).splitlines()[0] if str(error) else type(error).__name__}")


def spec_of(source: str | None, revision: str | None, device: str, dtype: str, seed: int) -> ModelSpec:
    return ModelSpec(source, revision, device, dtype, seed, source is not None and os.path.exists(source))

