"""Teachers: where a teacher comes from, which revision it is, and its log-probs of the
student's tokens.

Before anything loads, :func:`resolve` turns what the user named (a folder, a hub id, a leanrl
run folder or checkpoint, a server URL) into a :class:`TeacherSource`, :func:`revision` gives
the revision a run records, and :func:`check_tokenizer` refuses a teacher whose tokenizer is not
the student's (on-policy distillation scores the student's token ids with the teacher, so both
must mean the same thing by them).

Then a teacher scores sequences: ``await teacher.logprobs([(prompt_ids, response_ids), ...])``
gives, for each sequence, ``log π_teacher(o_t | prompt, o_<t)`` of every response token.

- :class:`LocalTeacher`: a Hugging Face model in this process, without gradients. Its log-probs
  go through vocabulary tiles of its own output head (:class:`~leanrl.train.grpo.tiled.HeadTiles`,
  the memory-bounded path of GRPO's ``logprob_chunk``): a forward holds one
  ``[logprob_chunk, vocab_tile]`` tile of logits at a time, never ``[tokens, V]``. A model whose
  logits are more than ``head(h)`` (soft-capping, logit scales) is scored one sequence at a
  time through full logits, with a warning.
- :class:`ServerTeacher`: an OpenAI-compatible server, one ``/completions`` request per sequence
  with the token ids as the prompt: vLLM's ``prompt_logprobs`` (the log-prob of every prompt
  token, the ones sent included), or, where the server has no such field, the OpenAI
  ``echo`` + ``logprobs`` form.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from leanrl.errors import ConfigError, PolicyError
from leanrl.train.distill.config import DistillConfig, is_server

__all__ = [
    "LocalTeacher",
    "ServerTeacher",
    "TeacherSource",
    "check_tokenizer",
    "resolve",
    "revision",
]

log = logging.getLogger("leanrl.train.distill")

Seq = tuple[Sequence[int], Sequence[int]]
"""One sequence to score: the prompt's token ids and the response's."""


@dataclass(frozen=True)
class TeacherSource:
    """A teacher, resolved: ``kind`` ``local`` (a model folder here), ``hub`` (a Hugging Face
    id in the local cache) or ``server``; ``where`` the folder, id or base URL; ``model`` the
    server's model name."""

    spec: str
    kind: Literal["local", "hub", "server"]
    where: str
    model: str | None = None


# -- resolving, before anything loads -----------------------------------------------------------


def resolve(spec: str, cfg: DistillConfig) -> TeacherSource:
    """What ``spec`` names, checked to be loadable (or reachable) here; a one-line error
    otherwise. A leanrl run folder stands for its newest checkpoint."""
    if is_server(spec):
        url = spec.rstrip("/")
        return TeacherSource(spec, "server", url, _server_model(url, cfg))
    from leanrl.policies._common import resolve_model

    path = Path(spec).expanduser()
    if _is_run_folder(path):
        from leanrl.train.common import RunDir

        latest = RunDir(path).latest_checkpoint()
        if latest is None:
            raise ConfigError(
                f"the teacher {spec} is a leanrl run folder without a usable checkpoint: "
                "name a checkpoint-N folder or a finished run"
            )
        got = resolve_model(str(latest[1]), flag="--distill.teacher", adapters=True)
        return TeacherSource(spec, "local", got)
    got = resolve_model(spec, flag="--distill.teacher", adapters=True)
    kind: Literal["local", "hub"] = "local" if Path(got).expanduser().is_dir() else "hub"
    return TeacherSource(spec, kind, got)


def _is_run_folder(path: Path) -> bool:
    """A leanrl run folder: checkpoint-N folders in it, no model weights of its own."""
    if not path.is_dir() or not any(p.is_dir() for p in path.glob("checkpoint-*")):
        return False
    weights = (".safetensors", ".bin")
    return not any(p.suffix in weights for p in path.iterdir() if p.is_file())


def _server_model(url: str, cfg: DistillConfig) -> str:
    """The model to ask the server at ``url`` for: ``server_model``, or the one it lists."""
    import httpx

    try:
        r = httpx.get(f"{url}/models", timeout=10.0)
        r.raise_for_status()
        ids = [m.get("id") for m in r.json().get("data", []) if isinstance(m, dict)]
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        raise ConfigError(
            f"the teacher server {url} does not answer GET {url}/models ({type(e).__name__}: "
            f"{e}): start it (e.g. `vllm serve MODEL --port 8000`) and pass its base URL, "
            "http://HOST:PORT/v1"
        ) from None
    if cfg.server_model is not None:
        if ids and cfg.server_model not in ids:
            raise ConfigError(
                f"the teacher server {url} serves {ids}, not distill.server_model = "
                f"{cfg.server_model!r}"
            )
        return cfg.server_model
    if len(ids) != 1:
        raise ConfigError(
            f"the teacher server {url} serves {len(ids)} models ({ids}): name one with "
            "--distill.server-model"
        )
    return str(ids[0])


def revision(src: TeacherSource) -> str:
    """The revision of a teacher, as a run records it: a hub commit (``hub:COMMIT``), a leanrl
    checkpoint's content (``sha256:`` of its ``checksums.sha256``), another folder's files
    (``files:`` a digest of their names and sizes and of every small file and the first and
    last MiB of each big one: cheap, and any re-save or edit changes it), or a server's model
    id (``server:NAME``, all a server says of itself)."""
    if src.kind == "server":
        return f"server:{src.model}"
    if src.kind == "hub":
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(src.where, "config.json")
        except Exception:  # noqa: BLE001 - an unusual cache layout: no commit to name
            hit = None
        if isinstance(hit, str) and "/snapshots/" in hit:
            return "hub:" + hit.split("/snapshots/", 1)[1].split("/", 1)[0]
        return f"hub:{src.where}"
    folder = Path(src.where)
    sums = folder / "checksums.sha256"
    if sums.is_file():
        return "sha256:" + hashlib.sha256(sums.read_bytes()).hexdigest()[:16]
    h = hashlib.sha256()
    mib = 1 << 20
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        size = p.stat().st_size
        h.update(f"{p.relative_to(folder).as_posix()}\0{size}\0".encode())
        with p.open("rb") as f:
            if size <= 16 * mib:
                h.update(f.read())
            else:
                h.update(f.read(mib))
                f.seek(size - mib)
                h.update(f.read(mib))
    return "files:" + h.hexdigest()[:16]


# -- the tokenizer check -------------------------------------------------------------------------

#: Texts a server's /tokenize must split as the student's tokenizer does (Lean's symbols,
#: code, numbers, whitespace runs).
_PROBES = (
    "theorem t (a b : ℕ) (h₀ : 0 < a) : a + b = b + a := by\n  omega",
    "∀ x ∈ Finset.range 10, x ^ 2 ≥ 0 → ∃ y, y ≠ x ∧ ¬(y ≤ 3)",
    "```lean4\nimport Mathlib\n```  12345 + 678 = 13023\t\t  done.",
    "Using the numbers 44, 19, 35, make 98: <answer>(44 + 19) + 35</answer>",
)


def check_tokenizer(student_tokenizer: Any, src: TeacherSource, cfg: DistillConfig) -> None:
    """Refuse, in one line, a teacher whose tokenizer differs from the student's. A model
    folder or hub id: the two vocabularies (token → id, added tokens included) must be equal.
    A server: its ``/tokenize`` must split the probe texts as the student's tokenizer does;
    without one, ``distill.tokenizer`` names the teacher's tokenizer to compare."""
    fix = (
        "on-policy distillation scores the student's token ids with the teacher, so both must "
        "share one tokenizer: use a teacher of the student's family, or distil its verified "
        "proofs instead (leanrl train distill --mode sequence), where tokenizers may differ"
    )
    if src.kind == "server" and cfg.tokenizer is None:
        _check_server_tokenizer(student_tokenizer, src, fix)
        return
    from transformers import AutoTokenizer

    where = cfg.tokenizer if src.kind == "server" and cfg.tokenizer else src.where
    try:
        teacher = AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the teacher's tokenizer from {where}: {e}") from None
    mine, theirs = student_tokenizer.get_vocab(), teacher.get_vocab()
    if mine == theirs:
        return
    differ = sorted(
        {t for t in set(mine) | set(theirs) if mine.get(t) != theirs.get(t)},
        key=lambda t: min(mine.get(t, 1 << 30), theirs.get(t, 1 << 30)),
    )
    first = differ[0]
    raise ConfigError(
        f"the teacher {src.spec} has another tokenizer than the student ({len(theirs)} vs "
        f"{len(mine)} tokens, {len(differ)} differ, e.g. {first!r}: id {theirs.get(first)} in "
        f"the teacher's, {mine.get(first)} in the student's): {fix}"
    )


def _check_server_tokenizer(student_tokenizer: Any, src: TeacherSource, fix: str) -> None:
    import httpx

    root = src.where.removesuffix("/v1")
    for text in _PROBES:
        want = list(student_tokenizer(text, add_special_tokens=False).input_ids)
        body = {"model": src.model, "prompt": text, "add_special_tokens": False}
        try:
            r = httpx.post(f"{root}/tokenize", json=body, timeout=10.0)
            r.raise_for_status()
            got = r.json()["tokens"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            raise ConfigError(
                f"cannot check the teacher server's tokenizer: {root}/tokenize (vLLM's) did not "
                "answer with token ids; pass --distill.tokenizer with the folder or hub id of "
                "its tokenizer to compare with the student's"
            ) from None
        if list(got) != want:
            raise ConfigError(
                f"the teacher server {src.where} ({src.model}) tokenizes {text[:30]!r}... as "
                f"{list(got)[:8]}..., the student as {want[:8]}...: {fix}"
            )


# -- in-process teacher --------------------------------------------------------------------------


class LocalTeacher:
    """A Hugging Face model in this process, scoring without gradients through its tiled head
    (see the module docstring). ``load`` before the first ``logprobs``."""

    def __init__(self, src: TeacherSource, cfg: DistillConfig, device: Any, dtype: Any) -> None:
        self.src = src
        self.cfg = cfg
        self.device = device
        self.dtype = dtype
        self.model: Any = None
        self.pad_id = 0
        self.tiles: Any = None
        self._checked = False

    @property
    def name(self) -> str:
        return self.src.spec

    def load(self) -> None:
        """Load the weights (once), frozen, in eval mode, on ``device``."""
        if self.model is not None:
            return
        from transformers import AutoConfig, AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(self.src.where, dtype=self.dtype)
            conf = AutoConfig.from_pretrained(self.src.where)
        except (OSError, ValueError) as e:
            raise PolicyError(f"cannot load the teacher {self.src.spec!r}: {e}") from e
        self.model = model.to(self.device).eval().requires_grad_(False)
        pad = getattr(conf, "pad_token_id", None)
        self.pad_id = int(pad) if isinstance(pad, int) else 0

    async def logprobs(self, seqs: Sequence[Seq]) -> list[list[float]]:
        """Teacher log-probs of every response token of each sequence (off the event loop)."""
        return await asyncio.to_thread(self.score, seqs)

    def score(self, seqs: Sequence[Seq]) -> list[list[float]]:
        """:meth:`logprobs`, blocking: micro-batches of like length, ``micro_batch_size`` each."""
        import torch

        self.load()
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
        out: list[list[float]] = [[] for _ in seqs]
        mbs = self.cfg.micro_batch_size
        with torch.inference_mode():
            for k in range(0, len(order), mbs):
                idx = [i for i in order[k : k + mbs] if seqs[i][1]]
                if not idx:
                    continue
                batch = [seqs[i] for i in idx]
                if not self._checked:
                    self._check_tiles(batch[0])
                if self.tiles is None:  # full logits: one sequence at a time
                    rows = [self._forward([s])[0] for s in batch]
                else:
                    rows = self._forward(batch)
                for i, row in zip(idx, rows, strict=True):
                    out[i] = row
        return out

    def _check_tiles(self, s: Seq) -> None:
        """Whether the model's log-probs may go through its tiled head (checked once, on a
        short piece of the first sequence, against its full logits)."""
        from leanrl.train.grpo.tiled import HeadTiles

        short = (list(s[0])[-4:], list(s[1])[:4])
        tiles, why = HeadTiles.checked(
            self.model, self.cfg.temperature, self.cfg.logprob_chunk, self.cfg.vocab_tile,
            lambda t: self._raw([short], t),
        )  # fmt: skip
        if why:
            log.warning(
                "the teacher %s cannot use the tiled head (%s): it is scored one sequence at a "
                "time through full logits",
                self.src.spec,
                why,
            )
        self.tiles, self._checked = tiles, True

    def _raw(self, batch: Sequence[Seq], tiles: Any) -> tuple[Any, Any]:
        """One forward: ``(logits [n, R, V], targets [n, R])``, or with ``tiles`` ``(logp,
        entropy)`` [n, R]. Left padding puts every response at the right edge, so only the last
        R + 1 positions are computed past the body (``logits_to_keep``)."""
        import torch

        from leanrl.train.grpo.tiled import HeadTiles

        seqs = [list(p) + list(r) for p, r in batch]
        width = max(len(x) for x in seqs)
        r_max = max(len(r) for _, r in batch)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for k, x in enumerate(seqs):
            ids[k, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            attn[k, width - len(x) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        targets = ids[:, width - r_max :]
        if tiles is None:
            out = self.model(
                input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=r_max + 1
            )
            return out.logits[:, :-1, :], targets
        with tiles.bound(targets) as got:
            out = self.model(
                input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=r_max + 1
            )
        return HeadTiles.result(out.logits, got)

    def _forward(self, batch: Sequence[Seq]) -> list[list[float]]:
        from leanrl.train.grpo.loss import token_logprobs

        if self.tiles is not None:
            lp, _ = self._raw(batch, self.tiles)
        else:
            logits, targets = self._raw(batch, None)
            lp = token_logprobs(logits, targets, self.cfg.temperature)
        lp = lp.float().cpu()
        return [lp[k, lp.shape[1] - len(r) :].tolist() for k, (_, r) in enumerate(batch)]

    async def close(self) -> None:
        self.model = None


# -- a server teacher ----------------------------------------------------------------------------


class ServerTeacher:
    """An OpenAI-compatible server returning prompt log-probs (see the module docstring)."""

    def __init__(self, src: TeacherSource, cfg: DistillConfig) -> None:
        self.src = src
        self.cfg = cfg
        self._client: Any = None
        self._echo = False  # set once the server is seen to answer only the echo form

    @property
    def name(self) -> str:
        return self.src.spec

    def load(self) -> None:
        """Nothing to load (the server holds the model)."""

    async def logprobs(self, seqs: Sequence[Seq]) -> list[list[float]]:
        import httpx

        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient(
                base_url=self.src.where + "/",
                timeout=httpx.Timeout(self.cfg.request_timeout_s, connect=10.0),
                limits=httpx.Limits(max_connections=self.cfg.max_concurrency),
            )
        sem = asyncio.Semaphore(self.cfg.max_concurrency)

        async def one(s: Seq) -> list[float]:
            if not s[1]:
                return []
            async with sem:
                return await self._score(list(s[0]), list(s[1]))

        return list(await asyncio.gather(*(one(s) for s in seqs)))

    async def _score(self, prompt: list[int], resp: list[int]) -> list[float]:
        from leanrl.policies.openai import post_json

        ids = prompt + resp
        for _ in range(2):  # the echo form, where the first answer had no prompt_logprobs field
            body: dict[str, Any] = {"model": self.src.model, "prompt": ids, "max_tokens": 1}
            body["temperature"] = 1.0
            echo = self._echo  # this request's form (others in flight may switch it)
            if echo:
                body.update(echo=True, logprobs=1)
            else:
                body["prompt_logprobs"] = 1
            try:  # transient failures retried as the openai policy retries them
                data = await post_json(
                    self._client, "completions", body, where=self.src.where, max_retries=2,
                    backoff_s=0.5,
                )  # fmt: skip
            except PolicyError as e:
                raise PolicyError(f"the teacher server could not score a sequence: {e}") from e
            choices = data.get("choices")
            choice = choices[0] if isinstance(choices, list) and choices else None
            got = self._read(choice, ids) if isinstance(choice, dict) else None
            if got is None and not echo:
                self._echo = True
                continue
            if got is None:
                break
            return got[len(prompt) :]
        raise PolicyError(
            f"the teacher server {self.src.where} returned no prompt log-probs: neither "
            "vLLM's prompt_logprobs nor echo with logprobs (serve the teacher with vLLM)"
        )

    def _read(self, choice: dict[str, Any], ids: list[int]) -> list[float] | None:
        """The log-prob of each of ``ids`` from a choice (position 0 has none: NaN)."""
        plp = choice.get("prompt_logprobs")
        if isinstance(plp, list) and len(plp) >= len(ids):
            out = []
            for k, tok in enumerate(ids):
                entry = plp[k]
                if entry is None:
                    out.append(math.nan)
                    continue
                hit = entry.get(str(tok))
                if hit is None:
                    raise PolicyError(
                        f"the teacher server's prompt_logprobs at position {k} do not include the "
                        f"prompt's own token {tok}: it is not vLLM's format"
                    )
                out.append(float(hit["logprob"] if isinstance(hit, dict) else hit))
            return out
        lps = (choice.get("logprobs") or {}).get("token_logprobs")
        if isinstance(lps, list) and len(lps) >= len(ids):
            return [math.nan if v is None else float(v) for v in lps[: len(ids)]]
        return None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def describe(src: TeacherSource) -> str:
    """A teacher in one phrase, for logs (``runs/cd/checkpoint-20``, ``MODEL at URL``)."""
    if src.kind == "server":
        return f"{src.model} at {src.where}"
    return src.where if src.where == src.spec else f"{src.spec} ({src.where})"
