"""Kill at any instant: apply (in place and out of place, config-only and shard-rewriting) and
revert run in a subprocess and are SIGKILLed at every named fault point they pass (enumerated by
a traced run: ``MODELPATCH_FAULT_TRACE``), repeats (``#N``) included.

After each kill the next command (``modelpatch verify``) recovers and says what it did; the tree
is then exactly one of the allowed states (the one before or the one after the command, compared
path by path: type, mode, bytes, link text), never anything else; hub blobs are untouched; and a
rerun of the killed command succeeds. Out of place: the base is unchanged and the output is
absent or fully verifying; the rerun leaves no staging directory or lock file behind.

The unmarked tests cover a representative subset. ``@pytest.mark.slow`` sweeps every point of
the main scenarios (``tensor:`` points, one per tensor written, and journal saves sampled), kills
the recovery of every switch point too, and kills at random instants.
``MODELPATCH_CRASH_SWEEP=full`` adds every tensor point, every journal save and four more
scenarios (several minutes).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fs_snapshot import MANIFEST, blobs, cli, copy_tree, diff, popen, snapshot

from patcher import api

RECORD = "record.json"
WORKERS = max(2, min(4, os.cpu_count() or 2))
FULL = os.environ.get("MODELPATCH_CRASH_SWEEP") == "full"


@dataclass
class Scenario:
    """One command to kill, run on a fresh copy of ``template`` for every instant."""

    name: str
    template: Path                      # copied to <case>/t for each run
    command: Callable[[Path], list]     # args, given the case's copy
    model: Callable[[Path], Path]       # the directory the command works on, in the copy
    states: dict[str, dict]             # allowed snapshots of the observed tree, by name
    observed: Callable[[Path], Path]    # what is compared (the model, or the cache root)
    before: str = "before"              # the state the command starts from
    after: str = "after"                # the state a complete run gives
    output: Callable[[Path], Path] | None = None   # out of place: the new directory
    output_state: dict | None = None
    vary: tuple[str, ...] = (MANIFEST, RECORD)
    hub_repo: Callable[[Path], Path] | None = None
    points: list[tuple[str, int]] = field(default_factory=list)


def _copy(template: Path, case: Path) -> Path:
    return copy_tree(template, case / "t")


def _state(path: Path, vary) -> dict:
    return snapshot(path, vary=vary)


def _trace(scenario: Scenario, work: Path) -> list[tuple[str, int]]:
    """The named points one complete run passes, each with its occurrence number."""
    case = work / "trace"
    root = _copy(scenario.template, case)
    trace = case / "trace.txt"
    env = {"MODELPATCH_FAULT_TRACE": str(trace), "MODELPATCH_CACHE_DIR": str(case / "dc")}
    r = cli(*scenario.command(root), env=env)
    assert r.returncode == 0, r.stderr
    counts: Counter = Counter()
    points = []
    for name in trace.read_text().splitlines():
        counts[name] += 1
        points.append((name, counts[name]))
    return points


def _sample(points: list[tuple[str, int]], fast: int | None = None) -> list[tuple[str, int]]:
    """Every point, except that tensor points (one per tensor written) and journal saves (one
    per step taken) are sampled (first, last, every 15th or 5th) unless the full sweep is asked
    for. With ``fast``, that many points spread evenly over the run (always the first and last
    tensor point, if any)."""
    tensors = [p for p in points if p[0].startswith("tensor:")]
    saves = [p for p in points if p[0] == "journal:save"]
    keep = set(tensors if FULL and fast is None else tensors[:1] + tensors[-1:]
               + ([] if fast is not None else tensors[::15]))
    keep_saves = set(saves if FULL and fast is None else saves[:1] + saves[-1:] + saves[::5])
    out = [p for p in points if (not p[0].startswith("tensor:") or p in keep)
           and (p[0] != "journal:save" or p in keep_saves)]
    if fast is not None and len(out) > fast:
        others = [p for p in out if p not in keep]
        step = len(others) / max(1, fast - len(keep))
        chosen = {others[int(i * step)] for i in range(fast - len(keep))} | keep
        out = [p for p in out if p in chosen]
    return out


def _check_after_kill(scenario: Scenario, root: Path, case: Path, blobs_before) -> list[str]:
    """Recover, compare with the allowed states, rerun if needed. Returns the problems."""
    problems = []
    env = {"MODELPATCH_CACHE_DIR": str(case / "dc")}
    model = scenario.model(root)
    had_journal = (model / ".modelpatch/journal.json").exists()
    r = cli("verify", model, env=env) if model.exists() else None
    if had_journal:
        said = r is not None and ("completed the interrupted" in r.stderr
                                  or "rolled back the interrupted" in r.stderr)
        if not said:
            problems.append(f"recovery said nothing: {r and r.stderr!r}")
        if (model / ".modelpatch/journal.json").exists():
            problems.append("journal still there after the next command")
    if r is not None and "Traceback" in r.stderr:
        problems.append(f"traceback: {r.stderr}")

    observed = _state(scenario.observed(root), scenario.vary)
    matches = [name for name, state in scenario.states.items() if state == observed]
    if not matches:
        closest = min(scenario.states.items(), key=lambda kv: len(diff(kv[1], observed)))
        problems.append(f"tree is none of the allowed states; vs {closest[0]}: "
                        f"{diff(closest[1], observed)[:6]}")
        return problems
    state = matches[0]
    if scenario.hub_repo is not None and blobs(scenario.hub_repo(root)) != blobs_before:
        problems.append("hub blobs changed")
    if (model / MANIFEST).exists() and r is not None and r.returncode != 0:
        problems.append(f"{state} state does not verify: {r.stdout} {r.stderr}")
    if scenario.output is not None:
        out = scenario.output(root)
        if out.exists():
            v = cli("verify", out, env=env) if (out / MANIFEST).exists() else None
            if v is not None and v.returncode != 0:
                problems.append(f"output exists but does not verify: {v.stdout} {v.stderr}")
            if _state(out, scenario.vary) != scenario.output_state:
                changed = diff(scenario.output_state, _state(out, scenario.vary))
                problems.append(f"output differs: {changed[:6]}")
            return problems
    elif state == scenario.after:
        return problems
    # Rerun the killed command: it must succeed and give the complete result.
    rerun = cli(*scenario.command(root), env=env)
    if rerun.returncode != 0:
        problems.append(f"rerun failed ({rerun.returncode}): {rerun.stderr}")
        return problems
    observed = _state(scenario.observed(root), scenario.vary)
    if observed != scenario.states[scenario.after]:
        changed = diff(scenario.states[scenario.after], observed)
        problems.append(f"rerun result differs: {changed[:6]}")
    if scenario.output is not None:
        out = scenario.output(root)
        if _state(out, scenario.vary) != scenario.output_state:
            problems.append("rerun output differs")
        leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
        if leftovers:
            problems.append(f"left beside the output: {leftovers}")
    return problems


def _kill_case(scenario: Scenario, work: Path, index: int, point: str, nth: int,
               then_kill_recovery: str | None = None) -> list[str]:
    case = work / f"case-{index}"
    root = _copy(scenario.template, case)
    blobs_before = blobs(scenario.hub_repo(root)) if scenario.hub_repo else None
    env = {"MODELPATCH_FAULT": f"kill@{point}#{nth}", "MODELPATCH_CACHE_DIR": str(case / "dc")}
    r = cli(*scenario.command(root), env=env)
    if r.returncode != -signal.SIGKILL:
        return [f"not killed at {point}#{nth}: rc {r.returncode} {r.stderr}"]
    if then_kill_recovery and (scenario.model(root) / ".modelpatch/journal.json").exists():
        env2 = {"MODELPATCH_FAULT": f"kill@{then_kill_recovery}",
                "MODELPATCH_CACHE_DIR": str(case / "dc")}
        r2 = cli("verify", scenario.model(root), env=env2)
        if r2.returncode not in (-signal.SIGKILL, 0, 2):
            return [f"recovery run failed: {r2.returncode} {r2.stderr}"]
    problems = _check_after_kill(scenario, root, case, blobs_before)
    return [f"{scenario.name} kill@{point}#{nth}"
            + (f" then kill@{then_kill_recovery}" if then_kill_recovery else "") + f": {p}"
            for p in problems]


def _sweep(scenario: Scenario, work: Path, cases: list[tuple]) -> list[str]:
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = [pool.submit(_kill_case, scenario, work, i, *case)
                   for i, case in enumerate(cases)]
        problems = [p for f in futures for p in f.result()]
    _COVERED.update((scenario.name,) + tuple(c) for c in cases)
    return problems


_COVERED: set[tuple] = set()


# --------------------------------------------------------------------------- templates


@pytest.fixture(scope="module")
def templates(kimi_dir, tmp_path_factory):
    """Every starting state, built once: copies are made per kill."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELPATCH_CACHE_DIR", str(tmp_path_factory.mktemp("dc")))
        yield _templates(kimi_dir, tmp_path_factory)


def _templates(kimi_dir, tmp_path_factory):
    from examples.generate import make_hf_cache_snapshot

    t = tmp_path_factory.mktemp("templates")
    original = copy_tree(kimi_dir, t / "original" / "t")
    p1 = copy_tree(original, t / "p1" / "t")
    api.apply_in_place("sm120-fp16-kv", p1)
    p2 = copy_tree(p1, t / "p2" / "t")
    api.apply_in_place("drop-kv-scales", p2)
    hub = t / "hub-original" / "t"
    make_hf_cache_snapshot(kimi_dir, hub, "org/kimi", commit="a" * 40)
    make_hf_cache_snapshot(kimi_dir, hub, "org/kimi", commit="b" * 40)   # shares the blobs
    hub_p1 = copy_tree(hub, t / "hub-p1" / "t")
    api.apply_in_place("sm120-fp16-kv", _hub_snapshot(hub_p1))
    recipe = t / "add-notes.yaml"
    recipe.write_text(ADD_NOTES)
    files = copy_tree(original, t / "files" / "t")
    api.apply_in_place(recipe, files)
    hub_files = copy_tree(hub, t / "hub-files" / "t")
    api.apply_in_place(recipe, _hub_snapshot(hub_files))
    oop = t / "oop" / "t"
    copy_tree(original, oop / "base")
    oop_v1 = t / "oop-v1" / "t"
    copy_tree(original, oop_v1 / "base")
    api.apply("sm120-fp16-kv", oop_v1 / "base", out=oop_v1 / "v1")
    oop_v1_done = copy_tree(oop_v1, t / "oop-v1-done" / "t")
    api.apply("drop-kv-scales", oop_v1_done / "v1", out=oop_v1_done / "v2")
    return {"original": original, "p1": p1, "p2": p2, "hub": hub, "hub-p1": hub_p1,
            "recipe": recipe, "files": files, "hub-files": hub_files,
            "oop": oop, "oop-v1": oop_v1, "oop-v1-done": oop_v1_done}


# Adds a file in new directories and drops one: steps that reuse paths (a revert discards
# nothing for the dropped file, then puts it back) and directories made and removed.
ADD_NOTES = ("modelpatch: 1\nname: add-notes\ndescription: d\nfiles:\n"
             "  - add: notes/deep/README.md\n    content: hello\n"
             "  - drop: tiktoken.model\n  - drop: docs/deploy_guidance.md\n")


def _hub_snapshot(cache_root: Path) -> Path:
    return cache_root / "models--org--kimi" / "snapshots" / ("a" * 40)


VARY = (MANIFEST, RECORD)   # timestamps; the directory's path


def _in_place(name, template, after_template, command, *, mid=None) -> Scenario:
    states = {"before": _state(template, VARY), "after": _state(after_template, VARY)}
    if mid is not None:
        states["mid"] = _state(mid, VARY)
    return Scenario(name, template, command, lambda r: r, states, lambda r: r)


def _scenarios(t) -> dict[str, Scenario]:
    s = {
        "apply-config": _in_place("apply-config", t["original"], t["p1"], lambda r: [
            "apply", "sm120-fp16-kv", r, "--in-place", "-j", "1", "-q"]),
        "apply-shards": _in_place("apply-shards", t["p1"], t["p2"], lambda r: [
            "apply", "drop-kv-scales", r, "--in-place", "-j", "1", "-q"]),
        "revert": _in_place("revert", t["p1"], t["original"], lambda r: ["revert", r]),
        "revert-shards": _in_place("revert-shards", t["p2"], t["p1"], lambda r: ["revert", r]),
        "revert-all": _in_place("revert-all", t["p2"], t["original"],
                                lambda r: ["revert", r, "--all"], mid=t["p1"]),
    }
    s["apply-files"] = _in_place("apply-files", t["original"], t["files"], lambda r: [
        "apply", t["recipe"], r, "--in-place", "-q"])
    s["revert-files"] = _in_place("revert-files", t["files"], t["original"],
                                  lambda r: ["revert", r])
    hub_states = {"before": _state(t["hub"], VARY), "after": _state(t["hub-p1"], VARY)}
    s["hub-apply"] = Scenario(
        "hub-apply", t["hub"], lambda r: ["apply", "sm120-fp16-kv", _hub_snapshot(r),
                                          "--in-place", "-q"],
        _hub_snapshot, hub_states, lambda r: r, hub_repo=lambda r: r / "models--org--kimi")
    s["hub-revert"] = Scenario(
        "hub-revert", t["hub-p1"], lambda r: ["revert", _hub_snapshot(r)], _hub_snapshot,
        {"before": hub_states["after"], "after": hub_states["before"]}, lambda r: r,
        hub_repo=lambda r: r / "models--org--kimi")
    hub_files = {"before": hub_states["before"], "after": _state(t["hub-files"], VARY)}
    s["hub-apply-files"] = Scenario(
        "hub-apply-files", t["hub"], lambda r: ["apply", t["recipe"], _hub_snapshot(r),
                                                "--in-place", "-q"],
        _hub_snapshot, hub_files, lambda r: r, hub_repo=lambda r: r / "models--org--kimi")
    s["hub-revert-files"] = Scenario(
        "hub-revert-files", t["hub-files"], lambda r: ["revert", _hub_snapshot(r)],
        _hub_snapshot, {"before": hub_files["after"], "after": hub_files["before"]},
        lambda r: r, hub_repo=lambda r: r / "models--org--kimi")
    vary = VARY
    s["oop-apply"] = Scenario(
        "oop-apply", t["oop"], lambda r: ["apply", "sm120-fp16-kv", r / "base", "-o", r / "v1",
                                          "-q"],
        lambda r: r / "base", {"before": _state(t["oop"] / "base", vary)}, lambda r: r / "base",
        after="before", output=lambda r: r / "v1",
        output_state=_state(t["oop-v1"] / "v1", vary), vary=vary)
    s["oop-apply-shards"] = Scenario(
        "oop-apply-shards", t["oop-v1"], lambda r: ["apply", "drop-kv-scales", r / "v1", "-o",
                                                    r / "v2", "-q", "-j", "1"],
        lambda r: r / "v1", {"before": _state(t["oop-v1"] / "v1", vary)}, lambda r: r / "v1",
        after="before", output=lambda r: r / "v2",
        output_state=_state(t["oop-v1-done"] / "v2", vary), vary=vary)
    s["oop-revert"] = Scenario(
        "oop-revert", t["oop-v1"], lambda r: ["revert", r / "v1", "-o", r / "back"],
        lambda r: r / "v1", {"before": _state(t["oop-v1"] / "v1", vary)}, lambda r: r / "v1",
        after="before", output=lambda r: r / "back",
        output_state=_state(t["oop"] / "base", vary), vary=vary)
    return s


class _Traced(dict):
    """The scenarios, each traced (its points enumerated) the first time a test asks for it."""

    def __init__(self, found: dict[str, Scenario], work: Path):
        super().__init__(found)
        self.work = work

    def __getitem__(self, name: str) -> Scenario:
        scenario = super().__getitem__(name)
        if not scenario.points:
            scenario.points = _trace(scenario, self.work / name)
        return scenario


@pytest.fixture(scope="module")
def scenarios(templates, tmp_path_factory):
    return _Traced(_scenarios(templates), tmp_path_factory.mktemp("traces"))


# --------------------------------------------------------------------------- tests


def test_points_are_enumerated_for_every_stage(scenarios):
    names = {p for name in ("apply-config", "apply-shards", "revert-all", "hub-revert",
                            "oop-apply", "oop-revert") for p, _ in scenarios[name].points}
    for expected in ("hashing", "manifest", "commit", "inplace:prepared", "journal:switch",
                     "journal:stash:config.json", "journal:install:config.json:taken",
                     "journal:install:modelpatch.provenance.json", "journal:finish",
                     "journal:discard:config.json", "journal:unstash:config.json",
                     "journal:relink:config.json", "journal:unstash:modelpatch.provenance.json",
                     "journal:discard:modelpatch.provenance.json:taken",
                     "revert:prepared", "revert:rebuilt"):
        assert expected in names, expected
    assert any(p.startswith("tensor:") for p in names)
    assert ("journal:finish", 2) in scenarios["revert-all"].points


FAST = {"apply-config": 6, "apply-shards": 4, "revert-all": 6, "hub-apply": 4,
        "hub-revert": 3, "oop-apply": 3, "oop-revert": 2}


@pytest.mark.parametrize("name", FAST)
def test_kill_at_sampled_points(scenarios, name, tmp_path):
    scenario = scenarios[name]
    cases = _sample(scenario.points, FAST[name])
    assert len(cases) == FAST[name]
    assert _sweep(scenario, tmp_path, cases) == []


def test_kill_a_revert_that_restores_a_dropped_file(scenarios, tmp_path):
    """Once the dropped file is back, recovery must not throw it away again."""
    sc = scenarios["revert-files"]
    cases = [("journal:unstash:tiktoken.model:taken", 1), ("journal:finish", 1),
             ("journal:rmdir:notes:taken", 1), ("journal:finish:cleaned", 1)]
    assert set(cases) <= set(sc.points)
    assert _sweep(sc, tmp_path, cases) == []


@pytest.mark.parametrize("name, cases", [
    ("hub-apply-files", [("journal:unlink:docs/deploy_guidance.md:taken", 1),
                         ("journal:install:notes/deep/README.md", 1)]),
    ("hub-revert-files", [("journal:relink:docs/deploy_guidance.md", 1),
                          ("journal:relink:tiktoken.model:taken", 1)])])
def test_kill_around_dropped_and_restored_links(scenarios, name, cases, tmp_path):
    sc = scenarios[name]
    assert set(cases) <= set(sc.points)
    assert _sweep(sc, tmp_path, cases) == []


def test_kill_while_the_state_directory_is_made_or_removed(scenarios, tmp_path):
    """Between mkdir .modelpatch and the journal, between the journal and rmdir .modelpatch,
    and halfway through a journal save: the next command leaves no residue."""
    assert _sweep(scenarios["apply-config"], tmp_path / "a",
                  [("journal:create", 1), ("journal:save", 1)]) == []
    assert _sweep(scenarios["revert"], tmp_path / "r",
                  [("journal:end", 1), ("journal:finish:unlisted", 1)]) == []


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                pids.append(int(entry.name))
    return pids


def test_kill_in_a_pool_worker_releases_the_directory(scenarios, tmp_path):
    """A crash while shard workers run (-j 2): a worker outliving the main process must not
    keep the directory locked (it would refuse every later command)."""
    sc = scenarios["apply-shards"]
    root = _copy(sc.template, tmp_path)
    first_tensor = next(p for p, _ in sc.points if p.startswith("tensor:"))
    args = ["apply", "drop-kv-scales", root, "--in-place", "-q", "-j", "2"]
    try:
        # Output to a file: an orphaned worker keeps pipes open, so no pipe would reach EOF.
        with open(tmp_path / "out.txt", "w") as out:
            proc = popen(*args, env={"MODELPATCH_FAULT": f"kill@{first_tensor}"}, stdout=out)
            assert proc.wait(timeout=120) == -signal.SIGKILL
        deadline = time.monotonic() + 10          # the other worker dies with the apply
        while _processes_mentioning(str(root)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _processes_mentioning(str(root)) == []
        v = cli("verify", root)
        assert "rolled back the interrupted apply" in v.stderr, v.stderr
        assert _state(root, VARY) == sc.states["before"]
        assert cli(*args).returncode == 0
        assert _state(root, VARY) == sc.states["after"]
    finally:
        for pid in _processes_mentioning(str(root)):      # orphaned workers of the killed run
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_kill_the_recovery_too(scenarios, tmp_path):
    """A crash during the recovery of a crash is recovered by the command after it."""
    sc = scenarios["apply-config"]
    cases = [("journal:install:config.json:taken", 1, "journal:finish"),
             ("journal:stash:hf_quant_config.json", 1,
              "journal:install:hf_quant_config.json"),
             ("inplace:prepared", 1, "journal:rollback")]
    assert _sweep(sc, tmp_path, cases) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["apply-config", "apply-shards", "revert", "revert-all",
                                  "revert-files", "hub-apply", "hub-revert", "hub-revert-files",
                                  "oop-apply", "oop-revert"]
                         + (["apply-files", "hub-apply-files", "oop-apply-shards",
                             "revert-shards"] if FULL else []))
def test_kill_at_every_point(scenarios, name, tmp_path):
    scenario = scenarios[name]
    assert _sweep(scenario, tmp_path, _sample(scenario.points)) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["apply-config", "hub-revert"] + (["revert-all"] if FULL else []))
def test_kill_every_switch_point_then_the_recovery(scenarios, name, tmp_path):
    scenario = scenarios[name]
    switch = [p for p in scenario.points if p[0].startswith("journal:")
              and p[0] not in ("journal:switch",)]
    cases = [(p, n, "journal:finish") for p, n in switch]
    assert _sweep(scenario, tmp_path, cases) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["apply-shards", "revert-all"])
def test_kill_at_random_instants(scenarios, name, tmp_path):
    """SIGKILL after a random delay, wherever the process is (including between points)."""
    scenario = scenarios[name]
    rng = random.Random(name)

    def one(index: int) -> list[str]:
        case = tmp_path / f"random-{index}"
        root = _copy(scenario.template, case)
        blobs_before = blobs(scenario.hub_repo(root)) if scenario.hub_repo else None
        proc = popen(*scenario.command(root), env={"MODELPATCH_CACHE_DIR": str(case / "dc")})
        time.sleep(rng.uniform(0.1, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        return [f"{name} random #{index}: {p}"
                for p in _check_after_kill(scenario, root, case, blobs_before)]

    with ThreadPoolExecutor(WORKERS) as pool:
        problems = [p for f in [pool.submit(one, i) for i in range(8)] for p in f.result()]
    assert problems == []


@pytest.fixture(scope="module", autouse=True)
def _coverage_report(request):
    """After this module's tests, in whatever order they ran: the distinct kill instants they
    covered, in .pytest_cache/crash-coverage.json and as a line of output (``-s``)."""
    yield
    path = Path(request.config.rootpath) / ".pytest_cache" / "crash-coverage.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(sorted(map(list, _COVERED)), indent=0))
    print(f"\n{len(_COVERED)} distinct kill instants covered")
