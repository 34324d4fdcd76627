"""Multi-turn SFT (``turns = "all"``): whole self-correction and tactic-loop episodes, token-exact
with what the model saw at each turn, loss on the target turns' model tokens only.

The policy below is scripted but tokenizes with a real (tiny) tokenizer and generates from ids,
as the ``hf`` policy does: a completion prompt's turn keeps the tokens of the stop string that
ended it, a chat turn ends with the chat template's end-of-turn token. The harnesses then grow
their id contexts as they do for a real model, and the SFT example must reproduce them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from leanrl import Environment, HarnessConfig, Runtime, SamplingConfig, Task, Taskset, TasksetConfig
from leanrl.environment import EnvironmentConfig
from leanrl.harnesses.self_correction import SelfCorrectionHarness
from leanrl.harnesses.tactic_loop import TacticLoopHarness
from leanrl.policy import Completion, Policy, PolicyConfig, Prompt
from leanrl.proofs import PROOFS_FILE, Pair, ProofStore
from leanrl.rollout import Rollout
from leanrl.taskset import RawRow
from leanrl.train.prompt_ids import prompt_token_ids
from leanrl.train.sft.data import IGNORE, SFTDataConfig, encode_pairs, episodes_from_results
from tests._scripted_runtime import ScriptedRuntime

STATEMENT = "theorem t1 (x : ℕ) (h : x + 1 = 2) : x = 1 := by"
TASK = Task(name="t1", header="import Mathlib\n\n", formal_statement=STATEMENT)


class IdsPolicy(Policy):
    """Scripted texts (turn k of every episode gets ``per_turn[k]``), tokenized for real; records
    the ids each request conditioned on."""

    name = "ids-script"

    def __init__(self, tokenizer: Any, per_turn: Sequence[str], chat: bool) -> None:
        super().__init__(PolicyConfig(model="scripted"))
        self.tokenizer = tokenizer
        self.per_turn = list(per_turn)
        self.chat = chat
        self.seen: list[list[list[int]]] = []  # per call: each request's context ids

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    async def generate(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        ids = [prompt_token_ids(self.tokenizer, p) for p in prompts]
        return await self.generate_from_ids(ids, sampling)

    async def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        turn = len(self.seen)
        self.seen.append([list(x) for x in prompt_ids])
        text = self.per_turn[turn]
        if self.chat:
            ids = [*self.tokenize(text), self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        else:
            ids = self.tokenize(text + "```")  # the token that completed the stop string stays
        return [
            [Completion(text=text, token_ids=tuple(ids), prompt_token_ids=tuple(x))] * sampling.n
            for x in prompt_ids
        ]


@pytest.fixture(scope="module")
def tok(toy_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(toy_model_dir)


def _via_results(tmp_path: Path, rollouts: list[Rollout]) -> dict[tuple[str, str], Rollout]:
    """The rollouts through ``leanrl eval``'s records (``results.jsonl``) and back, with the
    ``proofs.jsonl`` beside them, as SFT finds them."""
    from leanrl.eval.runner import _record

    (tmp_path / "results.jsonl").write_text(
        "".join(json.dumps(_record(TASK, r, 0)) + "\n" for r in rollouts), encoding="utf-8"
    )
    ProofStore(tmp_path / PROOFS_FILE).add_rollouts([TASK], rollouts, source="eval")
    return episodes_from_results([tmp_path / PROOFS_FILE])


def _check_token_exact(
    policy: IdsPolicy, r: Rollout, example: dict[str, list[int]], targets: list[bool]
) -> None:
    """Turn k's prompt part is what the policy saw at turn k; its model tokens follow, with
    labels on exactly the target turns' model tokens."""
    ids, labels = example["input_ids"], example["labels"]
    assert len(policy.seen) == len(r.turns) == len(targets)
    labelled = [i for i, label in enumerate(labels) if label != IGNORE]
    want: list[int] = []
    for k, turn in enumerate(r.turns):
        seen = policy.seen[k][0]
        assert ids[: len(seen)] == seen, f"turn {k}: the context differs from what the model saw"
        span = range(len(seen), len(seen) + len(turn.completion_ids))
        assert [ids[i] for i in span] == turn.completion_ids
        if targets[k]:
            want += list(span)
    assert labelled[: len(want)] == want
    # the last turn then ends as a one-turn answer does: EOS after a completion prompt's stop
    # string, the chat template's newline after its end-of-turn token
    assert labelled[len(want) :] == [len(ids) - 1] == [want[-1] + 1]
    assert all(labels[i] == ids[i] for i in labelled)


@pytest.mark.parametrize("fmt", ["deepseek", "chat"])
async def test_a_self_correction_chain_is_trained_token_exact(
    tok: Any, tmp_path: Path, fmt: str
) -> None:
    chat = fmt == "chat"
    bodies = ["  simp\n", "  rfl\n", "  omega\n"]
    texts = [f"```lean4\n{STATEMENT}\n{b}```" if chat else b for b in bodies]
    policy = IdsPolicy(tok, texts, chat)
    h = SelfCorrectionHarness(
        HarnessConfig(name="self-correction", prompt_format=fmt, max_revisions=2)
    )
    groups = await h.run([TASK], policy, ScriptedRuntime(), SamplingConfig(n=1), Taskset())
    (r,) = groups[0]
    assert r.verdict is not None and r.verdict.accepted and len(r.turns) == 3
    assert r.meta["context"] == "ids" and r.turns[0].feedback
    episodes = _via_results(tmp_path, [r])
    assert len(episodes) == 1
    pair = Pair(TASK, r.proof or "", r.preamble, r.turns[-1].completion)
    (example,) = encode_pairs([pair], h, tok, episodes=episodes)
    # Goedel-Prover-V2's recipe: the failed attempts are context, the revision is the target
    _check_token_exact(policy, r, example, [False, False, True])
    # the ids the harness would replay to a trainer are the example's, up to the last turn
    replay = list(r.prompt_ids) + r.token_ids_and_mask()[0]
    assert example["input_ids"][: len(replay)] == replay
    # turns = "first" (no episodes) is today's one-turn example, much shorter
    (first,) = encode_pairs([pair], h, tok)
    assert len(first["input_ids"]) < len(policy.seen[1][0])


@pytest.mark.parametrize("fmt", ["deepseek", "chat"])
async def test_a_tactic_loop_episode_is_trained_token_exact(
    tok: Any, tmp_path: Path, fmt: str
) -> None:
    chat = fmt == "chat"
    tactics = ["intro y", "foo", "omega"]  # progress, an error (state unchanged), solved
    texts = [f"```lean4\n{t}\n```" if chat else f"  {t}\n" for t in tactics]
    policy = IdsPolicy(tok, texts, chat)
    h = TacticLoopHarness(HarnessConfig(name="tactic-loop", prompt_format=fmt, max_turns=5))
    groups = await h.run([TASK], policy, ScriptedRuntime(), SamplingConfig(n=1), Taskset())
    (r,) = groups[0]
    assert r.verdict is not None and r.verdict.accepted and len(r.turns) == 3
    assert "Error: " in r.turns[1].feedback and r.meta["context"] == "ids"
    episodes = _via_results(tmp_path, [r])
    pair = Pair(TASK, r.proof or "")
    (example,) = encode_pairs([pair], h, tok, episodes=episodes)
    # the step Lean refused is context: the model learns to go on from the error, not to err
    _check_token_exact(policy, r, example, [True, False, True])
    # without its episode a tactic-loop pair has no layout to train in: left out
    assert encode_pairs([pair], h, tok, episodes={}) == []


def test_failed_and_cut_episodes_are_not_read(tmp_path: Path) -> None:
    rec = {"task_id": "t1", "name": "t1", "sample": 0, "accepted": True, "proof": "\n  omega",
           "preamble": "", "prompt": "P", "verdict": None,
           "turns": [{"completion": "a", "feedback": "f", "finish_reason": "stop"},
                     {"completion": "b", "feedback": "", "finish_reason": "stop"}]}  # fmt: skip
    rejected = {**rec, "accepted": False, "proof": "\n  simp"}
    cut = {**rec, "proof": "\n  rfl", "text_cut": {"turns[0].completion": {"chars": 9}}}
    one_turn = {**rec, "proof": "\n  decide", "turns": None}
    (tmp_path / "results.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in (rec, rejected, cut, one_turn)), encoding="utf-8"
    )
    got = episodes_from_results([tmp_path / PROOFS_FILE, tmp_path / "missing" / PROOFS_FILE])
    assert [r.proof for r in got.values()] == ["\n  omega"]
    assert [t.completion for t in next(iter(got.values())).turns] == ["a", "b"]


class _Toy(Taskset):
    name = "toy-multiturn"

    def load_rows(self) -> list[RawRow]:
        data = {"name": TASK.name, "header": TASK.header, "formal_statement": STATEMENT}
        return [RawRow(origin="t", index=1, data=data)]


class _Env(Environment):
    taskset_class = _Toy

    def make_runtime(self) -> Runtime:
        return ScriptedRuntime()


def test_sft_trains_whole_episodes_found_beside_the_proofs(
    toy_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    from transformers import AutoTokenizer

    from leanrl.train.sft import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(toy_model_dir)
    bodies = ["  simp\n", "  omega\n"]
    policy = IdsPolicy(tokenizer, bodies, chat=False)
    harness_cfg = HarnessConfig(name="self-correction", max_revisions=1)
    h = SelfCorrectionHarness(harness_cfg)
    groups = asyncio.run(
        h.run([TASK], policy, ScriptedRuntime(), SamplingConfig(n=1), Taskset(TasksetConfig()))
    )
    data = tmp_path / "eval"
    data.mkdir()
    _via_results(data, groups[0])
    env_cfg = EnvironmentConfig(id="toy-multiturn", harness=harness_cfg)
    cfg = SFTConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        env=env_cfg,
        data=SFTDataConfig(proofs=[data / PROOFS_FILE], turns="all"),
        out=tmp_path / "run",
        steps=1,
        batch_size=1,
        lr=1e-4,
    )
    with caplog.at_level(logging.INFO, logger="leanrl.train.sft"):
        rows = SFTTrainer(cfg, env=_Env(env_cfg)).train_sync()
    assert rows and rows[-1]["loss"] is not None
    assert "1 of 1 examples are whole multi-turn episodes" in caplog.text


async def test_expert_iteration_hands_each_proofs_episode_to_sft(
    tok: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import leanrl.train.sft.trainer as trainer_mod
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    policy = IdsPolicy(tok, ["  simp\n", "  omega\n"], chat=False)
    h = SelfCorrectionHarness(HarnessConfig(name="self-correction", max_revisions=1))
    groups = await h.run([TASK], policy, ScriptedRuntime(), SamplingConfig(n=1), Taskset())
    got: dict[str, Any] = {}

    class FakeSFT:
        def __init__(
            self, config: Any, env: Any = None, pairs: Any = None, episodes: Any = None
        ) -> None:
            got.update(config=config, env=env, pairs=pairs, episodes=episodes)
            self.run = type("Run", (), {"metrics": staticmethod(lambda: [])})()

        def train_sync(self) -> None:
            return None

    monkeypatch.setattr(trainer_mod, "SFTTrainer", FakeSFT)
    monkeypatch.setattr(ExpertIteration, "_publish", lambda self, r, trainer: None)
    env = EnvironmentConfig(id="toy-multiturn", harness=HarnessConfig(name="self-correction"))
    for turns in ("first", "all"):
        cfg = ExpertIterationConfig(
            policy=PolicyConfig(model="m"), env=env, out=tmp_path / turns, turns=turns
        )
        ei = ExpertIteration(cfg)
        sample = ei._round_dir(1) / "sample"
        sample.mkdir(parents=True)
        _via_results(sample, groups[0])
        ei._keep(1, {TASK.id})
        await ei._sft(1, "m", [TASK])
        assert got["config"].data.turns == turns and len(got["pairs"]) == 1
        if turns == "first":
            assert got["episodes"] is None  # today's data path
        else:
            (episode,) = got["episodes"].values()
            assert [t.completion for t in episode.turns] == ["  simp\n", "  omega\n"]


def test_tactic_loop_trains_with_turns_all_only(toy_model_dir: Path, tmp_path: Path) -> None:
    from leanrl import ConfigError
    from leanrl.cli import parse_command
    from leanrl.train.sft import SFTConfig, SFTTrainer
    from leanrl.train.sft.expert_iteration import ExpertIteration, ExpertIterationConfig

    env = EnvironmentConfig(id="toy-multiturn", harness=HarnessConfig(name="tactic-loop"))
    model = PolicyConfig(model=str(toy_model_dir))
    first = SFTConfig(policy=model, env=env, out=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"--data\.turns all"):
        SFTTrainer(first).check()
    SFTTrainer(first.model_copy(update={"data": SFTDataConfig(turns="all")})).check()
    ei = ExpertIterationConfig(policy=model, env=env, out=tmp_path / "b")
    with pytest.raises(ConfigError, match="--turns all"):
        ExpertIteration(ei).check()
    ExpertIteration(ei.model_copy(update={"turns": "all"})).check()
    from leanrl.train.sft.cli import SFTCommand
    from leanrl.train.sft.expert_iteration_cli import ExpertIterationCommand

    sft = parse_command(SFTCommand, ["--model", "m", "--data.turns", "all"])
    assert sft.to_sft_config().data.turns == "all"
    toml = tmp_path / "ei.toml"
    toml.write_text('turns = "all"\n')
    ei_cmd = parse_command(ExpertIterationCommand, ["--model", "m", "--config", str(toml)])
    assert ei_cmd.to_config().turns == "all"
