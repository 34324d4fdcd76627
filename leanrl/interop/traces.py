"""Trace converters: verifiers' ``traces.jsonl`` to leanrl's ``proofs.jsonl``, and back.

Plain JSON both ways: neither direction imports verifiers, so a results file can be converted on
a machine without the ``verifiers`` extra.

**verifiers -> leanrl** (:func:`vf_to_proofs`). A verifiers run folder holds ``traces.jsonl``:
one *episode* per line (``{"id", "env", "task", "ok", "traces": [trace, ...]}``; a line that is a
bare trace is read too). Each trace whose rollout finished without error and was solved becomes
one :class:`~leanrl.proofs.KeptProof` (for ``leanrl train sft --data.proofs`` and expert
iteration), deduplicated per task as every proofs file is:

* a trace of leanrl's own verifiers taskset (``leanrl-verifiers``: its task data carries the
  leanrl task) is kept when leanrl's verdict in ``info["leanrl_verdict"]`` accepted it; the
  proof is pulled out of the reply as leanrl's whole-proof harness does, so the row is the same
  as the one ``leanrl eval`` would have kept;
* a trace of any other verifiers taskset is kept when its reward (the weighted sum of
  ``rewards``) reaches ``solved_at``; its task is the one the ``verifiers`` environment makes of
  that verifiers task (id: the task key; statement: ``verifiers <taskset>: <key>``), and the
  "proof" is the whole reply.

**leanrl -> verifiers** (:func:`proofs_to_vf`). Each kept proof becomes one episode line in
verifiers' format: the prompt leanrl's taskset gives that task (``chat`` format), the reply (the
model's own text when kept, else the proof in a Lean block), the reward 1.0 under ``leanrl`` and
the verdict in ``info["leanrl_verdict"]``; ``vf.Trace`` and verifiers' ``read_episodes`` read it.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leanrl.errors import DatasetError
from leanrl.harness import HarnessConfig
from leanrl.harnesses.whole_proof.extract import extract_proof
from leanrl.harnesses.whole_proof.prompts import build_prompt
from leanrl.proofs import PROOFS_FILE, KeptProof, ProofStore, read_proofs
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


@dataclass
class Converted:
    """What a conversion read, wrote and skipped (with why)."""

    read: int = 0
    written: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        why = ", ".join(f"{n} {k}" for k, n in sorted(self.skipped.items()))
        return f"read {self.read}, wrote {self.written}" + (f" (skipped: {why})" if why else "")


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


def _reply(trace: dict[str, Any]) -> str:
    """The root agent's last reply, as ``vf.Trace.last_reply`` reads it."""
    if trace.get("root_reply") is not None:
        return str(trace["root_reply"]).strip()
    for node in reversed(trace.get("nodes") or []):
        msg = node.get("message") or {}
        if node.get("sampled") and msg.get("role") == "assistant":
            content = msg.get("content")
            if isinstance(content, list):  # content parts: their text
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "").strip()
    return ""


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
    common: dict[str, Any] = {"completion": reply, "source": "verifiers", "model": model}
    if data.get("leanrl_task") is None:
        common["reward"] = _reward(trace)  # an extra field: the rubric's reward it was kept at
    if "leanrl_task" in data:
        verdict = (trace.get("info") or {}).get("leanrl_verdict")
        if not verdict:
            return None, "no leanrl verdict"
        if not verdict.get("accepted"):
            return None, "not accepted"
        task = Task.model_validate(data["leanrl_task"])
        ex = extract_proof(reply, task)
        if ex.proof is None:
            return None, "no proof in the reply"
        return KeptProof(
            task_id=task.id,
            name=task.name,
            header=task.header,
            formal_statement=task.formal_statement,
            informal_statement=task.informal_statement,
            proof=ex.proof,
            preamble=ex.preamble,
            restated_statement=ex.restated_statement,
            reason=str(verdict.get("reason", "ok")),
            axioms=list(verdict.get("axioms") or []),
            verify_s=float(verdict.get("time_s") or 0.0),
            **common,
        ), ""
    if _reward(trace) < solved_at:
        return None, "reward below solved_at"
    if not reply:
        return None, "no reply"
    key = str(task_info.get("key") or data.get("id") or data.get("name") or "")
    if not key:
        return None, "task without a key"
    taskset = env_id.rsplit("+", 1)[-1] or "unknown"  # `best-of-n+gsm8k`: the seed taskset
    return KeptProof(
        task_id=key,
        name=str(data.get("name") or data.get("id") or key),
        header="",
        formal_statement=f"verifiers {taskset}: {key}",
        informal_statement=_prompt_text(data.get("prompt")) or None,
        proof=reply,
        **common,
    ), ""


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


def trace_from_kept(
    row: KeptProof, idx: int = 0, env_id: str = LEANRL_TASKSET_ID
) -> dict[str, Any]:
    """One verifiers episode (a JSON object) for a kept proof."""
    task = row.task()
    is_vf = row.formal_statement.startswith("verifiers ") and not row.header
    if is_vf:  # a verifiers task kept by the `verifiers` environment: its prompt, its reply
        system, user = None, row.informal_statement or ""
        reply = row.completion or row.proof
        data: dict[str, Any] = {"idx": idx, "id": row.task_id, "name": row.name, "prompt": user}
        reward_name, score = "reward", float((row.model_extra or {}).get("reward", 1.0))
        task_type = "Task"
    else:
        messages = build_prompt(task, HarnessConfig(prompt_format="chat"))
        assert not isinstance(messages, str)  # a chat format
        system = next((m.content for m in messages if m.role == "system"), None)
        user = "\n\n".join(m.content for m in messages if m.role == "user")
        statement = task.model_copy(update={"header": ""})
        if row.restated_statement:
            statement = statement.model_copy(update={"formal_statement": row.restated_statement})
        reply = row.completion or (
            "```lean4\n" + statement.lean_text(row.proof, row.preamble).rstrip() + "\n```"
        )
        data = {
            "idx": idx,
            "id": row.task_id,
            "name": row.name,
            "prompt": user,
            "system_prompt": system,
            "leanrl_task": task.model_dump(mode="json"),
            "checker": "",
        }
        reward_name, score = "leanrl", 1.0
        task_type = "LeanrlTask"
    trace_task = {"type": task_type, "data": data, "key": f"leanrl:{row.task_id}"}
    nodes: list[dict[str, Any]] = []
    for role, content in (("system", system), ("user", user), ("assistant", reply)):
        if content is None:
            continue
        node: dict[str, Any] = {"message": {"role": role, "content": content}}
        if nodes:
            node["parent"] = len(nodes) - 1
        node["sampled"] = role == "assistant"
        nodes.append(node)
    verdict = {
        "accepted": True,
        "reason": row.reason,
        "axioms": row.axioms,
        "time_s": row.verify_s,
        "id": row.task_id,
    }
    trace: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "task": trace_task,
        "agent": {"config": {"model": row.model}},
        "nodes": nodes,
        "rewards": {reward_name: {"score": score, "weight": 1.0}},
        "info": {} if is_vf else {"leanrl_verdict": verdict},
        "is_completed": True,
        "ok": True,
        "stop_condition": "agent_completed",
    }
    return {
        "id": uuid.uuid4().hex,
        "env": {"id": env_id},
        "task": trace_task,
        "ok": True,
        "traces": [trace],
    }


def proofs_to_vf(
    src: str | Path, dest: str | Path, *, env_id: str = LEANRL_TASKSET_ID
) -> Converted:
    """Write every kept proof of ``src`` (a ``proofs.jsonl`` or a run folder) as a verifiers
    episode to ``dest`` (a ``traces.jsonl``, or a folder that gets one); ``dest`` is replaced."""
    p = Path(src).expanduser()
    rows = read_proofs(p / PROOFS_FILE if p.is_dir() else p)
    out = Path(dest).expanduser()
    if out.suffix != ".jsonl":  # a run folder (made if missing)
        out = out / TRACES_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = (
        json.dumps(trace_from_kept(r, i, env_id), ensure_ascii=False) for i, r in enumerate(rows)
    )
    report = Converted(read=len(rows))
    with out.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
            report.written += 1
    return report
