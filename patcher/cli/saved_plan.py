"""``modelpatch apply PLAN.json [MODEL]``: carry out a plan saved by ``modelpatch plan --save``
(``patcher.saved_plan``), with only the options that say how the work runs."""

from __future__ import annotations

import os

import click
from click.core import ParameterSource

from .. import api
from ..saved_plan import is_plan_file
from .group import emit_json
from .output import echo
from .progress import Meters

# apply's options that shape a plan: given with a saved plan, they would not be what it says
_PLAN_SHAPING = {"in_place": "--in-place", "dry_run": "--dry-run", "force_copy": "--copy",
                 "link": "--link", "device": "--device", "max_shard_size": "--max-shard-size",
                 "allow_noop": "--allow-noop", "into_cache": "--into-cache",
                 "publish_to": "--publish", "set_values": "--set"}


def apply_saved_plan(ctx, recipe: tuple[str, ...], model: str) -> bool:
    """``apply PLAN.json [MODEL]``: carry out the saved plan; False for a recipe."""
    plan_file = recipe[0] if len(recipe) == 1 else model if not recipe else None
    if plan_file is None or not is_plan_file(plan_file):
        if not recipe:
            raise click.UsageError("Missing argument 'RECIPE...' (or a PLAN.json saved by "
                                   "`modelpatch plan --save`)")
        return False
    p = ctx.params
    given = [flag for name, flag in _PLAN_SHAPING.items()
             if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]
    if given:
        raise click.UsageError(f"a saved plan is carried out as it was made: {given[0]} "
                               f"belongs to `modelpatch plan`")
    with Meters(bool(ctx.obj.get("quiet"))) as meters:
        result = api.apply_saved(plan_file, model if recipe else None, out=p["out"],
                                 force=p["force"], progress=meters.engine_progress(),
                                 base_model=p["base_model"], jobs=p["jobs"],
                                 executor=p["executor"], ray_address=p["ray_address"],
                                 sign=p.get("sign_key"), require_signed_base=p.get("base_key"))
    if p["as_json"]:
        emit_json({"output": str(result.output), "manifest_sha256": result.manifest_sha256,
                   "files": result.files, "bytes_linked": result.bytes_linked,
                   "bytes_copied": result.bytes_copied, "bytes_written": result.bytes_written,
                   "bytes_hashed": result.bytes_hashed, "link_method": result.link_method})
    else:
        echo(os.path.abspath(result.output))
    return True
