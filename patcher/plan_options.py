"""``PlanOptions``: what shapes a plan and its execution besides the recipe and the model,
built and checked in one place (``PlanOptions.of``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import InputError

LINK_MODES = ("auto", "reflink", "hardlink", "copy")
EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class PlanOptions:
    """What shapes a plan and its execution besides the recipe and the model. Built in one place,
    ``PlanOptions.of``, by every caller (the CLI, ``api.plan``, ``api.apply``,
    ``api.apply_in_place``, the hub's remote apply); the plan carries it, the executors read
    their settings from it and nothing else, and the manifest records ``to_json()``."""

    in_place: bool = False
    link: str | None = None
    """Out of place: how the base's unchanged files are carried (``auto``, ``reflink``,
    ``hardlink``, ``copy``); None in place."""
    jobs: int | None = None
    """Worker processes for shard rewrites; None: as many as the thread budget allows."""
    device: str | None = "cpu"
    """Where tensor kernels run; None: nothing is computed here (a config-only apply on the
    hub), and the manifest records neither ``jobs`` nor ``device``."""
    max_shard_size: int | None = None
    """Reshard the output into shards of at most this many bytes (overrides the recipe's)."""
    params: Mapping[str, Any] | None = None
    """Values of the recipe's ``params:`` (typed, or strings as ``--set`` gives them)."""
    executor: str = "local"
    """Where shard tasks and file hashes run: ``local`` (this process's pools) or ``ray``."""
    ray_address: str | None = None
    """The Ray cluster of ``executor="ray"`` (None: ray's own default)."""

    @classmethod
    def of(cls, value: PlanOptions | Mapping[str, Any] | None = None, /,
           **given: Any) -> PlanOptions:
        """The options: ``value`` (a ``PlanOptions``, or a mapping of its field names, as the
        library's ``api.plan(options={...})`` takes) with the fields ``given`` that are not None
        replacing its own; ``force_copy=True`` is ``link="copy"``. Checked and normalized here,
        once: an unknown name, link mode or executor is an InputError; in place there is no
        link; no params is None.

        Example:
            >>> PlanOptions.of({"jobs": 2}, in_place=True, link="auto").link is None
            True
        """
        names = {f.name for f in fields(cls)}
        base = _asdict(value) if isinstance(value, PlanOptions) else dict(value or {})
        force_copy = given.pop("force_copy", False)
        merged = {**base, **{k: v for k, v in given.items() if v is not None}}
        unknown = sorted(set(merged) - names)
        if unknown:
            raise InputError(f"unknown plan option {unknown[0]!r} (options: "
                             f"{', '.join(sorted(names))})")
        if force_copy:
            if merged.get("link") not in (None, "auto", "copy"):
                raise InputError(f"force_copy is link='copy'; it excludes link="
                                 f"{merged['link']!r}")
            merged["link"] = "copy"
        options = cls(**merged)
        if options.link is not None and options.link not in LINK_MODES:
            raise InputError(f"link mode {options.link!r} is not one of {', '.join(LINK_MODES)}")
        if options.executor not in EXECUTORS:
            raise InputError(f"unknown executor {options.executor!r}: local or ray")
        if options.ray_address is not None and options.executor != "ray":
            raise InputError("--ray-address needs --executor ray")
        return replace(options, link=None if options.in_place else options.link,
                       params=dict(options.params) if options.params else None)

    def out_of_place(self) -> PlanOptions:
        """These options for a new variant: the base's files carried in ``auto`` mode unless
        a link mode was given."""
        return self if self.link is not None else replace(self, link="auto")

    def to_json(self) -> dict[str, Any]:
        """The options as the provenance manifest records them."""
        out: dict[str, Any] = {} if self.link is None else {"link": self.link}
        if self.device is not None:
            out.update(jobs=self.jobs, device=self.device)
        out.update(in_place=self.in_place, max_shard_size=self.max_shard_size)
        if self.params:
            out["params"] = dict(self.params)
        if self.executor != "local":
            out["executor"] = self.executor
        return out


def _asdict(options: PlanOptions) -> dict[str, Any]:
    return {f.name: getattr(options, f.name) for f in fields(options)}


def _asdict(options: PlanOptions) -> dict[str, Any]:
    return {f.name: getattr(options, f.name) for f in fields(options)}
