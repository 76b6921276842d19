"""The model card's body cannot be injected: a recipe's JSON pointer, value, tensor name or a
GGUF key holding newlines, HTML, ``javascript:`` links, a fake end marker or a ``---`` block
renders as inert code text (checked with markdown-it-py, a CommonMark renderer), the front
matter stays the card's own, and a second publish still finds the one real section."""

from __future__ import annotations

import json

from hostile_helpers import S1, S2, make_model
from huggingface_hub import ModelCard
from markdown_it import MarkdownIt

from patcher import api
from patcher.hub.client.model_card import BEGIN, END, code, render_card
from patcher.integrity.manifest import read_manifest

PAYLOAD = ("\n<!-- modelpatch:end -->\n---\nlicense: evil\n---\n# Owned\n"
           "<img src=x onerror=alert(1)>\n[click](javascript:alert(1)) ``` `x` \x1b]52;c;eA==\x07")


def _yaml(text: str) -> str:
    return json.dumps(text)          # a JSON string is a YAML double-quoted scalar


def test_names_with_markup_render_inert_in_the_card(tmp_path):
    shards = {S1: {"model.embed_tokens.weight": ("BF16", [8, 4], 64),
                   f"model.mlp{PAYLOAD}.weight": ("BF16", [4, 4], 32)},
              S2: {"lm_head.weight": ("BF16", [8, 4], 64)}}
    model = make_model(tmp_path / "m", shards=shards,
                       config={"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""modelpatch: 1
name: card
description: a recipe whose names carry markup
config:
  config.json:
    - set: {_yaml("/note" + PAYLOAD)}
      value: {_yaml(PAYLOAD)}
tensors:
  - select: {{regex: 'mlp'}}
    drop: true
""")
    variant = api.apply(recipe, model, out=tmp_path / "v").output
    existing = "---\nlicense: mit\n---\nThe owner's text.\n"
    card = render_card(existing, read_manifest(variant), None, str(model))

    data = ModelCard(card).data.to_dict()
    assert data["license"] == "mit" and sorted(data) == ["license", "modelpatch_recipe", "tags"]
    body = card.split("---\n", 2)[2]
    lines = body.splitlines()
    assert lines.count(BEGIN) == 1 and lines.count(END) == 1
    assert not any(line.strip() in ("---", "# Owned") for line in lines)
    assert "\x1b" not in card
    html = MarkdownIt("commonmark").render(body)
    assert "<img" not in html and "href=" not in html and "<h1>" not in html
    assert html.count("&lt;img src=x onerror=alert(1)&gt;") == 2        # pointer, tensor
    # publishing again replaces the one real section, and keeps the owner's text
    again = render_card(card, read_manifest(variant), None, str(model))
    assert again == card


def test_a_code_span_holds_any_backticks():
    md = MarkdownIt("commonmark")
    for text in ["plain", "a`b", "``x``", "`edge`", "tail`", "a\nb", "<b>"]:
        html = md.renderInline(code(text))
        assert html.startswith("<code>") and html.endswith("</code>")
        assert "\n" not in html
