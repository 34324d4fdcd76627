"""On-policy distillation in the GRPO trainer (issue 40): the per-token advantage term, teachers
in process (tiled head) and behind a server (prompt log-probs), the tokenizer check before any
model loads, the teacher's revision in the run config, ``distill.only`` on Countdown.

Student and teachers are tiny random models made here; a teacher that shares the student's
tokenizer is the same architecture with other random weights (the tokenizer is trained on the
same texts), one that does not is the toy model (another vocabulary).
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from leanrl.errors import ConfigError
from leanrl.train.distill.config import DistillConfig
from leanrl.train.distill.objective import add_distill_term, advantage_tensor
from leanrl.train.grpo.data import _Sample
from tests.conftest import tiny_model_texts
from tests.test_grpo_trainer import _config, _train

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another tiny model with the student's tokenizer: other random weights, its final norm
    scaled up so that its next-token distributions are peaked (a random tiny model's are
    nearly uniform, as the student's, and would be almost at KL 0 from it already)."""
    from transformers import AutoModelForCausalLM

    from leanrl.testing import make_tiny_model

    out = make_tiny_model(tmp_path_factory.mktemp("teacher"), tiny_model_texts(), seed=1)
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        model.model.norm.weight.mul_(40.0)
    model.save_pretrained(out)
    return out


# -- the advantage term -----------------------------------------------------------------------------


def _sample(mask: list[int], old: list[float], adv: float) -> _Sample:
    return _Sample(prompt=[1, 2], resp=list(range(len(mask))), mask=mask, old=old, adv=adv)


def test_the_term_is_the_reverse_kl_on_model_tokens_only() -> None:
    """A_t = A_j - λ(log π_s - log π_T) on model tokens; environment tokens (mask 0) keep A_j
    and add nothing to the figures; with `only`, A_j is dropped."""
    s = _sample([1, 1, 0, 0, 1], [-1.0, -2.0, math.nan, math.nan, -0.5], adv=0.3)
    teacher = [-1.5, -1.0, -9.0, -9.0, -0.5]
    st = add_distill_term(s, teacher, coef=2.0, only=False)
    assert s.tok_adv == pytest.approx([0.3 - 2 * 0.5, 0.3 + 2 * 1.0, 0.3, 0.3, 0.3])
    assert st.tokens == 3 and st.rkl == pytest.approx(0.5 - 1.0 + 0.0)
    row = st.row()
    assert row["distill/reverse_kl"] == pytest.approx(-0.5 / 3)
    assert row["distill/kl_share"] == pytest.approx(3.0 / (3.0 + 0.9))
    only = _sample([1, 0, 1], [-1.0, math.nan, -1.0], adv=0.7)
    st = add_distill_term(only, [-2.0, 0.0, -1.0], coef=1.0, only=True)
    assert only.tok_adv == pytest.approx([-1.0, 0.0, 0.0])
    assert st.row()["distill/kl_share"] == 1.0
    with pytest.raises(ValueError, match="finite"):
        add_distill_term(_sample([1], [math.nan], 0.0), [-1.0], 1.0, False)


def test_per_token_advantages_reach_the_loss() -> None:
    """The engine's advantages become [n, R] (right-aligned like the log-probs) once a
    sequence has per-token ones, and the clipped loss takes them token by token."""
    from leanrl.train.grpo.loss import policy_loss

    a, b = _sample([1, 1], [0.0, 0.0], 1.0), _sample([1, 1, 1], [0.0] * 3, -1.0)
    assert advantage_tensor([a, b], 3, "cpu").shape == (2,)
    b.tok_adv = [0.5, -0.5, 2.0]
    adv = advantage_tensor([a, b], 3, "cpu")
    assert adv.tolist() == [[0.0, 1.0, 1.0], [0.5, -0.5, 2.0]]
    logp = torch.zeros(2, 3)
    loss, _, _, _ = policy_loss(logp, logp, adv, torch.ones(2, 3))
    assert loss.tolist() == [[-0.0, -1.0, -1.0], [-0.5, 0.5, -2.0]]


# -- the teachers ---------------------------------------------------------------------------------


def _seqs(student: Path, n: int = 3) -> list[tuple[list[int], list[int]]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(student)
    texts = tiny_model_texts()[:n]
    return [(tok(t).input_ids[:12], tok(t).input_ids[12:30]) for t in texts]


def test_the_tiled_teacher_scores_like_full_logits(tiny_model_dir: Path, teacher_dir: Path) -> None:
    """The in-process teacher's log-probs through its tiled head (tiles far smaller than the
    vocabulary) equal those of its full logits."""
    from leanrl.train.distill.teacher import LocalTeacher, resolve

    cfg = DistillConfig(
        teacher=str(teacher_dir), logprob_chunk=5, vocab_tile=64, micro_batch_size=2
    )
    tiled = LocalTeacher(resolve(str(teacher_dir), cfg), cfg, torch.device("cpu"), torch.float32)
    seqs = _seqs(tiny_model_dir)
    got = tiled.score(seqs)
    assert tiled.tiles is not None  # the tiled path was taken
    full = LocalTeacher(resolve(str(teacher_dir), cfg), cfg, torch.device("cpu"), torch.float32)
    full.load()
    full._checked = True  # full logits, one sequence at a time
    want = full.score(seqs)
    for g, w, (_, r) in zip(got, want, seqs, strict=True):
        assert len(g) == len(r)
        assert g == pytest.approx(w, abs=1e-4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    def __init__(self, model: Path, *flags: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        argv = [sys.executable, str(HERE / "_teacher_standin.py"), "--model", str(model)]
        self.proc = subprocess.Popen([*argv, "--port", str(self.port), *flags],
                                     stderr=subprocess.PIPE)  # fmt: skip

    def __enter__(self) -> _Server:
        import httpx

        for _ in range(300):
            if self.proc.poll() is not None:
                raise RuntimeError(self.proc.stderr.read().decode() if self.proc.stderr else "")
            try:
                httpx.get(f"{self.url}/models", timeout=1.0).raise_for_status()
                return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the stand-in teacher server did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("form", ["prompt_logprobs", "echo"])
def test_a_server_teacher_scores_like_the_model_and_its_tokenizer_is_checked(
    tiny_model_dir: Path, teacher_dir: Path, toy_model_dir: Path, form: str
) -> None:
    """Over loopback HTTP: vLLM's prompt_logprobs (or the OpenAI echo form, which the client
    falls back to) give the teacher's log-probs of each response token. The server's
    /tokenize must split text as the student's tokenizer does (here it answers with another
    tokenizer: refused); a server without one needs --distill.tokenizer."""
    import asyncio

    from transformers import AutoTokenizer

    from leanrl.train.distill.teacher import (
        LocalTeacher,
        ServerTeacher,
        check_tokenizer,
        resolve,
    )

    seqs = _seqs(tiny_model_dir)
    cfg = DistillConfig(teacher=str(teacher_dir))
    local = LocalTeacher(resolve(str(teacher_dir), cfg), cfg, torch.device("cpu"), torch.float32)
    want = local.score(seqs)
    student = AutoTokenizer.from_pretrained(tiny_model_dir)
    flags = (
        ("--echo-only", "--no-tokenize") if form == "echo" else ("--tokenizer", str(toy_model_dir))
    )
    with _Server(teacher_dir, *flags) as srv:
        cfg = DistillConfig(teacher=srv.url)
        src = resolve(srv.url, cfg)
        assert (src.kind, src.model) == ("server", "teacher")
        with pytest.raises(ConfigError, match=r"not distill\.server_model"):
            resolve(srv.url, DistillConfig(teacher=srv.url, server_model="other"))
        server = ServerTeacher(src, cfg)

        async def go() -> list[list[float]]:
            try:
                return await server.logprobs(seqs)
            finally:
                await server.close()

        got = asyncio.run(go())
        if form == "echo":
            with pytest.raises(ConfigError, match=r"--distill\.tokenizer"):
                check_tokenizer(student, src, cfg)
            given = DistillConfig(teacher=srv.url, tokenizer=str(tiny_model_dir))
            check_tokenizer(student, src, given)  # the student's own tokenizer: passes
            with pytest.raises(ConfigError, match="another tokenizer"):
                check_tokenizer(
                    student, src, given.model_copy(update={"tokenizer": str(toy_model_dir)})
                )
        else:
            with pytest.raises(ConfigError, match=r"tokenizes .* the student as"):
                check_tokenizer(student, src, cfg)
    assert server._echo is (form == "echo")
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=1e-4)


# -- in a GRPO run ----------------------------------------------------------------------------------


def test_a_teacher_with_another_tokenizer_is_refused_before_any_model_loads(
    tiny_model_dir: Path, toy_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.train.grpo.engine import GRPOEngine

    def load(*a: Any, **kw: Any) -> None:
        raise AssertionError("a model was loaded before the tokenizers were compared")

    monkeypatch.setattr(GRPOEngine, "load", load)
    cfg = _config(tiny_model_dir, tmp_path / "run", steps=1,
                  distill={"teacher": str(toy_model_dir)})  # fmt: skip
    with pytest.raises(ConfigError, match="another tokenizer than the student") as e:
        _train(cfg)
    assert "\n" not in str(e.value)  # one line
    assert not (tmp_path / "run" / "config.json").exists()


@pytest.fixture(scope="module")
def digit_teacher(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The student after 40 GRPO steps on the digit-share reward (from ~0.1 to ~0.6): a
    teacher that knows what the student does not, made by leanrl's own GRPO."""
    out = tmp_path_factory.mktemp("digit-teacher") / "run"
    rows = _train(_config(tiny_model_dir, out, steps=40, save_every=40, keep_checkpoints=1))
    assert sum(r["reward_mean"] for r in rows[-5:]) / 5 > 0.4
    return out  # a run folder: its newest checkpoint is the teacher


@pytest.mark.slow
def test_opd_pulls_the_student_toward_the_teacher(
    tiny_model_dir: Path, digit_teacher: Path, tmp_path: Path
) -> None:
    """distill.only from a teacher GRPO trained: the per-token reverse KL to it falls and the
    student's reward rises toward the teacher's, with no reward in the objective; the same
    run without a teacher has no distillation figures and learns less in these steps."""
    kw: dict[str, Any] = dict(steps=15, lr=3e-3)
    rows = _train(_config(tiny_model_dir, tmp_path / "opd", **kw,
                          distill={"teacher": str(digit_teacher), "only": True}))  # fmt: skip
    kl = [r["distill/reverse_kl"] for r in rows]
    reward = [r["reward_mean"] for r in rows]
    assert all(r["distill/kl_share"] == 1.0 and r["distill/tokens"] > 0 for r in rows)
    assert rows[0]["groups_kept"] == rows[0]["groups"]  # only: every group is kept
    assert sum(kl[-3:]) / 3 < sum(kl[:3]) / 3 - 0.2, kl
    assert sum(reward[-3:]) / 3 > sum(reward[:3]) / 3 + 0.08, reward
    plain = _train(_config(tiny_model_dir, tmp_path / "plain", **kw))
    assert not any(k.startswith("distill/") for k in plain[0])
    assert sum(r["reward_mean"] for r in plain[-3:]) < sum(reward[-3:])


def test_the_teacher_equal_to_the_student_adds_nothing(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A teacher that is the student itself: at step 1 the sampler's and the teacher's
    log-probs agree, so the reverse KL is 0 and the advantages are the group's own."""
    rows = _train(_config(tiny_model_dir, tmp_path / "run", steps=1,
                          distill={"teacher": str(tiny_model_dir), "coef": 5.0}))  # fmt: skip
    assert abs(rows[0]["distill/reverse_kl"]) < 1e-4
    assert rows[0]["distill/kl_share"] < 1e-3


def test_the_teachers_revision_is_recorded_and_a_change_refused(
    tiny_model_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    teacher = tmp_path / "teacher"
    shutil.copytree(teacher_dir, teacher)
    out = tmp_path / "run"
    _train(_config(tiny_model_dir, out, steps=1, distill={"teacher": str(teacher)}))
    revs = json.loads((out / "config.json").read_text())["distill"]["revisions"]
    assert list(revs) == [str(teacher)] and revs[str(teacher)].startswith("files:")
    # the same teacher: the run resumes (and extends)
    _train(_config(tiny_model_dir, out, steps=2, distill={"teacher": str(teacher)}))
    # the teacher's weights replaced in place: refused, in one line, naming both revisions
    shutil.copy(tiny_model_dir / "model.safetensors", teacher / "model.safetensors")
    with pytest.raises(ConfigError, match="has changed since the run") as e:
        _train(_config(tiny_model_dir, out, steps=3, distill={"teacher": str(teacher)}))
    assert revs[str(teacher)] in str(e.value)
    # a pinned revision that is not the teacher's
    pinned = {"teacher": str(teacher), "revisions": {str(teacher): "files:0"}}
    with pytest.raises(ConfigError, match="not the pinned"):
        _train(_config(tiny_model_dir, tmp_path / "other", steps=1, distill=pinned))


def test_distill_only_on_countdown_from_the_cli(
    tiny_model_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    """`leanrl train grpo --env countdown --distill.teacher T --distill.only`: no verifier
    signal is needed; the advantage is the reverse KL alone."""
    from leanrl.cli import main

    out = tmp_path / "run"
    argv = ["train", "grpo", "--env", "countdown", "--env.taskset.split", "train",
            "--model", str(tiny_model_dir), "--distill.teacher", str(teacher_dir),
            "--distill.only", "--steps", "2", "--tasks-per-step", "2", "--group-size", "2",
            "--sampling.max-tokens", "6", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["distill/kl_share"] == 1.0 and r["distill/tokens"] == 2 * 2 * 6
        assert r["groups_kept"] == 2 and r["skipped"] is False  # rewards all 0: still trained
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dynamic_sampling"] == "off" and cfg["mask_truncated"] is False


@pytest.mark.slow
def test_coef_scales_the_term_and_zero_is_plain_grpo(
    tiny_model_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    """distill.coef = 0 trains exactly as GRPO without a teacher (the term is additive, A_j
    untouched), while the reverse KL is still logged; λ = 2 changes the update."""
    from safetensors.torch import load_file

    kw: dict[str, Any] = dict(steps=2, save_every=2)
    # a teacher rules stream_training out; without one the step would stream (the same update
    # to float rounding, but the claim here is "exactly")
    plain = _train(_config(tiny_model_dir, tmp_path / "plain", stream_training=False, **kw))
    zero = _train(_config(tiny_model_dir, tmp_path / "zero", **kw,
                          distill={"teacher": str(teacher_dir), "coef": 0.0}))  # fmt: skip
    two = _train(_config(tiny_model_dir, tmp_path / "two", **kw,
                         distill={"teacher": str(teacher_dir), "coef": 2.0}))  # fmt: skip
    assert [r["loss"] for r in zero] == [r["loss"] for r in plain]
    assert zero[0]["distill/kl_share"] == 0.0 and zero[0]["distill/reverse_kl"] != 0.0
    assert two[0]["distill/kl_share"] > 0.0 and two[0]["loss"] != plain[0]["loss"]
    w = {n: load_file(str(tmp_path / n / "checkpoint-2" / "model.safetensors")) for n in
         ("plain", "zero", "two")}  # fmt: skip
    assert all(torch.equal(w["plain"][k], w["zero"][k]) for k in w["plain"])
    assert not all(torch.equal(w["plain"][k], w["two"][k]) for k in w["plain"])


def test_the_teachers_temperature_divides_its_logits(
    tiny_model_dir: Path, teacher_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from leanrl.train.distill.teacher import LocalTeacher, resolve

    cfg = DistillConfig(teacher=str(teacher_dir), temperature=2.0, vocab_tile=100)
    t = LocalTeacher(resolve(str(teacher_dir), cfg), cfg, torch.device("cpu"), torch.float32)
    [(p, r)] = _seqs(tiny_model_dir, 1)
    [got] = t.score([(p, r)])
    model = AutoModelForCausalLM.from_pretrained(teacher_dir)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : -1]
    want = torch.log_softmax(logits / 2.0, -1).gather(1, torch.tensor(r)[:, None])[:, 0]
    assert got == pytest.approx(want.tolist(), abs=1e-4)
    with pytest.raises(ValueError, match="raw logits"):
        DistillConfig(teacher="http://127.0.0.1:1/v1", temperature=2.0)


def test_leanrl_train_distill_on_policy_runs_grpo_with_the_teacher(
    tiny_model_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    from leanrl.cli import main

    out = tmp_path / "run"
    argv = ["train", "distill", "--mode", "on-policy", "--env", "countdown",
            "--env.taskset.split", "train", "--student", str(tiny_model_dir),
            "--teacher", str(teacher_dir), "--steps", "1", "--tasks-per-step", "2",
            "--on-policy.group-size", "2", "--sampling.max-tokens", "4", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    [row] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["distill/kl_share"] == 1.0 and (out / "checkpoint-1").is_dir()
    cfg = json.loads((out / "config.json").read_text())  # a GRPO run's config
    assert cfg["distill"]["only"] is True and cfg["group_size"] == 2


@pytest.mark.slow
def test_multi_turn_sequences_are_scored_token_exactly(
    toy_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Self-correction episodes (the model's turns, Lean's errors fed back between them): with
    the student as its own teacher, every model token's reverse KL is 0 at step 1, the later
    turns' too, so the teacher saw each token at the position the student sampled it, the
    feedback in context; the feedback tokens themselves are not scored."""
    from leanrl.environment import EnvironmentConfig
    from leanrl.harness import HarnessConfig
    from leanrl.policy import PolicyConfig, SamplingConfig
    from leanrl.train.distill.onpolicy import OnPolicyDistill
    from leanrl.train.grpo import GRPOConfig, GRPOTrainer
    from tests.test_harness_self_correction import _env

    seen: list[Any] = []
    apply = OnPolicyDistill.apply

    async def spy(self: Any, step: int, samples: Any) -> None:
        await apply(self, step, samples)
        seen.extend(samples)

    monkeypatch.setattr(OnPolicyDistill, "apply", spy)
    cfg = GRPOConfig(
        policy=PolicyConfig(model=str(toy_model_dir)),
        sampling=SamplingConfig(max_tokens=8, top_p=1.0, seed=0),
        env=EnvironmentConfig(id="toy-sc", harness=HarnessConfig(name="self-correction")),
        out=tmp_path / "run", steps=1, tasks_per_step=2, group_size=2, lr=1e-3,
        dynamic_sampling="off", mask_truncated=False,
        distill={"teacher": str(toy_model_dir)},
    )  # fmt: skip
    trainer = GRPOTrainer(cfg, env=_env("deepseek"))
    [row] = trainer.train_sync()
    feedback = [s for s in seen if 0 in s.mask and 1 in s.mask[s.mask.index(0) :]]
    assert feedback, "no episode with a turn after the environment's feedback"
    assert row["distill/tokens"] == row["loss_tokens"] == sum(sum(s.mask) for s in seen)
    assert abs(row["distill/reverse_kl"]) < 1e-4
    for s in feedback:  # the term is the group's advantage, to the last token
        assert s.tok_adv == pytest.approx([s.adv] * len(s.resp), abs=1e-4)
