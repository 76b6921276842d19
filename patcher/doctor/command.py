"""The ``modelpatch doctor`` command (registered on the main group by ``patcher.cli``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..cli.options import (
    endpoint_option,
    force_option,
    json_option,
    link_mode,
    link_options,
    output_option,
)

if TYPE_CHECKING:
    from .report import DoctorReport


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
    from ..cli.output import echo, echo_json
    from ..model_ref import ModelRef
    from .diagnose import render
    from .fix import apply_fixes, fixing_params, fixing_recipes, nothing_to_fix
    from .report import FixOutcome

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
