"""Append-only logs (results.jsonl, metrics.jsonl) and damaged lines: a bad line in the middle is
quarantined and reported, never a reason to drop the records after it; only a torn LAST line is
dropped. Also the other files a resume reads (run.json, config.json) and a full disk."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from leanrl import EnvironmentConfig, RuntimeConfig, TasksetConfig
from leanrl.errors import ConfigError, DiskFullError
from leanrl.eval import EvalConfig, run_eval
from leanrl.eval.store import ResultStore
from leanrl.train.common import RunDir
from tests._scripted_runtime import ScriptedPolicy

ROWS = [
    {
        "name": f"t{i}",
        "split": "test",
        "header": "import Mathlib\n",
        "formal_statement": f"theorem t{i} : {i} + 0 = {i} := by",
    }
    for i in range(6)
]


def _tasks(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def _eval_config(tasks: Path, out: Path) -> EvalConfig:
    return EvalConfig(
        env=EnvironmentConfig(
            id="minif2f",
            taskset=TasksetConfig(path=tasks),
            runtime=RuntimeConfig(name="tests._scripted_runtime:ScriptedRuntime"),
        ),
        samples=2,
        out=out,
        chunk_tasks=2,
        progress=False,
    )


def _recs(task: str, n: int) -> list[dict[str, Any]]:
    return [{"task_id": task, "sample": i, "accepted": i == 0} for i in range(n)]


def _damage_line(path: Path, index: int, garbage: bytes) -> bytes:
    lines = path.read_bytes().splitlines(keepends=True)
    old = lines[index]
    lines[index] = garbage + b"\n"
    path.write_bytes(b"".join(lines))
    return old


@pytest.mark.parametrize(
    "garbage", [b'{"task_id": "b", "sam', b"\x00\x00\x00\x00", b'{"task_id": "b\xff", "sample": 0}']
)
def test_a_bad_results_line_is_quarantined_and_later_records_kept(
    tmp_path: Path, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    st = ResultStore(tmp_path)
    st.open("fp", {}, "")
    for task in "abcde":
        st.append(_recs(task, 2))
    st.close()
    _damage_line(tmp_path / "results.jsonl", 2, garbage)  # ("b", 0), third of ten lines

    again = ResultStore(tmp_path)
    with caplog.at_level(logging.WARNING, logger="leanrl"):
        again.open("fp", {}, "")
    assert len(again.records) == 9 and ("b", 0) not in again.records
    assert ("e", 1) in again.records  # everything after the bad line survives
    assert (tmp_path / "results.jsonl.quarantined").read_bytes() == garbage + b"\n"
    assert "line 3 is not a valid attempt record" in caplog.text
    assert "results.jsonl.quarantined" in caplog.text
    assert again.append(_recs("b", 2)) == 1  # only the quarantined attempt is redone
    again.close()
    keys = [(json.loads(x)["task_id"], json.loads(x)["sample"]) for x in
            (tmp_path / "results.jsonl").read_text().splitlines()]  # fmt: skip
    assert sorted(keys) == sorted((t, s) for t in "abcde" for s in range(2))


async def test_eval_resume_redoes_only_the_quarantined_attempt(tmp_path: Path) -> None:
    tasks, out = _tasks(tmp_path), tmp_path / "run"
    texts = ["\n  omega\n", "\n  simp\n"]
    first = await run_eval(_eval_config(tasks, out), policy=ScriptedPolicy(texts))
    assert first["results"]["attempts"] == 12
    lines = (out / "results.jsonl").read_bytes().splitlines(keepends=True)
    victim = json.loads(lines[4])
    _damage_line(out / "results.jsonl", 4, b"#" * 40)
    # a torn last line, too, as a kill mid-write leaves it
    with (out / "results.jsonl").open("ab") as f:
        f.write(b'{"task_id": "t5", "sa')

    policy = ScriptedPolicy(texts)
    again = await run_eval(_eval_config(tasks, out), policy=policy)
    assert again["results"]["attempts"] == 12 and again["timing"]["attempts_this_run"] == 1
    assert len(policy.calls) == 1  # one chunk regenerated, for the one quarantined attempt
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 12
    assert any((r["task_id"], r["sample"]) == (victim["task_id"], victim["sample"]) for r in recs)
    # the torn tail is not "bad data": it is dropped, not quarantined
    assert (out / "results.jsonl.quarantined").read_bytes() == b"#" * 40 + b"\n"


def test_a_bad_metrics_line_keeps_later_steps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = RunDir(tmp_path)
    for step in range(1, 7):
        run.log({"step": step, "reward_mean": step / 10})
    _damage_line(run.metrics_path, 2, b"\xde\xad garbage")
    with caplog.at_level(logging.WARNING, logger="leanrl"):
        steps = [r["step"] for r in run.metrics()]
    assert steps == [1, 2, 4, 5, 6]  # not [1, 2]: step 3's line is bad, the rest is fine
    assert "skipped 1 unreadable line" in caplog.text
    with run.metrics_path.open("ab") as f:
        f.write(b'{"step": 7, "rew')  # torn by a kill
    run.truncate_metrics(5)  # a resume from checkpoint-5
    assert [r["step"] for r in run.metrics()] == [1, 2, 4, 5]
    assert run.metrics_path.with_name("metrics.jsonl.quarantined").read_bytes() == (
        b"\xde\xad garbage\n"
    )


def test_damaged_run_json_and_config_json_are_clear_errors(tmp_path: Path) -> None:
    st = ResultStore(tmp_path / "eval")
    st.open("fp", {"samples": 1}, "")
    st.append(_recs("a", 1))
    st.close()
    (tmp_path / "eval" / "run.json").write_bytes(b'{"fingerprint": "fp", "conf')
    with pytest.raises(ConfigError, match=r"run.json is damaged .*delete .*run.json and rerun"):
        ResultStore(tmp_path / "eval").open("fp", {"samples": 1}, "")
    (tmp_path / "eval" / "run.json").unlink()  # what the message says to do
    again = ResultStore(tmp_path / "eval")
    again.open("fp", {"samples": 1}, "")
    assert list(again.records) == [("a", 0)]
    again.close()

    from leanrl.train.common import TrainConfig

    run = RunDir(tmp_path / "train")
    run.bind_config(TrainConfig())
    (run.path / "config.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(ConfigError, match=r"config.json is damaged .*delete"):
        run.bind_config(TrainConfig())


def test_a_full_disk_is_a_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    # /dev/full answers every write with ENOSPC: a real full disk, as the kernel reports it.
    st = ResultStore(tmp_path)
    st.open("fp", {}, "")
    st.append(_recs("a", 2))
    st.close()
    kept = (tmp_path / "results.jsonl").read_bytes()
    (tmp_path / "results.jsonl").rename(tmp_path / "kept.jsonl")
    (tmp_path / "results.jsonl").symlink_to("/dev/full")
    full = ResultStore(tmp_path)
    full.open("fp", {}, "")
    with pytest.raises(DiskFullError, match=r"no space left .*attempt records .*rerun the same"):
        full.append(_recs("b", 1))
    full.close()
    assert (tmp_path / "kept.jsonl").read_bytes() == kept

    run = RunDir(tmp_path / "train")
    run.log({"step": 1})
    run.metrics_path.unlink()
    run.metrics_path.symlink_to("/dev/full")
    with pytest.raises(DiskFullError, match="a metrics row"):
        run.log({"step": 2})


def test_the_cli_reports_a_full_disk_in_one_line(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leanrl.cli import main

    tasks, out = _tasks(tmp_path), tmp_path / "run"
    argv = ["eval", "--env", "minif2f", "--env.taskset.path", str(tasks), "--out", str(out),
            "--env.runtime.name", "tests._scripted_runtime:ScriptedRuntime",
            "--policy.model", str(tiny_model_dir), "--sampling.max_tokens", "4",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    kept = (out / "results.jsonl").read_bytes()
    (out / "summary.json").unlink()
    (out / "summary.json").symlink_to("/dev/full")  # the disk fills up before the report
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert "no space left on the device" in err and "summary.json" in err
    assert (out / "results.jsonl").read_bytes() == kept
