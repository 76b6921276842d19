"""The ``modelpatch doctor`` command (registered on the main group by ``patcher.cli``), and
``--fix``'s application of the fixing recipes through the API."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from .options import (
    endpoint_option,
    force_option,
    json_option,
    link_mode,
    link_options,
    output_option,
)

if TYPE_CHECKING:
    from ..doctor.report import DoctorReport


@click.command()
@click.argument("model")
@click.option("--engine", default=None, metavar="NAME[==VERSION]",
              help="vllm, sglang or transformers, with ==VERSION or else the installed version.")
@click.option("--gpu", default=None, metavar="smNN|auto",
              help="Compute capability (sm90, sm120, 8.9) or auto (torch, then nvidia-smi).")
@click.option("--rules", "rules_dirs", multiple=True, type=click.Path(path_type=str),
              help="A directory of extra rule files (*.yaml); may be repeated.")
@click.option("--allow-recipe-files", is_flag=True,
              help="Let a --rules file's fix.recipe name a recipe file below its directory "
                   "(default: built-in recipes only).")
@click.option("--fix", is_flag=True,
              help="Apply the fixing recipes as one verified variant, then diagnose it.")
@output_option("With --fix: where to write the variant (default: <model>-doctor).")
@click.option("--in-place", is_flag=True, help="With --fix: patch MODEL itself (revertible).")
@force_option("With --fix: replace an existing output that modelpatch wrote earlier, an earlier "
              "fix of the same model included (never a directory it did not write).")
@link_options
@endpoint_option()
@json_option("Machine-readable report.")
@click.option("--sign", "sign_key", type=click.Path(dir_okay=False, path_type=str),
              default=None, metavar="PRIVATE.pem",
              help="With --fix: commit the fixed variant signed (OMS model.sig) by this key.")
@click.pass_context
def doctor(ctx, model, engine, gpu, rules_dirs, allow_recipe_files, fix, out, in_place, force,
           link, force_copy, endpoint, as_json, sign_key=None):
    """Check MODEL (a directory or hf://ORG/NAME[@REV], read without its tensor data) against
    an engine version and GPU. Exit 1 when a blocker is found (after --fix: when one remains)."""
    from dataclasses import replace

    from .. import api
    from ..doctor.diagnose import render
    from ..doctor.fix import fixing_params, fixing_recipes, nothing_to_fix
    from ..doctor.report import FixOutcome
    from ..model_ref import ModelRef
    from .output import echo, echo_json

    if (out or in_place or force or link or force_copy) and not fix:
        raise click.UsageError("-o/--output, --in-place, --force, --link and --copy go with "
                               "--fix")
    if in_place and (out or link or force_copy):
        raise click.UsageError("--in-place excludes -o/--output, --link and --copy")
    if sign_key is not None and (not fix or in_place):
        raise click.UsageError("--sign goes with --fix, without --in-place (sign a patched "
                               "directory afterwards with `modelpatch sign`)")
    signer = api.signer_of(sign_key)            # a bad key fails before any work
    if in_place and ModelRef.parse(model).is_hub:
        raise click.UsageError("--in-place cannot patch a hub model (it would change the "
                               "download cache); give -o OUT or nothing")
    report = api.doctor(model, engine=engine, gpu=gpu, rules=rules_dirs, endpoint=endpoint,
                        allow_recipe_files=allow_recipe_files)
    final = report
    recipes = fixing_recipes(report) if fix else []
    if recipes:
        quiet = bool((ctx.find_root().obj or {}).get("quiet"))
        fixed = apply_fixes(_diagnosed(model, report), recipes, out=out, in_place=in_place,
                            force=force, endpoint=endpoint, progress=not quiet,
                            params=fixing_params(report), sign=signer,
                            link=link_mode(link, force_copy))
        final = api.doctor(fixed, engine=engine, gpu=gpu, rules=rules_dirs,
                           allow_recipe_files=allow_recipe_files)
        report = replace(report, fix=FixOutcome(tuple(recipes), str(fixed), final))
    if as_json:
        echo_json(report.to_json())
    else:
        echo(render(report))
        if report.remote is not None:
            from ..remote.model import describe_transfer

            echo(describe_transfer(report.remote))
        if recipes:
            echo(f"\nfixed with {', '.join(recipes)}: {final.model}")
            echo(render(final))
        elif fix:
            echo(nothing_to_fix(report))
    ctx.exit(0 if report.ok else 1)


def _diagnosed(model: str, report: DoctorReport) -> str:
    """The model the report is about: for ``hf://``, the very commit read (the branch may have
    moved since), so that ``--fix`` fixes what was diagnosed."""
    if report.remote is None:
        return model
    from ..remote.model import command_words

    return command_words(report.remote)[0]


#: ``doctor --fix`` writes ``<model>-doctor`` unless ``-o`` names the output.
OUTPUT_SUFFIX = "doctor"


def apply_fixes(model: str, recipes: list[str], *, out: str | None, in_place: bool,
                endpoint: str | None, progress: bool, force: bool = False,
                params: dict[str, dict] | None = None, sign=None, link: str = "auto") -> Path:
    """Apply ``recipes`` (with ``params``: recipe -> its params) to ``model``; returns the
    directory that holds the result: ``out``, else ``default_output``. ``sign`` (a loaded
    signer): the fixed variant is committed with its ``model.sig``. ``link``: how the variant
    carries the base's unchanged files (as ``apply --link``)."""
    params = params or {}
    from .. import api
    from ..model_ref import ModelRef

    local, ref = model, ModelRef.parse(model)
    if ref.is_hub:
        from .progress import resolve_with_meter

        local = str(resolve_with_meter(ref, endpoint, quiet=not progress))
        if out is None and not in_place:
            out = f"{ref.name}-{OUTPUT_SUFFIX}"
    if in_place:
        applied = 0
        try:
            for recipe in recipes:
                api.apply_in_place(recipe, local, params=params.get(recipe))
                applied += 1
        except BaseException:
            for _ in range(applied):            # nothing half-fixed: undo the earlier fixes
                api.revert(local)
            raise
        return Path(local)
    return api.apply_stacked(recipes, local, out=out or default_output(local), force=force,
                             params=params, sign=sign, link=link)


def default_output(model: str) -> Path:
    """``<model>-doctor`` beside the model (``DIR/NAME-doctor`` for ``DIR/NAME.gguf``; in the
    current directory for a Hugging Face cache snapshot), however many recipes fix it."""
    from ..execute.engine import default_output as beside_directory
    from ..gguf.single_file import default_output as beside_file

    if model.endswith(".gguf"):
        return beside_file(model, OUTPUT_SUFFIX)
    return beside_directory(Path(model), OUTPUT_SUFFIX)
