"""Trace converters: verifiers' ``traces.jsonl`` to leanrl's ``proofs.jsonl``, and back.

Plain JSON both ways, so a results file can be converted on a machine without the
``verifiers`` extra (verifiers is imported only to look up a verifiers task's data by its
taskset id, for a kept proof that does not carry it, where verifiers is installed).

**verifiers -> leanrl** (:func:`vf_to_proofs`). A verifiers run folder holds ``traces.jsonl``:
one *episode* per line (``{"id", "env", "task", "ok", "traces": [trace, ...]}``; a line that is a
bare trace is read too). Each trace whose rollout finished without error and was solved becomes
one :class:`~leanrl.proofs.KeptProof` (for ``leanrl train sft --data.proofs`` and expert
iteration), deduplicated per task as every proofs file is:

* a trace of leanrl's own verifiers taskset (``leanrl-verifiers``: its task data carries the
  leanrl task, the environment and the harness settings) is kept when leanrl's verdict in
  ``info["leanrl_verdict"]`` accepted it; the answer is pulled out of the reply by **that
  environment's own harness** (a Lean block, Countdown's ``<answer>`` tags:
  :mod:`leanrl.interop.replay`), so the row is the one ``leanrl eval`` would have kept;
* a trace of any other verifiers taskset is kept when its reward (the weighted sum of
  ``rewards``) reaches ``solved_at``; its task is the one the ``verifiers`` environment makes of
  that verifiers task (id: the task key; statement: ``verifiers <taskset>: <key>``), the
  "proof" is the reply (stripped, as verifiers' rewards read it), and the verifiers task itself
  (type, key, data: its system prompt and fields) and its rewards ride along as the row's
  ``vf_task`` and ``vf_rewards``.

**leanrl -> verifiers** (:func:`proofs_to_vf`). Each kept proof becomes one episode line in
verifiers' format, as the environment it came from would have made it: a leanrl task is written
as the ``leanrl-verifiers`` taskset's task, prompted by its environment's harness (Countdown's
prompt for a Countdown puzzle; the ``chat`` whole-proof prompt for Lean), with the model's own
text as the reply (else the answer in the harness's layout); a verifiers task under its own
taskset id and key, with its own data. The reward, leanrl's verdict (``info["leanrl_verdict"]``)
and what a trace has no place for (``info["leanrl_proof"]``: source, step, sample, time, extra
fields) are kept, so that converting the episode back gives the same kept proof, field for
field (tested for every built-in environment).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

from leanrl.environment import load_environment
from leanrl.errors import ConfigError, DatasetError
from leanrl.harness import Harness, HarnessConfig
from leanrl.harnesses.whole_proof.harness import WholeProofHarness
from leanrl.interop.replay import (
    ReplyPolicy,
    chat_parts,
    one_turn_harness,
    replay_generate,
    run_sync,
)
from leanrl.proofs import PROOFS_FILE, KeptProof, Pair, ProofStore, read_proofs
from leanrl.task import Task

__all__ = [
    "TRACES_FILE",
    "Converted",
    "kept_from_trace",
    "proofs_to_vf",
    "read_vf_traces",
    "trace_from_kept",
    "vf_to_proofs",
]

TRACES_FILE = "traces.jsonl"
"""The results file of a verifiers run folder."""
LEANRL_TASKSET_ID = "leanrl-verifiers"
"""The verifiers id of leanrl's own taskset (``leanrl_verifiers``)."""
_VF_PREFIX = "verifiers "
"""How the ``verifiers`` environment's statements start (``verifiers <taskset>: <key>``)."""
_ROW_FIELDS = ("source", "step", "sample", "time", "text_cut")
"""Kept-proof fields a verifiers trace has no place of its own for (``info["leanrl_proof"]``)."""


@dataclass
class Converted:
    """What a conversion read, wrote and skipped (with why)."""

    read: int = 0
    written: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        why = ", ".join(f"{n} {k}" for k, n in sorted(self.skipped.items()))
        return f"read {self.read}, wrote {self.written}" + (f" (skipped: {why})" if why else "")


# -- the harness a task is prompted and read by --------------------------------------------------


@cache
def _harness(env: str, fields_json: str) -> Harness:
    """The one-turn harness of environment ``env`` with these settings (no environment: the
    whole-proof harness, as for a Lean task of an unknown environment). Builds nothing heavy."""
    fields = json.loads(fields_json)
    if not env:
        return WholeProofHarness(HarnessConfig(**fields))
    return one_turn_harness(load_environment(env, harness=HarnessConfig(**fields)))


def harness_for(env: str, fields: dict[str, Any]) -> Harness:
    """:func:`_harness`, cached by its JSON settings."""
    return _harness(env or "", json.dumps(fields, sort_keys=True))


def _is_countdown(statement: str, header: str) -> bool:
    from leanrl.environments.countdown import parse_statement

    if header:
        return False
    try:
        parse_statement(statement)
    except ValueError:
        return False
    return True


# -- verifiers -> leanrl ---------------------------------------------------------------------


def _traces_path(path: str | Path) -> Path:
    p = Path(path).expanduser()
    return p / TRACES_FILE if p.is_dir() else p


def read_vf_traces(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(env id, trace)`` for every trace in a verifiers results file (or a run folder holding
    ``traces.jsonl``): episode lines give each of their traces, bare trace lines themselves."""
    p = _traces_path(path)
    if not p.is_file():
        raise DatasetError(
            f"verifiers results {p} do not exist (give a traces.jsonl or its folder)"
        )
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(
                    f"{p}, line {n}: not JSON ({e.msg}); is it a traces.jsonl?"
                ) from None
            if not isinstance(row, dict) or not ("traces" in row or "task" in row):
                raise DatasetError(
                    f"{p}, line {n}: neither a verifiers episode (with 'traces') nor a trace "
                    "(with 'task')"
                )
            env = str((row.get("env") or {}).get("id") or "")
            for trace in row["traces"] if "traces" in row else [row]:
                yield env, trace


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _reply(trace: dict[str, Any]) -> str:
    """The root agent's last reply as the model sent it (``vf.Trace.last_reply`` strips it)."""
    for node in reversed(trace.get("nodes") or []):
        msg = node.get("message") or {}
        if node.get("sampled") and msg.get("role") == "assistant":
            return _content(msg)
    if trace.get("root_reply") is not None:
        return str(trace["root_reply"])
    return ""


def _finish(trace: dict[str, Any]) -> Literal["stop", "length"]:
    """Why the last model call ended, as verifiers recorded it (``stop`` when it did not)."""
    calls = [c for c in trace.get("calls") or [] if isinstance(c, dict) and not c.get("error")]
    return "length" if calls and calls[-1].get("finish_reason") == "length" else "stop"


def _reward(trace: dict[str, Any]) -> float:
    return sum(
        float(r.get("score", 0.0)) * float(r.get("weight", 1.0))
        for r in (trace.get("rewards") or {}).values()
        if r is not None
    )


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    parts = [m.get("content") for m in prompt or [] if isinstance(m, dict)]
    return "\n\n".join(p for p in parts if isinstance(p, str) and p)


def _provenance(trace: dict[str, Any]) -> dict[str, Any]:
    """The kept-proof fields a trace written by :func:`trace_from_kept` carries in
    ``info["leanrl_proof"]`` (its source, step, ..., extra fields), else those of a proof
    kept from verifiers."""
    stored = (trace.get("info") or {}).get("leanrl_proof")
    if isinstance(stored, dict):
        out = {k: stored[k] for k in _ROW_FIELDS if k in stored}
        out.update(stored.get("extra") or {})
        return out
    return {"source": "verifiers"}


def kept_from_trace(
    trace: dict[str, Any], env_id: str = "", *, solved_at: float = 1.0
) -> tuple[KeptProof | None, str]:
    """The kept proof a verifiers trace makes, or None and why it makes none."""
    if trace.get("ok") is False or trace.get("errors"):
        return None, "errored rollout"
    task_info = trace.get("task") or {}
    data = task_info.get("data") or {}
    reply = _reply(trace)
    model = str(((trace.get("agent") or {}).get("config") or {}).get("model") or "")
    stored = (trace.get("info") or {}).get("leanrl_proof") or {}
    written = isinstance(stored, dict) and stored.get("reply") == "written"
    common: dict[str, Any] = {"model": model, **_provenance(trace)}
    if "leanrl_task" in data:
        verdict = (trace.get("info") or {}).get("leanrl_verdict")
        if not verdict:
            return None, "no leanrl verdict"
        if not verdict.get("accepted"):
            return None, "not accepted"
        task = Task.model_validate(data["leanrl_task"])
        env = str(data.get("env") or "")
        harness = harness_for(env, data.get("harness") or _fields_for(env))
        # The environment's own harness reads the reply, as `leanrl eval` would have.
        r = run_sync(replay_generate(harness, task, ReplyPolicy(reply, _finish(trace))))
        if r.proof is None:
            return None, "no proof in the reply"
        answer = stored.get("answer") if written else None
        if not isinstance(answer, dict):
            answer = {
                "proof": r.proof,
                "preamble": r.preamble,
                "restated_statement": r.restated_statement,
            }
        return KeptProof(
            task_id=task.id,
            name=task.name,
            header=task.header,
            formal_statement=task.formal_statement,
            informal_statement=task.informal_statement,
            **answer,
            completion="" if written else (r.turns[-1].completion if r.turns else reply),
            reason=str(verdict.get("reason", "ok")),
            axioms=list(verdict.get("axioms") or []),
            verify_s=float(verdict.get("time_s") or 0.0),
            **common,
        ), ""
    if _reward(trace) < solved_at:
        return None, "reward below solved_at"
    if not reply.strip():
        return None, "no reply"
    key = str(task_info.get("key") or data.get("id") or data.get("name") or "")
    if not key:
        return None, "task without a key"
    taskset = env_id.rsplit("+", 1)[-1] or "unknown"  # `best-of-n+gsm8k`: the seed taskset
    if not isinstance(stored, dict) or not stored:  # from verifiers: the task and its rewards
        common["reward"] = _reward(trace)
        common["vf_task"] = {"type": task_info.get("type"), "key": key, "data": data}
        common["vf_rewards"] = trace.get("rewards") or {}
    return KeptProof(
        task_id=key,
        name=str(data.get("name") or data.get("id") or key),
        header="",
        formal_statement=f"{_VF_PREFIX}{taskset}: {key}",
        informal_statement=_prompt_text(data.get("prompt")) or None,
        proof=_written_proof(stored) if written else reply.strip(),  # as `last_reply` reads it
        completion="" if written else reply,
        **common,
    ), ""


def _written_proof(stored: dict[str, Any]) -> str:
    answer = stored.get("answer")
    return str(answer.get("proof", "")) if isinstance(answer, dict) else ""


def vf_to_proofs(src: str | Path, dest: str | Path, *, solved_at: float = 1.0) -> Converted:
    """Append the solved traces of verifiers results ``src`` to the proofs file ``dest`` (a
    ``.jsonl`` file, or a folder that gets a ``proofs.jsonl``); proofs already there are not
    repeated."""
    out = Path(dest).expanduser()
    store = ProofStore(out if out.suffix == ".jsonl" else out / PROOFS_FILE).open()
    report = Converted()
    rows: list[KeptProof] = []
    for env_id, trace in read_vf_traces(src):
        report.read += 1
        row, why = kept_from_trace(trace, env_id, solved_at=solved_at)
        if row is None:
            report.skipped[why] += 1
        else:
            rows.append(row)
    added = store.add(rows)
    report.written = len(added)
    if len(rows) > len(added):
        report.skipped["already kept"] += len(rows) - len(added)
    return report


# -- leanrl -> verifiers ---------------------------------------------------------------------


def _vf_taskset_of(row: KeptProof) -> str | None:
    """The verifiers taskset a kept proof of the ``verifiers`` environment is of (None: a
    leanrl task)."""
    st = row.formal_statement
    if row.header or not st.startswith(_VF_PREFIX) or ": " not in st:
        return None
    return st[len(_VF_PREFIX) :].split(": ", 1)[0]


@cache
def _vf_task_data(taskset: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """``key -> (task type, task data)`` of a bounded verifiers taskset that can be loaded
    here (empty when it cannot: the kept proof's own fields are written instead)."""
    try:
        env = load_environment("verifiers", harness=HarnessConfig(options={"env": taskset}))
        env.tasks()
        ts: Any = env.taskset
        return {
            k: (type(t).__name__, t.data.model_dump(mode="json", exclude_none=True))
            for k, t in ts.vf_tasks.items()
        }
    except (ConfigError, DatasetError, ImportError):
        return {}


def _messages(system: str | None, prompt: Any, reply: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        out.append({"role": "user", "content": prompt})
    else:
        out.extend(dict(m) for m in prompt or [] if isinstance(m, dict))
    out.append({"role": "assistant", "content": reply})
    return out


def _provenance_of(row: KeptProof, written: bool) -> dict[str, Any]:
    stored: dict[str, Any] = {k: getattr(row, k) for k in _ROW_FIELDS}
    if row.model_extra:
        stored["extra"] = dict(row.model_extra)
    if written:
        # No model text was kept: the reply is the answer laid out by leanrl, and the answer's
        # exact text travels with it (a layout need not read back to the same whitespace).
        stored["reply"] = "written"
        stored["answer"] = {
            "proof": row.proof,
            "preamble": row.preamble,
            "restated_statement": row.restated_statement,
        }
    return stored


def trace_from_kept(
    row: KeptProof,
    idx: int = 0,
    env_id: str | None = None,
    env: str | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One verifiers episode (a JSON object) for a kept proof. ``env``: the leanrl environment
    it is of (default: Countdown for a Countdown puzzle, else a Lean environment), ``options``
    its harness options (Countdown's ``style``); ``env_id``: the episode's verifiers env id
    (default: the verifiers taskset a verifiers task came from, ``leanrl-verifiers`` for a
    leanrl task)."""
    task = row.task()
    taskset = _vf_taskset_of(row)
    written = not row.completion
    if taskset is not None:  # a verifiers task: its own taskset, key, data and rewards
        extra = row.model_extra or {}
        vf_task = extra.get("vf_task") or {}
        found = _vf_task_data(taskset).get(row.task_id) if not vf_task else None
        if vf_task:
            task_type, data = str(vf_task.get("type") or "Task"), dict(vf_task.get("data") or {})
        elif found is not None:
            task_type, data = found[0], dict(found[1])
        else:
            task_type = "Task"
            data = {"idx": idx, "name": row.name, "prompt": row.informal_statement or ""}
        reply = row.completion or row.proof
        messages = _messages(data.get("system_prompt"), data.get("prompt"), reply)
        score = float(extra.get("reward", 1.0))
        rewards = extra.get("vf_rewards") or {"reward": {"score": score, "weight": 1.0}}
        trace_task = {"type": task_type, "data": data, "key": row.task_id}
        info: dict[str, Any] = {}
        episode_env = env_id or taskset
    else:  # a leanrl task: leanrl's taskset, prompted and laid out by its environment's harness
        if env is None:
            env = "countdown" if _is_countdown(row.formal_statement, row.header) else ""
        fields = _fields_for(env, options)
        harness = harness_for(env, fields)
        system, user = chat_parts(harness.prompt(task))  # type: ignore[attr-defined]
        reply = row.completion or _laid_out(harness, task, row)
        data = {
            "idx": idx,
            "id": row.task_id,
            "name": row.name,
            "prompt": user,
            "system_prompt": system,
            "leanrl_task": task.model_dump(mode="json"),
            "checker": "",
            "env": env,
            "harness": fields,
        }
        messages = _messages(system, user, reply)
        rewards = {"leanrl": {"score": 1.0, "weight": 1.0}}
        trace_task = {"type": "LeanrlTask", "data": data, "key": f"leanrl:{row.task_id}"}
        info = {
            "leanrl_verdict": {
                "accepted": True,
                "reason": row.reason,
                "axioms": row.axioms,
                "time_s": row.verify_s,
                "id": row.task_id,
            }
        }
        episode_env = env_id or LEANRL_TASKSET_ID
    info["leanrl_proof"] = _provenance_of(row, written)
    nodes: list[dict[str, Any]] = []
    for m in messages:
        node: dict[str, Any] = {"message": m}
        if nodes:
            node["parent"] = len(nodes) - 1
        node["sampled"] = m is messages[-1]
        nodes.append(node)
    trace: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "task": trace_task,
        "agent": {"config": {"model": row.model}},
        "nodes": nodes,
        "rewards": rewards,
        "info": info,
        "is_completed": True,
        "ok": True,
        "stop_condition": "agent_completed",
    }
    return {
        "id": uuid.uuid4().hex,
        "env": {"id": episode_env},
        "task": trace_task,
        "ok": True,
        "traces": [trace],
    }


@cache
def _harness_is_configured(env: str) -> bool:
    """Whether environment ``env`` works with the harness its config names (the Lean ones: the
    whole-proof harness) rather than one of its own (``countdown``)."""
    from leanrl.environment import Environment

    e = load_environment(env)
    return type(e).make_harness is Environment.make_harness


def _fields_for(env: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The harness settings the verifiers plugin gives environment ``env``: the ``chat``
    whole-proof prompt for a Lean one (or an unknown one), the environment's own otherwise."""
    if not env or _harness_is_configured(env):
        return {"prompt_format": "chat", "options": dict(options or {})}
    return {"options": dict(options or {})}


def _laid_out(harness: Harness, task: Task, row: KeptProof) -> str:
    """The answer as the harness lays it out for training (Countdown's ``<answer>`` tags; for
    Lean, the proof under its statement in a Lean block)."""
    pair = Pair(task=task, proof=row.proof, preamble=row.preamble, statement=row.restated_statement)
    example = harness.sft_example(pair)
    if example is not None:
        return example[1]
    statement = task.model_copy(update={"header": ""})
    if row.restated_statement:
        statement = statement.model_copy(update={"formal_statement": row.restated_statement})
    return "```lean4\n" + statement.lean_text(row.proof, row.preamble).rstrip() + "\n```"


def _run_env(src: Path) -> tuple[str, dict[str, Any]] | None:
    """The environment id and harness options a leanrl run folder's config names
    (``config.json`` of a trainer, ``run.json`` of an eval), if any."""
    for name in ("config.json", "run.json"):
        try:
            d = json.loads((src / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        cfg = d.get("config", d) if isinstance(d, dict) else {}
        env = cfg.get("env") if isinstance(cfg, dict) else None
        if isinstance(env, dict) and isinstance(env.get("id"), str):
            options = (env.get("harness") or {}).get("options") or {}
            return env["id"], dict(options) if isinstance(options, dict) else {}
    return None


def proofs_to_vf(
    src: str | Path, dest: str | Path, *, env_id: str | None = None, env: str | None = None
) -> Converted:
    """Write every kept proof of ``src`` (a ``proofs.jsonl`` or a run folder) as a verifiers
    episode to ``dest`` (a ``traces.jsonl``, or a folder that gets one); ``dest`` is replaced.
    ``env``: the leanrl environment of the proofs (default: the run folder's config says, else
    found from each statement); ``env_id``: the episodes' verifiers env id (default: per proof,
    see :func:`trace_from_kept`)."""
    p = Path(src).expanduser()
    rows = read_proofs(p / PROOFS_FILE if p.is_dir() else p)
    options: dict[str, Any] = {}
    found = _run_env(p) if env is None and p.is_dir() else None
    if found is not None and found[0] != "verifiers":  # verifiers tasks say whose they are
        env, options = found
    out = Path(dest).expanduser()
    if out.suffix != ".jsonl":  # a run folder (made if missing)
        out = out / TRACES_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = (
        json.dumps(trace_from_kept(r, i, env_id, env, options), ensure_ascii=False)
        for i, r in enumerate(rows)
    )
    report = Converted(read=len(rows))
    with out.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
            report.written += 1
    return report
