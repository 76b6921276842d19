"""Full disks and I/O errors: writes fail mid-shard, fsync and rename fail, and modelpatch must
fail cleanly, leave the base byte for byte as it was, leave nothing behind, and succeed on a rerun.

Three ways of failing, over out-of-place and ``--in-place`` apply (config-only and shard-rewriting
recipes) and both kinds of revert:

1. ``RLIMIT_FSIZE`` (with SIGXFSZ ignored, so write(2) returns EFBIG) set on a ``modelpatch``
   subprocess: the first write past the limit fails, in the middle of a shard or a JSON file,
   in the main process or in a ``--jobs`` worker.
2. ``MODELPATCH_FAULT=enospc@POINT`` / ``eio@POINT`` (patcher/faults.py) at the named points a
   traced run passes (``MODELPATCH_FAULT_TRACE``): ``file:<rel>``, ``tensor:<name>``,
   ``hashing``, ``manifest``, ``commit``, ``inplace:*``, ``revert:*``, ``journal:*``.
3. In process, the N-th call of ``os.fsync`` / ``os.rename`` / ``os.replace`` / ``os.link`` /
   ``os.write`` raises OSError(EIO), for every N a complete run makes.

After each failure:
- exit code 3 and exactly one line ``modelpatch: error: ...`` (in process: an
  ``OperationFailed``), no traceback;
- out of place: the base is byte-identical (bytes, modes, inodes, mtimes), no output, no
  ``.<out>.modelpatch-staging-*`` (nor lock file) beside it; a ``--force`` run keeps the previous
  output;
- in place: the directory is unchanged, or (a failure during the journaled switch) the next
  command completes or rolls back the patch and the directory is exactly the state before or the
  state after;
- a rerun without the fault succeeds and verifies.

The unmarked tests cover a representative subset of points; ``@pytest.mark.slow`` covers every
named point (``tensor:`` points sampled) and every syscall index. ``test_report_io_coverage``
prints how many distinct fault points ran.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from fault_helpers import error_line, leftovers, run_cli, state_diff, tree_state

from patcher import api
from patcher.errors import OperationFailed, PatchError

MANIFEST = "modelpatch.provenance.json"
VARY = (MANIFEST, "record.json")
IO_MESSAGES = ("No space left on device", "Input/output error", "File too large")
WORKERS = 2
_COVERED: set[str] = set()


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


# --------------------------------------------------------------------------- templates


@pytest.fixture(scope="module")
def templates(tmp_path_factory, kimi_dir, deepseek_fp8_dir) -> dict[str, Path]:
    """kimi: the NVFP4 look-alike; fixed: its sm120-fp16-kv variant (base for drop-kv-scales
    and revert -o); patched: kimi patched in place; deepseek: the FP8 look-alike."""
    root = tmp_path_factory.mktemp("io-templates")
    kimi = _copy(kimi_dir, root / "kimi")
    fixed = api.apply("sm120-fp16-kv", kimi, out=root / "fixed", jobs=1).output
    patched = _copy(kimi_dir, root / "patched")
    api.apply_in_place("sm120-fp16-kv", patched, jobs=1)
    return {"kimi": kimi, "fixed": fixed, "patched": patched,
            "deepseek": _copy(deepseek_fp8_dir, root / "deepseek")}


@dataclass
class Scenario:
    name: str
    template: str
    args: Callable[[Path, Path], list]          # (model, out) -> CLI arguments
    rerun: Callable[[Path, Path], None]         # the same operation, in process, without fault
    out_of_place: bool
    after: Callable[[dict], Path] | None = None   # in place: a template of the state after
    points: list[str] = field(default_factory=list)
    trace_dir: Path | None = None
    templates: dict | None = None


def _apply_out(recipe: str, *extra: str):
    return Scenario(
        name="", template="", out_of_place=True,
        args=lambda m, o: ["apply", recipe, m, "-o", o, *extra],
        rerun=lambda m, o: _rerun_apply(recipe, m, o))


def _rerun_apply(recipe: str, model: Path, out: Path) -> None:
    api.apply(recipe, model, out=out, jobs=1)
    assert api.verify(out).ok


def _rerun_in_place(recipe: str, model: Path) -> None:
    api.apply_in_place(recipe, model, jobs=1)
    assert api.verify(model).ok


def _scenarios() -> dict[str, Scenario]:
    found = {
        "sm120-out": _apply_out("sm120-fp16-kv"),
        "dropkv-out": _apply_out("drop-kv-scales", "-j", "1"),
        "fp8-out": _apply_out("fp8-block-to-bf16", "-j", "2"),
        "sm120-inplace": Scenario(
            "", "", out_of_place=False,
            args=lambda m, o: ["apply", "sm120-fp16-kv", m, "--in-place"],
            rerun=lambda m, o: _rerun_in_place("sm120-fp16-kv", m),
            after=lambda t: t["patched"]),
        "dropkv-inplace": Scenario(
            "", "", out_of_place=False,
            args=lambda m, o: ["apply", "drop-kv-scales", m, "--in-place", "-j", "1"],
            rerun=lambda m, o: _rerun_in_place("drop-kv-scales", m),
            after=lambda t: t["patched-dropkv"]),
        "revert-inplace": Scenario(
            "", "", out_of_place=False,
            args=lambda m, o: ["revert", m],
            rerun=lambda m, o: api.revert(m),
            after=lambda t: t["kimi"]),
        "revert-out": Scenario(
            "", "", out_of_place=True,
            args=lambda m, o: ["revert", m, "-o", o],
            rerun=lambda m, o: api.revert(m, out=o)),
    }
    templates = {"sm120-out": "kimi", "dropkv-out": "fixed", "fp8-out": "deepseek",
                 "sm120-inplace": "kimi", "dropkv-inplace": "patched",
                 "revert-inplace": "patched", "revert-out": "fixed"}
    for name, sc in found.items():
        sc.name, sc.template = name, templates[name]
    return found


@pytest.fixture(scope="module")
def scenarios(templates, tmp_path_factory) -> dict[str, Scenario]:
    """Every scenario; ``points(sc)`` traces the named fault points of a complete run."""
    work = tmp_path_factory.mktemp("io-traces")
    # The state after an in-place drop-kv-scales, for comparison.
    templates["patched-dropkv"] = _copy(templates["patched"], work / "patched-dropkv")
    api.apply_in_place("drop-kv-scales", templates["patched-dropkv"], jobs=1)
    found = _scenarios()
    for sc in found.values():
        sc.trace_dir = work / sc.name
        sc.templates = templates
    return found


def points(sc: Scenario) -> list[str]:
    """The named fault points a complete run of ``sc`` passes, in order (traced once)."""
    if not sc.points:
        case = sc.trace_dir
        model = _copy(sc.templates[sc.template], case / "m")
        path = case / "trace.txt"
        r = run_cli(*sc.args(model, case / "out"), env={"MODELPATCH_FAULT_TRACE": str(path)},
                    timeout=120)
        assert r.returncode == 0, r.stderr
        sc.points = list(dict.fromkeys(path.read_text().splitlines()))  # first occurrences
    return sc.points


# --------------------------------------------------------------------------- checks


def _check_failure(sc: Scenario, templates, case: Path, run) -> list[str]:
    """Run ``run(model, out)`` (which must fail with an I/O error) on a fresh copy and check
    everything the module docstring promises. Returns problems (empty when all is well)."""
    model = _copy(templates[sc.template], case / "m")
    out = case / "out"
    before = tree_state(model)
    problems = run(model, out) or []
    state = tree_state(model)
    if sc.out_of_place:
        if state != before:
            problems.append(f"base changed: {state_diff(before, state)[:3]}")
        if os.path.lexists(out):
            problems.append("an output appeared")
        if leftovers(out):
            problems.append(f"left beside the output: {leftovers(out)}")
    else:
        if leftovers(model):
            problems.append(f"left beside the directory: {leftovers(model)}")
        if state != before:
            api.recover(model)          # what the next command does first
            state = tree_state(model)
        after = tree_state(sc.after(templates), inodes=False, vary=VARY)
        if state != before and tree_state(model, inodes=False, vary=VARY) != after:
            problems.append("directory is neither as before nor as after: "
                            f"{state_diff(after, tree_state(model, inodes=False, vary=VARY))[:4]}")
        if state != before:
            if sc.name != "revert-inplace" and not api.verify(model).ok:
                problems.append("completed patch does not verify")
            return problems             # the operation completed during recovery
    try:
        sc.rerun(model, out)
    except Exception as exc:            # noqa: BLE001 - reported as a problem
        problems.append(f"rerun failed: {exc!r}")
    if sc.out_of_place and leftovers(out):
        problems.append(f"rerun left {leftovers(out)}")
    return problems


def _cli_failure(sc: Scenario, fault: str, env=None, preexec_fn=None):
    def run(model: Path, out: Path) -> list[str]:
        r = run_cli(*sc.args(model, out), env=env, preexec_fn=preexec_fn, timeout=120)
        try:
            line = error_line(r, 3)
        except AssertionError as exc:
            return [f"{fault}: {exc}"]
        if not any(m in line for m in IO_MESSAGES):
            return [f"{fault}: not an I/O message: {line}"]
        return []
    return run


def _sweep_points(sc: Scenario, templates, work: Path, points: list[str]) -> list[str]:
    def one(index_point):
        index, point = index_point
        action = ("enospc", "eio")[index % 2]
        fault = f"{action}@{point}"
        case = work / f"{index:03d}"
        problems = _check_failure(sc, templates, case,
                                  _cli_failure(sc, fault, env={"MODELPATCH_FAULT": fault}))
        _COVERED.add(f"{sc.name}:{point}")
        return [f"{sc.name} {fault}: {p}" for p in problems]

    with ThreadPoolExecutor(WORKERS) as pool:
        return [p for ps in pool.map(one, enumerate(points)) for p in ps]


def _sample(points: list[str], n: int | None = None, tensors: int = 6) -> list[str]:
    """Every non-tensor point and up to ``tensors`` tensor points (first, last, evenly spread);
    then, with ``n``, ``n`` of those evenly spread."""
    named = [p for p in points if not p.startswith("tensor:")]
    tensor = [p for p in points if p.startswith("tensor:")]
    if len(tensor) > tensors:
        step = (len(tensor) - 1) / (tensors - 1)
        tensor = [tensor[round(i * step)] for i in range(tensors)]
    chosen = [p for p in points if p in set(named) | set(tensor)]
    if n is not None and len(chosen) > n:
        step = (len(chosen) - 1) / (n - 1)
        chosen = [chosen[round(i * step)] for i in range(n)]
    return chosen


# --------------------------------------------------------------------------- 1. RLIMIT_FSIZE


def _fsize_limit(limit: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


# (scenario, limit in bytes, where the first failing write lands)
FSIZE_CASES = [
    ("sm120-out", 1_000, "config.json (4 KB) in staging"),
    ("sm120-inplace", 1_000, "config.json in .modelpatch/staging"),
    ("dropkv-out", 300_000, "the middle of a rewritten 1.2 MB shard"),
    ("dropkv-inplace", 300_000, "the middle of a rewritten shard, in place"),
    ("fp8-out", 1_500_000, "the middle of a 3.6 MB BF16 shard, in a --jobs 2 worker"),
    ("revert-inplace", 200, "the journal"),
]


@pytest.mark.parametrize("name,limit,where", FSIZE_CASES, ids=[c[0] for c in FSIZE_CASES])
def test_file_size_limit(scenarios, templates, tmp_path, name, limit, where):
    sc = scenarios[name]
    problems = _check_failure(sc, templates, tmp_path,
                              _cli_failure(sc, f"RLIMIT_FSIZE={limit}",
                                           preexec_fn=_fsize_limit(limit)))
    _COVERED.add(f"{name}:fsize:{where}")
    assert problems == []


def test_copy_under_file_size_limit(templates, tmp_path):
    """--copy: copying an unchanged shard into the variant hits the limit."""
    sc = _scenarios()["sm120-out"]
    sc.args = lambda m, o: ["apply", "sm120-fp16-kv", m, "-o", o, "--copy"]
    problems = _check_failure(sc, templates, tmp_path,
                              _cli_failure(sc, "fsize --copy", preexec_fn=_fsize_limit(200_000)))
    _COVERED.add("sm120-out:fsize:--copy of a shard")
    assert problems == []


# --------------------------------------------------------------------------- 2. named points


def test_points_are_enumerated(scenarios):
    names = {p for name, sc in scenarios.items() if name != "fp8-out" for p in points(sc)}
    for expected in ("file:config.json", "hashing", "manifest", "commit", "inplace:prepare",
                     "inplace:prepared", "journal:switch", "journal:stash:config.json",
                     "journal:install:config.json", "revert:begin", "revert:prepared",
                     "revert:rebuilt", "journal:unstash:config.json"):
        assert expected in names, expected
    assert any(p.startswith("tensor:") for p in points(scenarios["dropkv-out"]))


FAST = {"sm120-out": 5, "dropkv-out": 4, "sm120-inplace": 6, "dropkv-inplace": 3,
        "revert-inplace": 4, "revert-out": 3, "fp8-out": 1}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "fp8-out"
                                  else n for n in FAST])
def test_injected_errors_at_sampled_points(scenarios, templates, tmp_path, name):
    sc = scenarios[name]
    if name == "fp8-out":        # a tensor converted in a --jobs 2 worker (no trace: torch)
        chosen = ["tensor:model.layers.1.mlp.experts.0.down_proj.weight"]
    else:
        chosen = _sample(points(sc), FAST[name], tensors=2)
    assert len(chosen) == FAST[name]
    assert _sweep_points(sc, templates, tmp_path, chosen) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAST))
def test_injected_errors_at_every_point(scenarios, templates, tmp_path, name):
    sc = scenarios[name]
    chosen = _sample(points(sc), tensors=3 if name == "fp8-out" else 8)
    assert _sweep_points(sc, templates, tmp_path, chosen) == []


# --------------------------------------------------------------------------- 3. syscalls


class _Calls:
    """Wraps ``os.<name>``: counts calls and raises OSError(EIO) at call number ``fail_at``.

    Calls on the caches under ``$MODELPATCH_CACHE_DIR`` pass through uncounted: a cache write
    is best effort by design (``patcher.model.header_cache``: a failed write is logged and the
    command goes on), so its failure must not fail the operation.
    """

    def __init__(self, name: str, fail_at: int | None = None, err: int = errno.EIO):
        self.name, self.fail_at, self.err = name, fail_at, err
        self.original = getattr(os, name)
        self.count = 0
        self.fired = False
        self.cache_dir = os.environ.get("MODELPATCH_CACHE_DIR")

    def __call__(self, *args, **kwargs):
        if self.cache_dir and any(isinstance(a, (str, os.PathLike))
                                  and os.fspath(a).startswith(self.cache_dir) for a in args):
            return self.original(*args, **kwargs)
        self.count += 1
        if self.count == self.fail_at:
            self.fired = True
            raise OSError(self.err, os.strerror(self.err))
        return self.original(*args, **kwargs)


def _api_op(kind: str) -> Callable[[Path, Path], object]:
    return {
        "sm120-out": lambda m, o: api.apply("sm120-fp16-kv", m, out=o, jobs=1),
        "sm120-force": lambda m, o: api.apply("sm120-fp16-kv", m, out=o, jobs=1, force=True),
        "dropkv-out": lambda m, o: api.apply("drop-kv-scales", m, out=o, jobs=1),
        "sm120-inplace": lambda m, o: api.apply_in_place("sm120-fp16-kv", m, jobs=1),
        "revert-inplace": lambda m, o: api.revert(m),
        "revert-out": lambda m, o: api.revert(m, out=o),
    }[kind]


def _count_calls(kind: str, sc: Scenario, templates, work: Path, names) -> dict[str, int]:
    model = _copy(templates[sc.template], work / "m")
    out = work / "out"
    if kind == "sm120-force":
        _copy(templates["fixed"], out)
    wrappers = {n: _Calls(n) for n in names}
    with pytest.MonkeyPatch.context() as mp:
        for n, w in wrappers.items():
            mp.setattr(os, n, w)
        _api_op(kind)(model, out)
    return {n: w.count for n, w in wrappers.items()}


def _syscall_sweep(kind: str, scenarios, templates, work: Path, names, *,
                   every: int = 1) -> tuple[list[str], int]:
    """Fail each call of each ``os.<name>`` in turn (every ``every``-th call); returns the
    problems and the number of faults run."""
    sc = scenarios[{"sm120-force": "sm120-out"}.get(kind, kind)]
    counts = _count_calls(kind, sc, templates, work / "count", names)
    problems, runs = [], 0
    for name in names:
        assert counts[name] > 0, (kind, name)
        for n in range(1, counts[name] + 1, every):
            case = work / f"{name}-{n}"
            previous = None

            def run(model: Path, out: Path) -> list[str]:
                nonlocal previous
                if kind == "sm120-force":
                    previous = tree_state(_copy(templates["fixed"], out))
                wrapper = _Calls(name, fail_at=n)
                try:
                    with pytest.MonkeyPatch.context() as mp:
                        mp.setattr(os, name, wrapper)
                        _api_op(kind)(model, out)
                except PatchError as exc:
                    if not (isinstance(exc, OperationFailed) and exc.exit_code == 3):
                        return [f"{type(exc).__name__} (exit {exc.exit_code}): {exc}"]
                    if "\n" in exc.one_line():
                        return ["message spans lines"]
                    return []
                except OSError as exc:
                    return [f"raw {exc!r} escaped the API"]
                return [] if not wrapper.fired else ["succeeded although the call failed"]

            if kind == "sm120-force":
                sc_force = Scenario(sc.name, sc.template, sc.args, sc.rerun, True)
                problems += _force_check(sc_force, templates, case, run, lambda: previous)
            else:
                problems += [f"{kind} {name}#{n}: {p}"
                             for p in _check_failure(sc, templates, case, run)]
            _COVERED.add(f"{kind}:{name}#{n}")
            runs += 1
    return problems, runs


def _force_check(sc, templates, case, run, previous) -> list[str]:
    """``--force`` over an existing output: on failure the previous output is still there."""
    model = _copy(templates[sc.template], case / "m")
    out = case / "out"
    before = tree_state(model)
    problems = run(model, out)
    if tree_state(model) != before:
        problems.append("base changed")
    if tree_state(out) != previous():
        problems.append(f"previous output changed: {state_diff(previous(), tree_state(out))[:3]}")
    if leftovers(out):
        problems.append(f"left beside the output: {leftovers(out)}")
    return [f"sm120-force: {p}" for p in problems]


SYSCALLS = ("fsync", "rename", "replace", "link")
SYSCALL_KINDS = {
    "sm120-out": ("fsync", "rename", "replace", "link"),
    "sm120-force": ("fsync", "rename"),
    "dropkv-out": ("fsync", "rename", "write"),
    "sm120-inplace": ("fsync", "rename", "replace"),
    "revert-inplace": ("fsync", "rename", "replace"),
    "revert-out": ("fsync", "rename", "link"),
}


@pytest.mark.parametrize("kind", SYSCALL_KINDS)
def test_syscall_failures_sampled(scenarios, templates, tmp_path, kind):
    problems, runs = _syscall_sweep(kind, scenarios, templates, tmp_path, SYSCALL_KINDS[kind],
                                    every=3)
    assert runs >= len(SYSCALL_KINDS[kind])
    assert problems == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", SYSCALL_KINDS)
def test_syscall_failures_every_call(scenarios, templates, tmp_path, kind):
    problems, _ = _syscall_sweep(kind, scenarios, templates, tmp_path, SYSCALL_KINDS[kind])
    assert problems == []


# --------------------------------------------------------------------------- misc


def test_missing_output_parent_is_a_clean_input_error(templates, tmp_path):
    model = _copy(templates["kimi"], tmp_path / "m")
    before = tree_state(model)
    r = run_cli("apply", "sm120-fp16-kv", model, "-o", tmp_path / "no" / "such" / "out")
    error_line(r, 2, "parent directory does not exist")
    assert tree_state(model) == before


def test_previous_output_hidden_by_an_interrupted_force_run_is_put_back(templates, tmp_path):
    """A --force run killed between moving the previous output aside and renaming the new one
    into place leaves the previous output hidden beside it; the next run puts it back (an
    earlier version deleted it as a stale leftover)."""
    model = _copy(templates["kimi"], tmp_path / "m")
    out = _copy(templates["fixed"], tmp_path / "out")
    before = tree_state(out)
    os.rename(out, tmp_path / ".out.modelpatch-replaced-99999")     # the kill's leftover
    with pytest.raises(PatchError, match="output already exists"):
        api.apply("sm120-fp16-kv", model, out=out, jobs=1)
    assert tree_state(out) == before and leftovers(out) == []
    api.apply("sm120-fp16-kv", model, out=out, jobs=1, force=True)  # replaced on purpose
    assert api.verify(out).ok and leftovers(out) == []


@pytest.fixture(scope="module", autouse=True)
def _coverage_report():
    """After this module's tests, in whatever order they ran: how many distinct I/O fault points
    they covered (a line of output, ``-s``)."""
    yield
    print(f"\n{len(_COVERED)} distinct I/O fault points covered")
