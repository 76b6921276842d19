"""The transformers, compressed-tensors and gguf-py columns of integration/consumer_matrix.py, in
the test suite (its vLLM column runs through integration/run-vllm.sh): every recipe x producer
row loads in transformers and, for a compressed-tensors output, decompresses, with nothing
missing or mismatched and finite logits; every GGUF row reads back in gguf-py with the base's
tensor bytes and the metadata the recipe promises (gguf-new-metadata's, where it makes the
same edit)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
import consumer_matrix as matrix  # noqa: E402

#: rows whose base transformers cannot load at all (ModelOpt's NVFP4 DeepSeek-V3 export, with
#: ModelOpt's KV-scale names or compressed-tensors'): their KV-scale names are checked against
#: vLLM's remap in tests/test_mla.py and tests/tensors/test_scale_ops.py
_UNCHANGED_UNLOADABLE = {
    "kv-scale-names / ModelOpt DeepSeek-V3 (MLA)",
    "kv-scale-names / DeepSeek-V3, self_attn.k_scale, kv_lora_rank left to its default"}


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


@pytest.mark.parametrize("label, recipe, producer",
                         [r for r in matrix.ROWS if r[0] not in _UNCHANGED_UNLOADABLE],
                         ids=[r[0] for r in matrix.ROWS if r[0] not in _UNCHANGED_UNLOADABLE])
def test_row_loads_in_transformers_and_compressed_tensors(tmp_path, label, recipe, producer):
    base, out = matrix.apply_row(recipe, producer, tmp_path)
    assert out != base, "the recipe changed nothing"
    cells = [matrix.transformers_cell(out), matrix.compressed_tensors_cell(out)]
    for cell in cells:
        if cell is None:
            continue
        assert "error" not in cell, cell
        assert cell["missing"] == 0 and cell["mismatched"] == 0 and cell["finite_logits"], cell
    if recipe != "kv-scale-names":
        assert cells[1] is not None             # a compressed-tensors checkpoint


@pytest.mark.parametrize("row", matrix.GGUF_ROWS, ids=[r[0] for r in matrix.GGUF_ROWS])
def test_gguf_row_reads_back_in_gguf_py(tmp_path, row):
    pytest.importorskip("gguf")
    result = matrix.gguf_row(row, tmp_path)
    assert result["recipe"] == "applied"
    cell = result["gguf"]
    assert cell["tensors_wrong"] == 0 and cell["metadata_wrong"] == [], cell
    # llama.cpp's column, where LLAMA_CPP_BIN names a build (integration/build-llama-cpp.sh)
    import llama_cpp_rows
    assert llama_cpp_rows.show(result["llama_cpp"]).startswith(("ok", "skipped")), result


@pytest.mark.parametrize("label, recipe, producer",
                         [r for r in matrix.ROWS if r[0] in _UNCHANGED_UNLOADABLE],
                         ids=[r[0] for r in matrix.ROWS if r[0] in _UNCHANGED_UNLOADABLE])
def test_mla_rows_keep_kv_scales_vllm_loads(tmp_path, label, recipe, producer):
    """Rows transformers cannot load: their KV scales through vLLM 0.33's remap (restated in
    tests/vllm_kv_names.py, checked against vLLM by the matrix) into the MLA parameters."""
    from tensor_helpers import read_tensors
    from vllm_kv_names import attention_scale_params, vllm_loads

    _, out = matrix.apply_row(recipe, producer, tmp_path)
    names = [n for n in read_tensors(out) if n.endswith(("k_scale", "v_scale"))]
    params = attention_scale_params(2, mla=True)
    assert {vllm_loads(n, params) for n in names} == params, names


#: lines of llama.cpp's load log (0c1e57098, llama-simple) for a gguf-context output whose
#: chat template was also replaced
_LLAMA_LOG = """\
llama_model_loader: - kv   4:                          llama.block_count u32              = 2
llama_model_loader: - kv   6:                         general.size_label str              = 115K
llama_model_loader: - kv  28:                    tokenizer.chat_template str              = \
{% for m in messages %}<|im_start|>{{...
print_info: n_ctx_train           = 8192
print_info: n_layer               = 2
print_info: n_layer_all           = 2
print_info: rope scaling          = yarn
print_info: freq_scale_train      = 0.25
print_info: EOS token             = 3 '<|turn_stop|>'
"""


def test_llama_cpp_log_is_read_as_llama_cpp_prints_it():
    import llama_cpp_rows

    seen = llama_cpp_rows.parse_log(_LLAMA_LOG)
    assert seen == {"n_ctx_train": "8192", "n_layer": "2", "rope_scaling": "yarn",
                    "freq_scale_train": "0.25", "eos": "3", "size_label": "115K",
                    "chat_template": "{% for m in messages %}<|im_start|>{{...",
                    "tool_use": None}


def test_llama_cpp_column_is_skipped_without_llama_simple(tmp_path, monkeypatch):
    import llama_cpp_rows

    monkeypatch.setenv("LLAMA_CPP_BIN", str(tmp_path))
    assert llama_cpp_rows.cell("gguf-context", {}, "", tmp_path).startswith("skipped")
    monkeypatch.delenv("LLAMA_CPP_BIN")
    assert llama_cpp_rows.tools() is None


@pytest.mark.parametrize("row", matrix.BUILTIN_ROWS, ids=[r[0] for r in matrix.BUILTIN_ROWS])
def test_builtin_row_loads_and_keeps_what_it_must(tmp_path, row):
    """Every other built-in on its producer's model: transformers loads the output with nothing
    missing or mismatched and finite logits, the logits equal the base's where the recipe must
    not change them (the argmax, for YaRN within the original context), the recipe's own
    reader-side check passes; a compressed-tensors output also decompresses."""
    from builtin_rows import builtin_row, show

    result = builtin_row(row, tmp_path, matrix.transformers_cell, matrix.compressed_tensors_cell)
    cell = result["transformers"]
    if "base_error" not in cell:
        assert "error" not in cell, cell
        assert cell["missing"] == 0 and cell["mismatched"] == 0 and cell["finite_logits"], cell
        assert "FAIL" not in show(cell), cell
        assert cell["unexpected_kv_scales"] == 0 or row[1] == "sm120-fp16-kv", cell
    if row[4] is not None and "base_error" not in cell:
        assert cell["compared"].startswith("ok"), cell
    ct = result["compressed_tensors"]
    assert ct is None or ("error" not in ct and ct["missing"] == 0 and ct["finite_logits"]
                          and "FAIL" not in show(ct)), ct


def test_every_builtin_recipe_has_a_row():
    from builtin_rows import BUILTIN_ROWS

    names = {p.stem for p in (matrix.REPO / "patcher" / "builtin_recipes").glob("*.yaml")}
    covered = {r[1] for r in matrix.ROWS} | {r[1] for r in BUILTIN_ROWS} \
        | {r[1] for r in matrix.GGUF_ROWS}
    assert names == covered, sorted(names ^ covered)
