"""What a new user hit, round three (issue 43): the custom-environment walkthrough as written,
progress that moves while tokens are generated (every backend), leftovers swept by any command,
`serve`'s port file, "did you mean" for TOML keys, readable plots, and the small ones (the
Ctrl-C line, start-up imports, Countdown's generate-only summary)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import psutil
import pytest

from leanrl import ConfigError
from leanrl.cli import main
from leanrl.eval import progress as progress_mod
from leanrl.eval.config import EvalConfig
from leanrl.eval.runner import run_eval, run_eval_sync
from leanrl.policy import Completion, Policy, PolicyConfig, SamplingConfig
from tests._scripted_runtime import ScriptedPolicy

REPO = Path(__file__).resolve().parents[1]
LEANRL = Path(sys.executable).with_name("leanrl")
DOC = REPO / "docs" / "custom-environments.md"


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


# -- 1. the custom-environment walkthrough ------------------------------------------------------


def _write_my_pkg(folder: Path) -> None:
    (code,) = [
        b for b in _blocks(DOC.read_text(encoding="utf-8"), "python") if "my_pkg/envs.py" in b
    ]
    (folder / "my_pkg").mkdir(parents=True)
    (folder / "my_pkg" / "__init__.py").write_text("")
    (folder / "my_pkg" / "envs.py").write_text(code)


@pytest.mark.slow  # a `leanrl eval` child process with a (tiny) model: a few seconds
def test_the_custom_environment_walkthrough_runs_as_written(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    _write_my_pkg(tmp_path)
    commands = [
        line.strip()
        for b in _blocks(DOC.read_text(encoding="utf-8"), "bash")
        for line in b.splitlines()
        if line.startswith("leanrl eval --env my_pkg.envs:MyEnvironment")
    ]
    (command,) = [c for c in commands if "--generate-only" in c]  # the one that needs no Lean
    argv = command.replace("MODEL", str(tiny_model_dir)).split()
    argv[0] = str(LEANRL)
    # the only addition: a short completion, so that the tiny model is quick about it
    proc = subprocess.run(
        [*argv, "--sampling.max-tokens", "8"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 completions" in proc.stdout, proc.stdout
    (completions,) = tmp_path.glob("runs/*/completions.jsonl")
    assert completions.is_file()


def test_an_import_path_from_elsewhere_says_where_to_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl.registry import resolve

    _write_my_pkg(tmp_path / "project")
    monkeypatch.chdir(tmp_path)  # not the folder that holds my_pkg
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    with pytest.raises(ConfigError, match=r"run it from the folder that holds my_pkg/") as e:
        resolve("environments", "my_pkg.envs:MyEnvironment")
    assert "PYTHONPATH" in str(e.value) and "pip install -e" in str(e.value)
    monkeypatch.chdir(tmp_path / "project")  # from there it is found, as `python -m` would
    cls = resolve("environments", "my_pkg.envs:MyEnvironment")
    assert cls.__name__ == "MyEnvironment"
    assert sys.path[-1] == str(tmp_path / "project")  # last: it shadows no installed package
    for name in [m for m in sys.modules if m == "my_pkg" or m.startswith("my_pkg.")]:
        del sys.modules[name]


# -- 2. progress that moves while tokens are generated ------------------------------------------


def _countdown(tmp_path: Path, model: Path | str, **kw: Any) -> EvalConfig:
    return EvalConfig.model_validate(
        {
            "env": {"id": "countdown", "taskset": {"limit": 2}},
            "policy": {"model": str(model), "device": "cpu"},
            "out": str(tmp_path / "ev"),
            **kw,
        }
    )


def _progress_lines(err: str) -> list[tuple[int, int]]:
    """(attempts done, tokens shown) of each plain progress line."""
    out = []
    for line in err.splitlines():
        m = re.search(r"eval: (\d+)/\d+ attempts, (?:([\d,]+) tok at [\d.]+ tok/s, )?", line)
        if m:
            out.append((int(m.group(1)), int((m.group(2) or "0").replace(",", ""))))
    return out


@pytest.mark.parametrize("temperature", [0.0, 0.7], ids=["streamed", "chunked"])
def test_a_hf_eval_shows_tokens_before_any_attempt_ends(
    tmp_path: Path,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    temperature: float,
) -> None:
    # One chunk of 2 tasks whose completions all end at max_tokens, together: the attempt count
    # stays at 0 until the very end. Tokens must show meanwhile, on the continuous-batching
    # stream (greedy) and on static generate (sampled) alike.
    monkeypatch.setattr(progress_mod.Progress, "line_every_s", 0.0)
    cfg = _countdown(
        tmp_path,
        tiny_model_dir,
        sampling={"max_tokens": 12, "temperature": temperature, "stop": []},
    )
    summary = run_eval_sync(cfg)
    lines = _progress_lines(capsys.readouterr().err)
    assert any(done == 0 and tokens > 0 for done, tokens in lines), lines
    assert lines[-1] == (2, summary["results"]["generated_tokens"]), lines


def test_the_last_progress_line_is_written_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _countdown(tmp_path, "scripted", samples=2)
    run_eval_sync(cfg, policy=ScriptedPolicy(["<answer>1</answer>"]))
    err = capsys.readouterr().err
    assert "\r" not in err  # no terminal: plain lines, not a bar's redraws
    assert sum("eval: 4/4 attempts" in line for line in err.splitlines()) == 1, err


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_log_lines_stay_out_of_the_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    handler = logging.StreamHandler(tty)
    leanrl_log = logging.getLogger("leanrl")
    leanrl_log.addHandler(handler)
    level = leanrl_log.level
    leanrl_log.setLevel(logging.INFO)

    class Chatty(ScriptedPolicy):
        async def generate(self, prompts: Any, sampling: Any) -> Any:
            logging.getLogger("leanrl.test").info("a log line while the bar is up")
            return await super().generate(prompts, sampling)

    try:
        cfg = _countdown(tmp_path, "scripted", stream=True)
        run_eval_sync(cfg, policy=Chatty(["<answer>1</answer>"]))
    finally:
        leanrl_log.removeHandler(handler)
        leanrl_log.setLevel(level)
    screen = tty.getvalue()
    assert "eval.stream" in screen and "a log line while the bar is up" in screen
    for line in re.split(r"[\r\n]", screen):
        if "eval.stream" in line or "while the bar is up" in line:
            assert "eval:" not in line and "|" not in line, repr(line)
    assert "tok at" in screen or "att/s" in screen


class _Waiting(Policy):
    """Generates nothing until the progress display has ticked (a server that has not
    answered yet): the display must still say something."""

    name = "waiting"

    def __init__(self, ticks: list[int]) -> None:
        super().__init__(PolicyConfig(model="waiting"))
        self.ticks = ticks

    async def generate(self, prompts: Any, sampling: SamplingConfig) -> list[list[Completion]]:
        for _ in range(2000):  # ~10 s at most: a display that never ticks fails, not hangs
            if self.ticks:
                break
            await asyncio.sleep(0.005)
        return [[Completion(text="<answer>1</answer>")] * sampling.n for _ in prompts]


def test_progress_ticks_while_a_backend_says_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks: list[int] = []
    real_tick = progress_mod.Progress.tick

    def tick(self: Any) -> None:
        real_tick(self)
        ticks.append(1)

    monkeypatch.setattr(progress_mod.Progress, "tick", tick)
    monkeypatch.setattr(progress_mod.Progress, "tick_s", 0.01)
    monkeypatch.setattr(progress_mod.Progress, "line_every_s", 0.0)
    run_eval_sync(_countdown(tmp_path, "waiting", stream=False), policy=_Waiting(ticks))
    lines = _progress_lines(capsys.readouterr().err)
    # the line at the start, at least one from a tick while nothing was generated, the last
    assert len([x for x in lines if x == (0, 0)]) >= 2 and lines[-1][0] == 2, lines


async def test_the_openai_backend_reports_tokens_per_response() -> None:
    from test_policy_openai import Server

    from leanrl.policies import make_policy

    with Server(fail=0) as server:
        p = make_policy(PolicyConfig(model="m", backend="openai", base_url=server.url))
        reports: list[int] = []
        p.on_tokens = reports.append
        out = await p.generate(["a", "b", "c"], SamplingConfig(n=2, max_tokens=5))
        await p.close()
    # one report per response as it arrives (3 prompts), each its 2 choices' logprob counts
    assert reports == [4, 4, 4]
    assert sum(reports) == sum(len(c.logprobs or ()) for row in out for c in row)


async def test_the_vllm_stream_reports_tokens_per_engine_step() -> None:
    from leanrl.policies.vllm import stream_llm
    from leanrl.policy import StreamRequest
    from tests._vllm_engine_standin import Engine, Params

    llm = types.SimpleNamespace(llm_engine=Engine(step_s=0.0))
    requests = [
        StreamRequest(key=k, prompt=f"p{k}", sampling=SamplingConfig(n=2)) for k in range(3)
    ]
    reports: list[int] = []
    got = [
        c
        async for c in stream_llm(
            llm, requests, [r.prompt for r in requests], lambda s: Params(**s.model_dump()),
            reports.append,
        )
    ]  # fmt: skip
    assert len(got) == 6
    assert len(reports) == 3 and sum(reports) == sum(len(c.completion.token_ids) for c in got)


async def test_a_held_out_eval_reports_progress_as_labelled_log_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress_mod.Progress, "line_every_s", 0.0)
    cfg = _countdown(tmp_path, "scripted", progress=False)  # as the trainers' evaluations
    with caplog.at_level(logging.INFO, logger="leanrl.eval"):
        await run_eval(
            cfg,
            policy=ScriptedPolicy(["<answer>1</answer>"]),
            progress_label="held-out eval at step 4",
        )
    said = [r.getMessage() for r in caplog.records if r.name == "leanrl.eval"]
    assert said[0].startswith("held-out eval at step 4: 0/2 attempts"), said
    assert said[-1].startswith("held-out eval at step 4: 2/2 attempts"), said


def test_compare_labels_each_runs_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    from leanrl.compare import _labelled

    with caplog.at_level(logging.INFO):
        with _labelled("GRPO seed 1"):
            logging.getLogger("leanrl.train.grpo").info("step %d: reward %.2f", 3, 0.5)
            logging.getLogger("other.library").info("not ours")
        logging.getLogger("leanrl.train.grpo").info("after the run")
    said = [r.getMessage() for r in caplog.records]
    assert said == ["GRPO seed 1: step 3: reward 0.50", "not ours", "after the run"]


def test_compare_says_which_run_starts_and_what_its_held_out_set_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leanrl import compare

    seen: list[tuple[str, str]] = []

    def train(method: str, cfg: Any) -> None:
        logging.getLogger("leanrl.train").info("iteration 1")
        seen.append((method, str(cfg.out)))
        raise KeyboardInterrupt  # enough: the lines before training are what is checked

    monkeypatch.setattr(compare, "_train", train)
    cfg = compare.CompareConfig(budget={"tokens": 10}, eval_limit=30, out=tmp_path / "c")
    with caplog.at_level(logging.INFO), pytest.raises(KeyboardInterrupt):
        compare._compare_runs(cfg)
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("compare: ES seed 0 in ") and "30 tasks of countdown" in said[0]
    assert said[1] == "ES seed 0: iteration 1"


# -- 3. leftovers: any command sweeps leanrl's stale temporary folders -------------------------


def test_any_command_sweeps_stale_temporary_folders(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"leanrl-oneshot-{dead.pid}-abc"
    stale.mkdir()
    (stale / "owner.json").write_text(json.dumps({"pid": dead.pid, "created": 1.0, "groups": []}))
    me = psutil.Process()
    live = tmp_path / f"leanrl-pool-{me.pid}-def"
    live.mkdir()
    (live / "owner.json").write_text(json.dumps({"pid": me.pid, "created": me.create_time()}))
    other = tmp_path / "someone-elses"
    other.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [str(LEANRL), "models", "list"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists()  # its owner is dead: swept, although no Lean pool started
    assert live.is_dir() and other.is_dir()  # a live owner's folder and others' are left alone


# -- 4. serve: no port file for a service that did not start ------------------------------------


def test_serve_without_lean_leaves_no_port_file(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    env = {
        **os.environ,
        "PATH": str(tmp_path / "no-lean-bin"),
        "LEANRL_CACHE": str(tmp_path / "cache"),
    }
    env.pop("LEANRL_LEAN_PROJECT", None)
    proc = subprocess.run(
        [sys.executable, "-m", "leanrl.cli", "serve", "--port", "0", "--port-file", str(port_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Lean" in proc.stderr
    assert not port_file.exists() and not port_file.with_suffix(".tmp").exists()


def test_a_served_port_file_goes_when_the_service_stops(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    cmd = [
        sys.executable, "-m", "leanrl.cli", "serve", "--port", "0", "--port-file", str(port_file),
        "--runtime.name", "_echo_runtime:EchoRuntime",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if port_file.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert port_file.exists(), proc.stderr.read() if proc.stderr else ""
        assert int(port_file.read_text()) > 0
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not port_file.exists()


# -- 5. a wrong key in a TOML file --------------------------------------------------------------


def test_a_misspelt_toml_key_gets_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "eval.toml"
    toml.write_text('limt = 3\n[env.taskset]\nsplt = "test"\n[sampling]\ntemprature = 0.5\n')
    assert main(["eval", "--config", str(toml), "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert f"invalid config {toml}" in err
    assert "limt: no such option (did you mean limit?)" in err
    assert "env.taskset.splt: no such option (did you mean env.taskset.split?)" in err
    assert "sampling.temprature: no such option (did you mean sampling.temperature?)" in err
    assert "Extra inputs" not in err
    toml.write_text("[sampling]\nzzz = 1\n")
    assert main(["eval", "--config", str(toml), "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "sampling.zzz: no such option; the options of [sampling] are: max_tokens, n," in err


# -- 6. docs that quote a run are made from the run -----------------------------------------------


def test_compare_docs_smollm2_figures_are_the_scripts_output_of_the_stored_run() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_compare_doc", DOC.with_name("make_compare_doc.py")
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    data = json.loads(script.DATA.read_text(encoding="utf-8"))
    doc = script.DOC.read_text(encoding="utf-8")
    assert script.block_of(doc) == script.render(data)  # not retyped: the script's own output
    # and the figures in it are the run's: e.g. GRPO's steps and tokens, as its report gave them
    grpo = next(r for r in data["runs"] if r["method"] == "grpo")
    row = f"| grpo | 0 | {grpo['steps']} | {grpo['spent']:.0f} |"
    assert row in script.block_of(doc)
    assert grpo["evals"][0]["step"] == 0 and len(grpo["evals"]) >= 2


# -- 7. plots a person can read -----------------------------------------------------------------


def _texts(ax: Any) -> str:
    return " ".join(t.get_text() for t in ax.texts)


def test_pass_at_k_with_one_sample_is_bars_not_a_dot() -> None:
    import matplotlib.pyplot as plt

    from leanrl.eval.report import pass_at_k_figure

    curve = {"all": {"tasks": 3, "pass@1": 0.0}, "3-numbers": {"tasks": 2, "pass@1": 0.0}}
    fig = pass_at_k_figure(curve, "countdown: m")
    ax = fig.axes[0]
    assert len(ax.patches) == 2 and not ax.get_lines()  # a bar per category
    assert ax.get_ylim() == (0.0, 100.0)  # nothing solved: the whole scale
    assert "no task solved" in _texts(ax)
    plt.close(fig)
    curve = {"all": {"tasks": 4, "pass@1": 0.05, "pass@2": 0.08, "pass@4": 0.12}}
    fig = pass_at_k_figure(curve, "minif2f: m")
    ax = fig.axes[0]
    assert 12.0 < ax.get_ylim()[1] <= 20.0 and ax.get_ylim()[0] == 0.0  # for the data
    assert all(not ln.get_clip_on() for ln in ax.get_lines())  # points on 0 drawn whole
    assert "no task solved" not in _texts(ax)
    plt.close(fig)


def test_countdowns_plot_title_names_it_once(tmp_path: Path) -> None:
    from leanrl.eval.report import plot_title

    cfg = _countdown(tmp_path, "scripted", progress=False)
    summary = run_eval_sync(cfg, policy=ScriptedPolicy(["<answer>1</answer>"]))
    title = plot_title(summary)
    assert title.count("countdown") == 1 and "n = 1 sample per task" in title, title


def test_compare_held_out_panel_with_nothing_solved_says_so() -> None:
    import matplotlib.pyplot as plt

    from leanrl.compare import _figure

    zero = {"acc_x": [0, 4, 8], "acc": [0.0, 0.0, 0.0], "reward_x": [1, 2], "reward": [0.1, 0.3]}
    fig = _figure([{"method": "es", "seed": 0, "curve": zero}], "generated tokens")
    acc, reward = fig.axes
    assert acc.get_ylim() == (0.0, 1.0) and "no run solved a held-out task" in _texts(acc)
    assert reward.get_ylim()[0] == 0.0 and reward.get_ylim()[1] >= 0.3
    plt.close(fig)
    some = {**zero, "acc": [0.0, 0.1, 0.2]}
    fig = _figure([{"method": "grpo", "seed": 0, "curve": some}], "generated tokens")
    assert fig.axes[0].get_ylim()[1] == pytest.approx(0.24) and not fig.axes[0].texts
    plt.close(fig)


# -- 8. the small ones --------------------------------------------------------------------------


def test_ctrl_c_says_that_rerunning_resumes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from leanrl.eval.cli import EvalCommand
    from leanrl.models_cli import ModelsListCommand

    def interrupted(self: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(EvalCommand, "cli_cmd", interrupted)
    monkeypatch.setattr(ModelsListCommand, "cli_cmd", interrupted)
    assert main(["eval", "--env", "countdown", "--model", "m"]) == 130
    assert "run the same command again to resume where it stopped" in capsys.readouterr().err
    assert main(["models", "list"]) == 130
    assert capsys.readouterr().err.strip() == "leanrl: interrupted"  # nothing to resume


def test_the_cli_imports_only_what_the_command_needs() -> None:
    # Outcome, not timing (benchmarks/cli_startup.py measures the time): importing the CLI
    # loads no torch, transformers or httpx, and `leanrl eval --help` imports no other
    # command's module (the trainers').
    code = (
        "import sys, json\n"
        "import leanrl.cli\n"
        "heavy = [m for m in ('torch', 'transformers', 'httpx', 'datasets') if m in sys.modules]\n"
        "leanrl.cli.main(['eval', '--help'])\n"
        "others = sorted(m for m in sys.modules if m.startswith(('leanrl.train', "
        "'leanrl.compare', 'leanrl.service.cli', 'leanrl.lean.commands')))\n"
        "print(json.dumps([heavy, others, 'torch' in sys.modules]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    heavy, others, torch_after_help = json.loads(proc.stdout.strip().splitlines()[-1])
    assert heavy == [] and others == [] and torch_after_help is False, proc.stdout


def test_train_grpo_help_imports_no_http_client() -> None:
    code = (
        "import sys\n"
        "from leanrl.cli import main\n"
        "main(['train', 'grpo', '--help'])\n"
        "print([m for m in ('httpx', 'torch', 'rich') if m in sys.modules])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


_SETUPTOOLS_NOTE = """\
  /tmp/pip-build-env-x/overlay/lib/python3.11/site-packages/setuptools/command/editable_wheel.py:354: BuildBackendWarning: Editable installation.
  !!

          ********************************************************************************
          Please be careful with folders in your working directory with the same
          name as your package as they may take precedence during imports.
          ********************************************************************************

  !!
    with strategy, WheelFile(wheel_path, "w") as wheel_obj:
"""


def test_setup_drops_setuptools_editable_note_and_keeps_the_rest(tmp_path: Path) -> None:
    # The filter .ci/setup.sh runs on pip's stderr, taken from the script itself: what
    # setuptools printed on every run (captured from a real editable install) goes, anything
    # else stays.
    script = (REPO / ".ci" / "setup.sh").read_text(encoding="utf-8")
    (snippet,) = re.findall(r"python - \"\$log\" <<'PY'\n(.*?)\nPY\n", script, flags=re.S)
    log = tmp_path / "pip.log"
    log.write_text("WARNING: a dependency conflict\n" + _SETUPTOOLS_NOTE + "ERROR: x\n")
    proc = subprocess.run(
        [sys.executable, "-c", snippet, str(log)], capture_output=True, text=True, check=True
    )
    assert proc.stderr == "WARNING: a dependency conflict\nERROR: x\n"


async def test_countdowns_generate_only_summary_speaks_of_answers(tmp_path: Path) -> None:
    from leanrl.eval.cli import generate_only_message

    cfg = _countdown(tmp_path, "scripted", samples=2, generate_only=True, progress=False)
    summary = await run_eval(cfg, policy=ScriptedPolicy(["<answer>1 + 2</answer>"]))
    text = generate_only_message(summary, cfg)
    assert text.startswith("4 completions (4 with an answer) in ")
    assert "proof" not in text and "Lean" not in text
    assert "nothing was scored (--generate-only); to score the answers: leanrl verify " in text
