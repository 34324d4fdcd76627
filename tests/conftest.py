"""Shared test set-up: offline hub, one thread, the fixture data, Lean detection, tiny model."""

from __future__ import annotations

import os

# Before anything imports transformers/datasets/torch: no hub calls (they hang ~20 s offline),
# and one thread per process (2-core machines thrash otherwise).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import compileall
import json
import shutil
import sys
from pathlib import Path

from leanrl.lean.trust.containment import isolation_problem

# Where bubblewrap works (CI installs it), every local runtime in the tests runs sandboxed, as
# users' do. Where it does not, the tests run Lean stand-ins without it instead of refusing.
if isolation_problem() is not None:
    os.environ.setdefault("LEANRL_ALLOW_UNSANDBOXED", "1")

import pytest

# Byte code is written even where PYTHONDONTWRITEBYTECODE is set (CI images set it): otherwise
# each pytest worker rewrites and compiles every test file again (5 s of CPU a worker), and the
# suite's hundreds of Python processes compile the leanrl modules they import (pytest_configure
# below compiles those once). The caches are __pycache__ folders, which git ignores.
sys.dont_write_bytecode = False

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("LEANRL_SHARED_DATA", REPO.parent / "shared" / "data"))


def lean_available() -> bool:
    """A real Lean toolchain is reachable (on PATH, or a configured project)."""
    return shutil.which("lean") is not None or bool(os.environ.get("LEANRL_LEAN_PROJECT"))


# -- the slow set: `pytest -m "not slow"` is the fast subset (CONTRIBUTING.md) ---------------------
# With `-n auto` it runs in under 2 minutes on a 2-core machine. Chosen from `pytest --durations=0`
# of the whole suite on such a machine, under load (2026-12-01, 1,336 tests, 32 min): every test
# function whose runs took 1.5 s or more in all (its parameters together), the ones over 1.25 s at
# the top of the fast subset's own `--durations`, and whole files whose tests nearly all do
# (trainers, process pools, servers, launchers); then (2026-12-06, 2,160 tests) the fast subset's
# tests of 2 s or more under `-n auto` on a loaded machine. Tests marked `@pytest.mark.slow` in
# their own file are slow too. A new test that takes more than a second or so belongs here (or
# marked there).

SLOW_MODULES = frozenset(
    {
        "test_checkpoint_safety.py",
        "test_cli.py",
        "test_compare.py",
        "test_countdown.py",
        "test_es_cli.py",
        "test_es_distributed.py",
        "test_es_learning.py",
        "test_es_lora.py",
        "test_es_workers.py",
        "test_eval_cli.py",
        "test_expert_iteration.py",
        "test_grpo_distributed.py",
        "test_grpo_trainer.py",
        "test_hints.py",
        "test_inrun_eval.py",
        "test_launch.py",
        "test_lora.py",
        "test_pool_healing.py",
        "test_service_connections.py",
        "test_sft.py",
        "test_vllm_server.py",
        "test_warm_pool.py",
    }
)
"""Files whose every test is slow."""

SLOW_TESTS: dict[str, frozenset[str]] = {
    module: frozenset(names)
    for module, names in {
        "test_bad_input_files.py": [
            "test_an_empty_k_on_the_command_line_says_what_to_pass",
            "test_leanrl_verify_reports_a_non_utf8_proofs_file_in_one_line",
        ],
        "test_cli_ergonomics.py": [
            "test_a_value_given_to_a_switch_says_how_to_write_it",
            "test_help_is_short_and_help_all_is_complete",
            "test_unknown_command_suggests_the_close_one",
            "test_unknown_flag_suggests_the_close_one",
        ],
        "test_costs.py": ["test_es_rows_and_summary_carry_costs"],
        "test_curriculum.py": ["test_grpo_with_a_curriculum_logs_pools_and_resumes_exactly"],
        "test_distill_onpolicy.py": ["test_the_teachers_revision_is_recorded_and_a_change_refused"],
        "test_docker.py": ["test_the_dockerfile_copies_exactly_what_builds_leanrl"],
        "test_docs.py": ["test_no_merge_conflict_markers"],
        "test_es_lowrank_vllm.py": [
            "test_scorer_matches_the_inprocess_lowrank_path",
            "test_vllm_lowrank_run_equals_the_inprocess_run",
        ],
        "test_es_pipeline.py": ["test_trainer_pipelined_matches_serial_and_logs_idle"],
        "test_es_population.py": ["test_trainer_batched_matches_one_member_per_call"],
        "test_es_replay.py": [
            "test_bf16_checkpoint_keeps_exact_master",
            "test_replay_is_bitwise_identical",
            "test_resume_after_kill_loses_nothing",
        ],
        "test_es_trainer.py": ["test_master_is_written_before_the_checkpoint_is_published"],
        "test_eval_infra_and_offline.py": ["test_verify_exits_non_zero_when_a_verdict_is_infra"],
        "test_eval_runner.py": [
            "test_generation_and_verification_overlap",
            "test_resume_after_interruption_redoes_nothing",
        ],
        "test_extras.py": [
            "test_a_trainer_with_in_run_eval_finishes_without_matplotlib",
            "test_the_core_runs_without_any_optional_package",
        ],
        "test_faults_round3_small.py": [
            "test_sft_on_a_full_disk_names_the_checkpoint_and_a_rerun_finishes",
            "test_verify_killed_midway_continues_where_it_stopped",
            "test_verify_leaves_no_unknown_child_warning",
        ],
        "test_faults_round3_train.py": [
            "test_a_finished_sft_run_in_epochs_reruns_to_nothing",
            "test_a_finished_sft_run_killed_after_its_last_checkpoint_reruns_to_nothing",
            "test_expert_iteration_publishes_a_round_whose_sft_finished_before_a_kill",
            "test_sft_writes_checksums_and_quarantines_a_flipped_checkpoint",
        ],
        "test_grpo_harnesses.py": ["test_grpo_steps_through_builtin_harness"],
        "test_grpo_overlap.py": ["test_budget_stops_grpo_early"],
        "test_grpo_overlap_default.py": [
            "test_auto_on_hf_is_the_synchronous_run_and_old_folders_resume",
        ],
        "test_grpo_replay.py": ["test_a_resumed_replay_run_builds_the_same_batch"],
        "test_grpo_run.py": [
            "test_all_equal_groups_are_dropped_or_refilled",
            "test_async_never_trains_on_batches_staler_than_the_bound",
        ],
        "test_grpo_speed_pipeline.py": [
            "test_an_async_hf_run_repeats_exactly",
            "test_sigkill_of_an_async_run_resumes",
        ],
        "test_harness_external.py": [
            "test_a_crash_costs_its_episode_only",
            "test_a_failing_policy_fails_the_run_not_just_the_episodes",
            "test_a_hanging_program_and_its_children_are_killed",
            "test_an_agent_program_solves_through_the_endpoint",
            "test_stdout_is_read_when_nothing_is_submitted_and_streams_work",
            "test_turn_budget_refuses_further_requests",
        ],
        "test_harness_self_correction.py": ["test_grpo_trains_on_self_correction_rollouts"],
        "test_harness_tactic_loop.py": ["test_tactics_are_prescanned_under_the_taskset_rules"],
        "test_harness_tool_use.py": ["test_grpo_trains_on_tool_rollouts"],
        "test_infra_training.py": ["test_grpo_leaves_infra_attempts_out_of_groups_and_rewards"],
        "test_install_identity.py": ["test_a_foreign_leanrl_distribution_is_named_with_the_fix"],
        "test_judge_limits.py": [
            "test_a_judge_killed_from_outside_mid_check_is_not_the_attempts_doing",
            "test_an_attempt_that_stalls_its_judge_gets_judge_limit_at_the_wall_clock_limit",
        ],
        "test_lean_project.py": [
            "test_doctor_reports_everything_missing_with_fixes",
            "test_setup_without_elan_fails_fast_with_the_fix",
        ],
        "test_local_runtime.py": [
            "test_check_sync_from_plain_code",
            "test_tactic_session",
            "test_verify_cli",
        ],
        "test_log_recovery.py": ["test_the_cli_reports_a_full_disk_in_one_line"],
        "test_modal.py": ["test_the_service_needs_no_heavy_packages"],
        "test_policy_hf.py": [
            "test_generation_runs_off_the_event_loop",
            "test_stop_strings_cut_text_and_tokens",
        ],
        "test_policy_openai.py": [
            "test_a_200_that_is_not_json_is_retried_then_reported",
            "test_gives_up_after_max_retries_and_on_client_errors",
        ],
        "test_pool.py": [
            "test_crash_garbage_and_memory_each_cost_one_attempt",
            "test_hang_costs_one_attempt_and_the_spare_is_already_warm",
            "test_recycle_after_n_attempts",
            "test_a_lean_process_killed_from_outside_is_not_the_attempts_crash",
        ],
        "test_prescan_hostile.py": [
            "test_comments_kept_or_not_give_the_same_code",
            "test_deep_nesting_is_judged_never_raised",
            "test_ten_thousand_hostile_texts_never_raise",
        ],
        "test_service.py": [
            "test_client_retry_after_lost_answer_does_not_check_twice",
            "test_hanging_backend_gets_504_and_the_service_keeps_serving",
            "test_leanrl_serve_command_runs_and_stops_cleanly",
            "test_serve_refuses_public_bind_without_token",
            "test_serve_reports_a_runtime_that_cannot_start_cleanly",
            "test_unix_socket_transport_and_container_healthcheck",
        ],
        "test_service_hardening.py": [
            "test_requests_without_a_key_are_not_retried_after_being_sent",
        ],
        "test_service_trust.py": [
            "test_the_unix_socket_is_private_unless_a_token_guards_it",
            "test_without_a_token_hostile_headers_and_statements_are_refused",
        ],
        "test_session_starvation.py": [
            "test_sessions_outlive_connections_the_service_closes_and_clients_that_come_back",
        ],
        "test_sft_multiturn.py": ["test_sft_trains_whole_episodes_found_beside_the_proofs"],
        "test_trl_names.py": ["test_the_cli_names_leanrls_flag_for_a_trl_flag"],
        "test_trust_lexer.py": ["test_hostile_nesting_is_an_error_not_a_crash"],
        "test_trust_processes.py": [
            "test_a_judge_that_hangs_costs_one_attempt",
            "test_kill_9_of_the_owner_kills_busy_lean_processes_and_the_next_start_cleans_up",
            "test_oneshot_kills_what_the_attempt_left_running_before_the_check",
        ],
    }.items()
}
"""Single slow tests, by file: a test function's name (all its parameters), or one parametrized
case (``test_name[param]``)."""


def is_slow(item: pytest.Item) -> bool:
    """Whether ``item`` is in the slow set above."""
    module = item.path.name
    if module in SLOW_MODULES:
        return True
    names = SLOW_TESTS.get(module, frozenset())
    return item.name in names or getattr(item, "originalname", item.name) in names


# -- order: the longest files first -----------------------------------------------------------------
# The README's command runs the suite on every core (pytest-xdist, `-n auto`) with whole files to a
# worker (`--dist loadfile`, pyproject.toml): each worker takes the next file when it is done with
# one. Starting with the longest files leaves no worker alone with a long one at the end while the
# others idle. Heaviest first: seconds per file from `pytest -n 2 --durations=0` on the 2-core
# machine (2026-12-06); files not listed follow in the usual order. A new file of a minute or more
# belongs here.

RUN_FIRST = (
    "test_fault_soak.py",  # 75 s
    "test_real_model.py",  # 73
    "test_launch.py",  # 69
    "test_launch_faults.py",  # 66
    "test_checkpoint_prune.py",  # 52
    "test_vllm_server.py",  # 46
    "test_grpo_distributed.py",  # 39
    "test_es_workers.py",  # 38
    "test_eval_cli.py",  # 35
    "test_fault_soak_phases.py",  # 31
    "test_examples.py",  # 29
    "test_run_locks.py",  # 27
    "test_warm_pool.py",  # 26
    "test_grpo_trainer.py",  # 22
    "test_countdown.py",  # 19
    "test_harness_external.py",  # 17
    "test_pool.py",  # 17
    "test_new_user_round3.py",  # 16
    "test_grpo_speed_pipeline.py",  # 16
    "test_lora.py",  # 16
)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once, in the first process (xdist's workers follow)
        for folder in ("leanrl", "environments", "harnesses", "runtimes", "tests", "benchmarks"):
            compileall.compile_dir(REPO / folder, quiet=1, workers=1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores this process may use, at most 8. A third of
    the suite's test time is waiting (process starts, kills, REPL starts, timeouts), which the
    spare worker fills. Measured on the 2-core machine (2026-12-06): 9 min 22 s with 3 workers,
    10 min 28 s with 2 (both near quiet); with other work loading it, 12.2 and 12.0 min."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min((cores or 1) + 1, 8)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = {name: k for k, name in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: files stay whole
    skip_lean = pytest.mark.skip(
        reason="needs a real Lean toolchain: `lean` is not on PATH and LEANRL_LEAN_PROJECT is unset"
    )
    gpu = False
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        pass
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    skip_modal = pytest.mark.skip(
        reason="needs Modal credentials and network (set LEANRL_TEST_MODAL=1 to run)"
    )
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)
        if "lean" in item.keywords and not lean_available():
            item.add_marker(skip_lean)
        if "gpu" in item.keywords and not gpu:
            item.add_marker(skip_gpu)
        if "modal" in item.keywords and not os.environ.get("LEANRL_TEST_MODAL"):
            item.add_marker(skip_modal)


FIXTURE_DATA = REPO / "tests" / "fixtures" / "data"


@pytest.fixture(scope="session")
def bench_data() -> Path:
    """The tests' own benchmark excerpts (a few rows of each file, a few REPL transcripts)."""
    return FIXTURE_DATA


@pytest.fixture(scope="session")
def data_roots() -> list[Path]:
    """Folders to run whole-data checks over: the fixtures, plus the full benchmark data when it
    is there (``../shared/data`` or ``LEANRL_SHARED_DATA``); without it the checks still run, on
    the fixtures alone."""
    roots = [FIXTURE_DATA]
    if (SHARED_DATA / "minif2f.jsonl").is_file():
        roots.append(SHARED_DATA)
    return roots


def tiny_model_texts(data: Path = FIXTURE_DATA) -> list[str]:
    """What the tiny test tokenizer is trained on: Lean statements and the usual tactics."""
    texts = []
    for line in (data / "minif2f.jsonl").open(encoding="utf-8"):
        row = json.loads(line)
        texts.append(row["header"] + row["formal_statement"] + "\n  nlinarith [sq_nonneg x]\n")
    texts += ["```lean4\n", "```", "Complete the following Lean 4 code:", "omega", "simp", "rfl"]
    return texts


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama model + a BPE tokenizer trained here on fixture text (no download)."""
    from leanrl.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), tiny_model_texts())


TOY_TASKS = Path(__file__).parent / "fixtures" / "toy_tasks.jsonl"


@pytest.fixture(scope="session")
def toy_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama model + a BPE tokenizer trained on the toy tasks (tests/fixtures; no
    shared data, no download). ``omega`` is one token of its vocabulary."""
    from leanrl.testing import make_tiny_model

    texts = []
    for line in TOY_TASKS.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        texts += [row["formal_statement"] + "\n  omega\n```", row["informal_statement"]]
    texts += ["Complete the following Lean 4 code:\n\n```lean4\n", "omega", "simp", "rfl"] * 4
    return make_tiny_model(tmp_path_factory.mktemp("toy-model"), texts, vocab_size=320)


@pytest.fixture(scope="session")
def own_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama + BPE tokenizer trained on a few lines kept here (no shared data)."""
    from leanrl.testing import make_tiny_model

    texts = [f"theorem t{i} : {i} + {i} = {2 * i} := by\n  omega\n" for i in range(40)]
    texts += ["0123456789 " * 8, "simp rfl norm_num linarith", "```lean4\n```"]
    return make_tiny_model(tmp_path_factory.mktemp("own-tiny-model"), texts)


@pytest.fixture
def no_lean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This machine without Lean: no configured project, none made by `leanrl setup`, and no
    `lean` or `repl` on PATH."""
    monkeypatch.delenv("LEANRL_LEAN_PROJECT", raising=False)
    monkeypatch.setenv("LEANRL_CACHE", str(tmp_path / "no-lean-cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-lean-bin"))
