"""The model card (README.md) of a published variant.

An existing card's text and metadata are kept. The metadata gains ``base_model`` (when the
base's hub repository is known: ``patcher.base_identity``; otherwise any ``base_model`` there is
removed, as it would name another model), the ``modelpatch`` tag and the recipe name; the body gains (or has replaced) one section between
markers that lists what the patch changed. Parsing and rendering go through huggingface_hub's
``ModelCard``, so the front matter stays what the Hub expects.
"""

from __future__ import annotations

import re

from ..manifest import CHANGES_BYPRODUCT, Manifest

CARD_NAME = "README.md"
BEGIN, END = "<!-- modelpatch:begin -->", "<!-- modelpatch:end -->"
_SECTION = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.S)
def recipe_chain(manifest: Manifest) -> list[tuple[dict, list[dict]]]:
    """(recipe, changes) of every patch behind ``manifest``, oldest first: stacked patches and
    variants of variants embed their base's statement, down to the original model."""
    chain, statement = [], manifest.statement
    while isinstance(statement, dict):
        build = statement.get("predicate", {}).get("buildDefinition", {})
        params = build.get("externalParameters", {})
        changes = next((item.get("annotations", {}).get("changes", [])
                        for item in statement["predicate"].get("runDetails", {})
                        .get("byproducts", []) if item.get("name") == CHANGES_BYPRODUCT), [])
        chain.append((params.get("recipe", {}), changes))
        statement = params.get("base_provenance")
    return chain[::-1]


def change_lines(changes: list[dict], limit: int = 40) -> list[str]:
    lines = []
    for c in changes:
        kind = c.get("kind")
        if kind in ("removed", "set", "renamed", "copied"):
            target = f"`{c['path']}`" + (f" from `{c['from']}`" if c.get("from") else "")
            lines.append(f"- `{c['file']}`: {kind} {target}")
        elif kind == "tensor_converted":
            b, a = c["before"], c["after"]
            lines.append(f"- tensor `{c['tensor']}`: {c['how']} {b['dtype']}{b['shape']} -> "
                         f"{a['dtype']}{a['shape']}")
        elif kind in ("tensor_dropped", "tensor_renamed"):
            extra = f" -> `{c['to']}`" if kind == "tensor_renamed" else ""
            lines.append(f"- tensor `{c['tensor']}`: {kind.split('_')[1]}{extra}")
        elif kind in ("file_dropped", "file_added"):
            lines.append(f"- file `{c['file']}`: {kind.split('_')[1]}")
    if len(lines) > limit:
        lines = lines[:limit] + [f"- ... and {len(lines) - limit} more (see "
                                 f"`modelpatch.provenance.json`)"]
    return lines


def render_card(existing: str | None, manifest: Manifest, base_model: str | None,
                base: str) -> str:
    """The card for a variant of ``base`` (its path: named in the text when ``base_model``, the
    hub repository ``ORG/NAME``, is None)."""
    from huggingface_hub import ModelCard

    card = ModelCard(existing or "---\ntags:\n- modelpatch\n---\n")
    chain = recipe_chain(manifest)
    data = card.data
    data.base_model = base_model
    tags = list(data.tags or [])
    for tag in ["modelpatch", *(f"modelpatch-recipe:{r['name']}" for r, _ in chain)]:
        if tag not in tags:
            tags.append(tag)
    data.tags = tags
    data.modelpatch_recipe = manifest.recipe["name"]
    if len(chain) > 1:
        data.modelpatch_recipes = [r["name"] for r, _ in chain]
    section = "\n".join([
        BEGIN,
        "## Patched with modelpatch",
        "",
        f"This is {_base_text(base_model, base)} with the modelpatch "
        f"{'recipe' if len(chain) == 1 else 'recipes'} "
        + ", then ".join(f"`{r['name']}` (sha256 `{r['sha256'][:16]}...`)" for r, _ in chain)
        + " applied. Every file is listed with its sha256 in `modelpatch.provenance.json`; "
          "`modelpatch verify` checks a download against it.",
        "",
        *_changes_section(chain),
        END,
        "",
    ])
    body = card.text
    body = _SECTION.sub(section, body) if _SECTION.search(body) else body.rstrip("\n") + (
        "\n\n" if body.strip() else "") + section
    card.text = body
    return str(card)


def _base_text(base_model: str | None, base: str) -> str:
    if base_model:
        return f"`{base_model}`"
    return f"the model from `{base.rstrip('/').rsplit('/', 1)[-1]}` (hub repository not recorded)"


def _changes_section(chain: list[tuple[dict, list[dict]]]) -> list[str]:
    if len(chain) == 1:
        return change_lines(chain[0][1]) or ["- no changes"]
    lines: list[str] = []
    for recipe, changes in chain:
        lines += [f"### `{recipe['name']}`", "", *(change_lines(changes) or ["- no changes"]), ""]
    return lines[:-1]
