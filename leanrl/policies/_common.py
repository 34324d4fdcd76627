"""Helpers shared by the policy backends: finding the model, chat prompts, stop strings."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from leanrl._hub import hub_offline, hub_reachable
from leanrl.errors import ConfigError, PolicyError
from leanrl.integrity import CHECKSUMS_FILE, checkpoint_problem, content_problem, json_problem
from leanrl.policy import Prompt

__all__ = [
    "LoopLock",
    "cut_at_stop",
    "resolve_model",
    "to_messages",
]


class LoopLock:
    """One ``asyncio.Lock`` per event loop: a policy started in one loop (a notebook cell, a
    fixture) may generate in another, and a lock is bound to the loop it was first used in."""

    def __init__(self) -> None:
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop = asyncio.Lock(), loop
        return self._lock


def _looks_like_path(model: str) -> bool:
    # A hub id is exactly "owner/name"; anything else with a path shape is meant as a folder.
    return (
        model.startswith(("/", ".", "~"))
        or model.count("/") >= 2
        or "\\" in model
        or model.endswith("/")
    )


def _first_part_is_here(model: str) -> bool:
    """``runs/typo`` where the folder ``runs`` exists here: meant as a path (a hub owner named
    like a local folder is still tried in the hub cache first)."""
    head = model.split("/", 1)[0]
    return "/" in model and bool(head) and Path(head).expanduser().is_dir()


def _nearby(path: Path) -> str:
    """`` (did you mean runs/typo-2?)`` from the folders beside the deepest part that exists."""
    import difflib

    parts = path.parts
    for i in range(len(parts) - 1, 0, -1):
        parent = Path(*parts[:i])
        if parent.is_dir():
            try:
                names = [p.name for p in parent.iterdir() if p.is_dir()]
            except OSError:
                return ""
            close = difflib.get_close_matches(parts[i], names, n=3, cutoff=0.6)
            if not close:
                return ""
            shown = " or ".join(str(parent / c) for c in close)
            return f" (did you mean {shown}?)"
    return ""


def _catalogue_hint(path: Path) -> str:
    """`` Make it with `leanrl models get smollm2`.`` when ``path`` names a catalogue model
    (``smollm2``, or its folder under leanrl's model cache) that is not made yet."""
    from leanrl.models import CATALOGUE, models_root

    name = path.name
    if name not in CATALOGUE:
        return ""
    if len(path.parts) > 1 and path.expanduser().parent != models_root():
        return ""
    return f" Make it offline with `leanrl models get {name}` (then {models_root() / name})."


def resolve_model(
    model: str, *, flag: str = "--model", adapters: bool = True, hub: bool = True
) -> str:
    """Check that ``model`` can be loaded here; return the local folder or the hub id.

    The one model check of every command (eval, the trainers, compare), run before anything
    loads. Raises :class:`ConfigError` for a folder that does not exist (with a did-you-mean over
    the folders beside it) and :class:`PolicyError` for a hub id that is neither cached nor
    downloadable (offline, or the hub unreachable), in seconds, saying how to fix it, instead of
    the hub libraries' minute of retries.

    ``flag``: the option named in messages (``--policy.model`` for the trainers). ``adapters``:
    a LoRA checkpoint folder (adapters, no ``config.json``) is merged into a loadable folder
    (True, for inference) or refused (False: the trainers start from a full model). ``hub``:
    False where the model is not loaded here (a ``--dry-run``, a launch to Modal): a hub id is
    then taken as it is, and only local folders are checked.
    """
    if not model:
        raise ConfigError(f"no model given: pass {flag} with a model folder or a Hugging Face id")
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            raise ConfigError(
                f"{path} is a GGUF file (the llama.cpp format); the hf and vllm backends load "
                "Hugging Face model folders (config.json and safetensors). Serve the GGUF with an "
                f"OpenAI-compatible server (e.g. `llama-server -m {path} --port 8080`) and use "
                "--backend openai --policy.base-url http://127.0.0.1:8080/v1, or pass the "
                "model's Hugging Face folder or id."
            )
        raise ConfigError(
            f"{path} is a file; {flag} takes a model folder (holding config.json and the "
            "weights) or a Hugging Face id."
        )
    as_path = path.exists() or _looks_like_path(model)
    if not as_path and _first_part_is_here(model) and not _cached(model):
        as_path = True
    if as_path:
        if not path.is_dir():
            raise ConfigError(
                f"model folder {path} does not exist{_nearby(path)}. Pass {flag} with a local "
                "folder holding config.json and the weights, or a Hugging Face id such as "
                f"'AI-MO/Kimina-Prover-Distill-1.7B'.{_catalogue_hint(path)}"
            )
        changed = content_problem(path)  # a leanrl checkpoint's checksums (flipped bits)
        if changed:
            raise PolicyError(
                f"cannot load model {path}: {changed}. Use another checkpoint or a good copy "
                f"(to load it as it is anyway, delete {path / CHECKSUMS_FILE})"
            )
        if not (path / "config.json").is_file() and (path / "adapter_config.json").is_file():
            if adapters:
                return merged_adapters(path)
            raise ConfigError(
                f"{path} holds LoRA adapters, not a full model; training starts from a full "
                f"model. Pass {flag} {path / 'merged'} after `leanrl eval --model {path}` has "
                "made it, or merge with leanrl.train.lora.merge_checkpoint(ckpt, out)."
            )
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"{path} is not a model folder (no config.json in it). Point {flag} at the "
                "folder `save_pretrained` or `hf download ID --local-dir DIR` wrote."
            )
        why = checkpoint_problem(path, torch_files=False)  # the optimizer state is not read
        if why:
            raise PolicyError(f"cannot load model {path}: {why}")
        if hub:  # loaded here: a config.json field of the wrong type is one line, not a trace
            why = config_problem(path)
            if why:
                raise PolicyError(
                    f"cannot load model {path}: {path / 'config.json'} {why}. Fix that field "
                    "(or copy the model folder again)"
                )
        return str(path)
    if not re.fullmatch(r"[\w.\-]+/[\w.\-]+|[\w.\-]+", model):
        raise ConfigError(f"{flag} {model!r} is neither a local folder nor a Hugging Face id")
    if not hub or _cached(model):
        return model
    fix = (
        f"Download it on a machine with internet (`hf download {model} --local-dir DIR`, the "
        f"command huggingface_hub installs), copy DIR here, and pass {flag} DIR."
    )
    fix += _catalogue_hint(path)
    if hub_offline():
        raise PolicyError(
            f"model {model!r} is not in the local Hugging Face cache and offline mode is on "
            f"(HF_HUB_OFFLINE). {fix}"
        )
    if not hub_reachable():
        raise PolicyError(
            f"model {model!r} is not in the local Hugging Face cache and the hub is "
            f"unreachable (no internet?). {fix}"
        )
    return model


def config_problem(folder: Path) -> str | None:
    """Why transformers refuses the values of ``folder/config.json`` (None when it takes them,
    or when transformers is not installed here).

    transformers validates a config's fields by type (``"hidden_size": "big"``) in
    huggingface_hub's strict dataclasses, whose error surfaced as a 21-frame traceback from
    inside the loader. Only that kind of error is reported here; anything else (a model type
    this transformers does not know, which vLLM may still load) is left to the loader."""
    try:
        from huggingface_hub.errors import StrictDataclassError
        from transformers import AutoConfig
    except ImportError:
        return None
    try:
        AutoConfig.from_pretrained(str(folder))
    except (StrictDataclassError, TypeError) as e:
        cause = e.__cause__ if isinstance(e.__cause__, (TypeError, ValueError)) else e
        return "is refused by transformers: " + " ".join(str(cause).split())  # one line
    except Exception:  # noqa: BLE001 - the loader reports these as it always did
        return None
    return None


def merged_adapters(ckpt: Path) -> str:
    """A LoRA checkpoint (peft adapters, no ``config.json``) as a loadable model folder: its
    ``merged/`` sub-folder, made once on first use (``W + (alpha/r)·B·A`` over the base model the
    adapters record) and reused after. Every backend can then load it as it loads any model,
    vLLM included. Where the checkpoint folder is read-only the merge goes to leanrl's cache."""
    import hashlib
    import json
    import os
    import shutil
    import sys

    from leanrl.train.lora import MERGED_DIR

    done = ckpt / MERGED_DIR
    if (done / "config.json").is_file() and checkpoint_problem(done, torch_files=False) is None:
        return str(done)
    adapter = ckpt / "adapter_config.json"
    why = json_problem(adapter)
    if why:
        raise PolicyError(f"cannot load the LoRA checkpoint {ckpt}: {why}")
    recorded = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not recorded:
        raise PolicyError(
            f"{adapter} names no base model (base_model_name_or_path), so the adapters in {ckpt} "
            "cannot be applied. Merge them yourself with "
            "leanrl.train.lora.merge_checkpoint(ckpt, out, base_model=...) and pass --model out."
        )
    base = os.environ.get("LEANRL_LORA_BASE") or recorded
    try:
        base = resolve_model(base)
    except (ConfigError, PolicyError) as e:
        raise PolicyError(
            f"{ckpt} holds LoRA adapters for the base model {recorded!r}, which cannot be loaded "
            f"here: {e} If the base model has moved, set LEANRL_LORA_BASE to its folder or id."
        ) from e
    key = hashlib.sha256(f"{ckpt.resolve()}|{base}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "leanrl" / "merged"
    if (cache / key / "config.json").is_file() and checkpoint_problem(cache / key) is None:
        return str(cache / key)
    # Into the checkpoint where it may be written, else (a read-only Volume or mount) the cache.
    targets = ([done] if os.access(ckpt, os.W_OK) else []) + [cache / key]
    from leanrl.train.lora import merge_checkpoint

    for target in targets:
        print(
            f"leanrl: {ckpt} holds LoRA adapters; merging them into {base} once, into {target}",
            file=sys.stderr,
        )
        # Written beside, then renamed: a merge cut short never passes for a model folder.
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            merge_checkpoint(ckpt, tmp, base_model=base)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
            return str(target)
        except OSError as e:
            failed = e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise PolicyError(f"cannot write the merged model of {ckpt} ({failed}); free disk space")


def _cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers always brings huggingface_hub
        return False
    found = try_to_load_from_cache(repo_id, "config.json")
    return isinstance(found, str)


def to_messages(prompt: Prompt) -> list[dict[str, str]]:
    """A chat prompt as plain dicts (what tokenizers' chat templates and HTTP APIs take)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": m.role, "content": m.content} for m in prompt]


def cut_at_stop(
    text: str, stop: Sequence[str], token_ids: Sequence[int], decode: Callable[[list[int]], str]
) -> tuple[str, int] | None:
    """Where the first stop string appears: (text before it, tokens to keep), or None.

    The kept tokens are the shortest prefix whose decoding contains the stop string, so the
    token that completed the stop string is kept (it is what the model sampled).
    """
    hits = [(text.find(s), s) for s in stop if s and s in text]
    if not hits:
        return None
    at, s = min(hits)
    lo, hi = 1, len(token_ids)
    # Binary search: decoding a prefix is monotone in "contains the stop string".
    while lo < hi:
        mid = (lo + hi) // 2
        if s in decode(list(token_ids[:mid])):
            hi = mid
        else:
            lo = mid + 1
    return text[:at], lo
