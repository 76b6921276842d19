"""``--executor ray``: shard tasks and file hashes run as Ray tasks on a cluster whose nodes share
the model's storage (NFS, Lustre, GPFS, a mounted bucket) at the same paths.

The driver (this process) plans, stages, links, commits and writes the manifest exactly as with
the local executor; ``patcher.dispatch.using(RayExecutor(...))`` hands it only the two kinds of
self-contained work (``patcher.execute.ray_tasks``):

* one Ray task per shard task, which reads the base and writes its file into the staging
  directory through the shared filesystem, and returns the file's sha256 (and its source's, when
  asked): nothing large travels through Ray's object store;
* one Ray task per file to hash, which returns its digest and size.

Before the first task touches a path, one tiny task on every node that may run them checks that
the node sees the files the driver sees (size and mtime) and the driver's staging directory (a
token file the driver wrote there), may write there, and runs the same modelpatch version;
otherwise the run is refused, naming the node and the path.

Each task declares what it needs, so Ray packs them: CPUs (``cpus_per_task``, default 2 for
shards with computed tensors, as ``patcher.tensors.writing.thread_budget`` gives a local worker,
else 1), memory (``task_memory``), and a GPU with ``--device cuda``. The largest shards go first.
A task whose worker dies is retried (``MAX_RETRIES``); the retry removes the partial file and
writes the same bytes. An error or Ctrl-C cancels every task still queued or running (their
workers are killed) before the driver removes the staging directory. The progress meters add up
what the running tasks have written (their files' sizes on the shared storage, polled every
``POLL_S``) and each task's result as it ends. Ray is imported on first use only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from .. import __version__, dispatch
from ..errors import InputError, OperationFailed, PatchError
from . import ray_tasks

MAX_RETRIES = 3
WORKER_MEMORY = 1 << 30
"""Declared for a worker that computes: an interpreter with torch and modelpatch loaded."""
COPY_MEMORY = 128 << 20
"""Declared for a task that only copies or hashes bytes (8 MiB buffers, no torch)."""
CHECK_TIMEOUT_S = 120
CANCEL_WAIT_S = 30
POLL_S = 0.5
log = logging.getLogger("modelpatch")


def task_memory(task) -> int:
    """Bytes a shard task's worker may hold at once, declared to Ray: the worker itself, and
    twice the largest computed tensor's need (its sources, and three times its output: the
    kernels compute in float32, then cast), since the next tensor's sources are read ahead and
    the previous output waits for the writer (``patcher.tensors.writing.shard_pipeline``)."""
    needs = [sum(s.nbytes for s in job.inputs) + 3 * job.out.nbytes
             for job in task.jobs if job.op != "copy"]
    return WORKER_MEMORY + 2 * max(needs) if needs else COPY_MEMORY


class RayExecutor:
    """A ``patcher.dispatch`` executor on a Ray cluster; a context manager (``close``).

    ``address``: ``auto``, ``ray://HOST:PORT`` or a GCS address (default: ``$RAY_ADDRESS``, else
    ``auto``, the cluster this machine is part of). When Ray is already initialized in this
    process, that connection is used as it is."""

    def __init__(self, address: str | None = None, *, cpus_per_task: int | None = None):
        self.address, self.cpus_per_task = address, cpus_per_task
        self._ray = None
        self._initialized_here = False
        self._checked: set[str] = set()

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._initialized_here:
            self._ray.shutdown()
            self._initialized_here = False

    # ------------------------------------------------------------------ the two kinds of work

    def run_shard_tasks(self, tasks: list, staging: Path, *, jobs: int | None = None,
                        on_progress: Callable[[int], None] | None = None,
                        hash_sources: frozenset[str] = frozenset()):
        from ..tensors.writing.shard_pool import ShardResults

        self._connect()
        sources = sorted(set().union(*(t.source_paths() for t in tasks)))
        self._check_nodes(sources, [staging])
        limits = self._node_limits()
        results, written = ShardResults({}, {}), _Written(staging, on_progress)

        def submit(task):
            cpus = self._cpus(task, limits)
            options = {"num_cpus": cpus, "memory": min(task_memory(task), limits["memory"])}
            if task.device.startswith("cuda"):
                options["num_gpus"] = 1
            return self._write.options(**options).remote(task, str(staging / task.output),
                                                         hash_sources, cpus)

        def collect(task, value) -> None:
            sha256, source, digest = value
            results.outputs[task.output] = sha256
            if source is not None and digest is not None:
                results.sources[source] = _localized(source, digest)
            written.show(task, task.file_size)

        if any(t.device.startswith("cuda") for t in tasks) and not limits["gpus"]:
            raise OperationFailed("--device cuda: no node of the Ray cluster has a GPU")
        order = sorted(tasks, key=lambda t: t.file_size, reverse=True)
        self._run(order, submit, collect, jobs, lambda t: staging / t.output, written.watch)
        return results

    def hash_files_stat(self, paths, *, jobs: int | None = None,
                        on_progress: Callable[[int], None] | None = None) -> dict:
        unique = list(dict.fromkeys(paths))
        if not unique:
            return {}
        self._connect()
        self._check_nodes([os.fspath(p) for p in unique], [])
        sizes = {p: _size(p) for p in unique}
        hashed = {}

        def collect(path, value) -> None:
            hashed[path] = _localized(os.fspath(path), value)
            if on_progress:
                on_progress(value[1])

        order = sorted(unique, key=lambda p: sizes[p], reverse=True)
        submit = lambda p: self._hash.options(num_cpus=1, memory=COPY_MEMORY).remote(
            os.fspath(p))
        self._run(order, submit, collect, jobs, lambda p: p)
        return {p: hashed[p] for p in unique}

    # ------------------------------------------------------------------ connection and checks

    def _connect(self):
        if self._ray is not None:
            return self._ray
        import ray

        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS") or "auto"
            with _native_stderr_kept() as native:
                try:
                    ray.init(address=address, logging_level=logging.WARNING,
                             log_to_driver=False)
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    failure = exc
                else:
                    failure = None
            if failure is not None:
                if _refused_token(failure, native.getvalue()):
                    raise OperationFailed(
                        f"the Ray cluster at {address} uses token authentication and refused "
                        "this client: its token is missing or wrong", hint=AUTH_HINT) from None
                raise OperationFailed(f"cannot connect to the Ray cluster at {address}: "
                                      f"{_first_line(failure)}",
                                      hint="start one (`ray start --head`) or pass "
                                           "--ray-address") from None
            self._initialized_here = True
        self._ray = ray
        remote = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)
        self._write, self._hash = remote(ray_tasks.write_shard), remote(ray_tasks.hash_file)
        self._view = ray.remote(num_cpus=0, max_retries=0)(ray_tasks.node_view)
        return ray

    def _task_nodes(self) -> list[dict]:
        """The live nodes that can run our tasks (a head started with ``--num-cpus 0``, as
        KubeRay does, runs none, and need not mount the storage)."""
        return [n for n in self._ray.nodes()
                if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]

    def _node_limits(self) -> dict:
        nodes = [n["Resources"] for n in self._task_nodes()]
        if not nodes:
            raise OperationFailed("the Ray cluster has no live node with a CPU")
        return {"cpus": int(max(r.get("CPU", 0) for r in nodes)),
                "memory": int(max(r.get("memory", 0) for r in nodes)),
                "gpus": max(r.get("GPU", 0) for r in nodes)}

    def _cpus(self, task, limits: dict) -> int:
        wanted = self.cpus_per_task or (2 if task.bytes_computed else 1)
        return max(1, min(wanted, limits["cpus"]))

    def _check_nodes(self, reads: list[str], writes: list[Path]) -> None:
        """Refuse, naming the node and the path, unless every node that may run a task sees
        ``reads`` as this machine does and sees (and may write) this machine's ``writes``."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        reads = [p for p in dict.fromkeys(reads) if p not in self._checked]
        writes = [Path(d) for d in dict.fromkeys(writes) if str(d) not in self._checked]
        if not reads and not writes:
            return
        expected = []
        for path in reads:
            try:
                st = os.stat(path)
            except OSError:
                continue            # the task reports it, as the local executor would
            expected.append((path, st.st_size, st.st_mtime_ns))
        probes = []
        try:
            for directory in writes:
                token = secrets.token_hex(16)
                probe = directory / f"{ray_tasks.PROBE_MARK}{token[:12]}"
                probe.write_text(token, encoding="ascii")
                probes.append((str(probe), token))
            refs = {self._view.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                        n["NodeID"], soft=False)).remote(expected, probes): n
                    for n in self._task_nodes()}
            for ref, node in refs.items():
                self._refuse_differences(ref, node)
        finally:
            for probe, _token in probes:
                Path(probe).unlink(missing_ok=True)
        self._checked.update([*reads, *map(str, writes)])

    def _refuse_differences(self, ref, node: dict) -> None:
        address = node.get("NodeManagerAddress", "?")
        try:
            view = self._ray.get(ref, timeout=CHECK_TIMEOUT_S)
        except self._ray.exceptions.GetTimeoutError:
            raise OperationFailed(f"Ray node {address} did not answer the path check within "
                                  f"{CHECK_TIMEOUT_S} s") from None
        name = f"{view['host']} ({address})"
        if view["version"] != __version__:
            raise OperationFailed(f"Ray node {name} runs modelpatch {view['version']}, this "
                                  f"machine {__version__}",
                                  hint="install the same modelpatch on every node")
        if view["problem"] is not None:
            path, why = view["problem"]
            raise OperationFailed(f"Ray node {name} {why}", where=path,
                                  hint="--executor ray needs the model and the output on "
                                       "storage that every node mounts at the same path")

    # ------------------------------------------------------------------ running tasks

    def _run(self, items: list, submit, collect, jobs: int | None, where, watch=None) -> None:
        """Submit ``items`` in order (at most ``jobs`` in flight), ``collect`` each result as it
        comes, ``watch`` the items in flight between; on any error or interrupt cancel the rest
        and wait until none runs any more."""
        ray = self._ray
        waiting, pending = list(reversed(items)), {}
        try:
            while waiting or pending:
                while waiting and (jobs is None or len(pending) < jobs):
                    item = waiting.pop()
                    pending[submit(item)] = item
                done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
                for ref in done:
                    item = pending.pop(ref)
                    collect(item, self._result(ref, where(item)))
                if watch is not None:
                    watch(list(pending.values()))
        except BaseException:
            self._cancel(list(pending))
            raise

    def _result(self, ref, where):
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, (PatchError, OSError)):
                raise cause from None
            raise OperationFailed(f"{type(cause).__name__}: {cause}", where=where) from None
        except ray.exceptions.RayError as exc:     # its worker or node died past the retries
            raise OperationFailed(f"the Ray task failed {MAX_RETRIES + 1} times: "
                                  f"{_first_line(exc)}", where=where) from None

    def _cancel(self, refs: list) -> None:
        """Cancel ``refs`` (killing the workers that run them), then wait for them to end, so
        that nothing writes into a staging directory the driver is about to remove."""
        ray = self._ray
        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except Exception as exc:         # already finished, or the cluster is gone
                log.debug("ray.cancel: %s", exc)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while refs and time.monotonic() < deadline:
            _, refs = ray.wait(refs, num_returns=len(refs), timeout=POLL_S)


class _Written:
    """Progress of shard tasks: what the running ones have written so far (their files' sizes
    on the shared storage) and, as each ends, the rest of its file. A retried task's file starts
    again from nothing; its bytes are not counted twice."""

    def __init__(self, staging: Path, on_progress: Callable[[int], None] | None):
        self.staging, self.on_progress = staging, on_progress
        self.shown: dict[str, int] = {}

    def show(self, task, size: int) -> None:
        before = self.shown.get(task.output, 0)
        if self.on_progress is not None and size > before:
            self.on_progress(size - before)
            self.shown[task.output] = size

    def watch(self, running: list) -> None:
        for task in running:
            with contextlib.suppress(OSError):
                self.show(task, os.stat(self.staging / task.output).st_size)


def _localized(path: str, portable) -> object:
    """A worker's ``HashResult`` with this machine's stat of the file (the digest cache keys on
    this machine's device and inode); not ``stable`` unless the file's size, mtime and ctime
    here are what the worker saw."""
    from ..integrity.digests.hashing import HashResult

    sha256, size, seen, stable = portable
    st = os.stat(path)
    same = (st.st_size, st.st_mtime_ns, st.st_ctime_ns) == tuple(seen)
    return HashResult(sha256, size, st, stable and same)


def _size(path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


AUTH_HINT = ("give this machine the cluster's token: `ray get-auth-token` on the head node prints "
             "it; put it in ~/.ray/auth_token, or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, with "
             "RAY_AUTH_MODE=token")
# what Ray's GCS client logs when the cluster refuses a connection's token (Ray 2.5x: the Python
# side then raises a plain ConnectionError after its retries)
_TOKEN_REFUSED = ("InvalidAuthToken", "Unauthenticated")


def _refused_token(exc: BaseException, native_log: str) -> bool:
    if type(exc).__name__ == "AuthenticationError":
        return True
    return any(mark in native_log or mark in str(exc) for mark in _TOKEN_REFUSED)


@contextlib.contextmanager
def _native_stderr_kept() -> Iterator[io.StringIO]:
    """While connecting, file descriptor 2 goes to a temporary file: Ray's native client logs
    each refused attempt there (a screenful of retries), and the reason a connection failed is
    only in those lines. The yielded buffer holds them afterwards; nothing reaches the terminal."""
    kept = io.StringIO()
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield kept
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            kept.write(log.read(1 << 20).decode("utf-8", "replace"))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def executing_on_ray(address: str | None = None, *,
                     cpus_per_task: int | None = None) -> Iterator[RayExecutor]:
    """Within the block, shard tasks and file hashes run on the Ray cluster at ``address``."""
    if importlib.util.find_spec("ray") is None:
        raise InputError("--executor ray needs the ray package, which is not installed",
                         hint="pip install -e '.[ray]' in the modelpatch checkout")
    with RayExecutor(address, cpus_per_task=cpus_per_task) as executor, dispatch.using(executor):
        yield executor
