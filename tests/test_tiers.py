"""The default tier runs every capability end to end: one named test per capability is never left to ``-m slow``.

The README's test command leaves out the slow tier (``pytest.mark.slow``): further real measurements of what
the default tier already runs end to end once (other budgets, shapes, datasets, worker kinds), and bounds whose
seconds are the behaviour. This file names, for each capability, the test that runs it for real in the default
tier; a test here fails when that test is renamed, removed or marked slow (the whole function, the module, or
every one of its parameters), so that moving tests to the slow tier cannot leave a capability untested by
default. Read from the test files' source (``ast``), not by importing them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

#: capability -> the default tier's end-to-end test of it (``path::function``, relative to tests/)
END_TO_END = {
    "advise on a bundled pipeline from the CLI, with its report": "test_gallery.py::test_placer_advise_cli_writes_a_report",
    "advise in a script: plan, run, baselines, the absent GPU planned for":
        "test_advisor.py::test_advise_runs_plan_and_baselines_and_plans_for_the_absent_gpu",
    "profile every stage on every device": "profile/test_profile.py::test_profile_measures_every_stage_on_every_device",
    "plan from the CLI": "optimize/test_optimize_cli.py::"
                         "test_a_large_plan_prints_one_plain_line_per_stage_with_its_device_and_reason",
    "the heuristic planner's plans": "optimize/test_optimize.py::"
                                     "test_heuristic_plans_are_feasible_and_predicted_consistently",
    "plans keep their invariants": "optimize/test_plan_invariants.py::test_bundled_tables_keep_every_invariant",
    "run from the CLI on the simulated device": "cli/test_cli_run.py::test_simulated_device_gives_the_same_digest",
    "random DAGs give the same outputs on every placement":
        "test_same_answer.py::test_every_placement_of_a_random_dag_gives_the_same_outputs",
    "numba.cuda kernels (CUDA simulator)": "executor/test_executor.py::test_numba_cuda_kernel_stage_matches_njit_stage",
    "a new device kind": "test_devices_kind.py::test_a_new_kind_is_profiled_planned_run_and_reported",
    "check against a baseline": "test_check.py::test_an_advise_save_folder_is_a_baseline",
    "describe a machine and plan for it": "target/test_target.py::test_describe_writes_a_target_that_plans_anywhere",
    "describe a GPU that is not the reference":
        "target/test_describe_other_gpu.py::test_describe_gpu_on_a_fake_l4_does_not_report_the_h200s_error",
    "precision measured and refused": "profile/test_precision_accuracy.py::"
                                      "test_the_plan_refuses_bf16_to_the_summing_stage_and_says_why",
    "a dask cluster: plan and run there": "test_cluster_plan.py::test_run_without_a_placement_plans_for_the_cluster",
    "a stage timeout on a cluster": "test_hostile_cluster.py::"
                                    "test_stage_timeout_stops_the_stage_names_it_and_keeps_finished_outputs",
    "a stage timeout here": "test_hostile_timeout.py::test_a_stage_stuck_in_python_code_is_stopped_not_just_left",
    "a stream's stage timeout": "test_hostile_timeout.py::"
                                "test_a_stream_stage_stuck_in_one_call_fails_the_stream_at_the_timeout_naming_it",
    "a broken profile cache": "test_hostile_cache.py::test_a_broken_cache_file_is_remeasured_with_one_warning_naming_it",
    "a pipeline recorded in a script": "test_inscript.py::test_a_pipeline_built_in_the_script_is_recorded_at_the_size_it_ran",
    "the README's quickstart": "test_examples.py::test_quickstart_places_every_stage_on_a_device_of_this_machine",
    "the HTML report in a browser": "report/test_browser.py::test_report_renders_in_chromium_without_errors",
    "a trace of a run": "test_trace.py::test_a_failed_run_traces_the_stages_up_to_the_failure",
    "streams: every placement and worker count":
        "stream/test_stream_gallery.py::test_every_placement_and_worker_count_gives_the_sequential_answer",
    "streams: process workers": "stream/test_stream_workers.py::"
                                "test_process_workers_give_the_sequential_runs_outputs_and_run_in_other_processes",
    "streams: Ctrl-C": "stream/test_stream_workers.py::test_ctrl_c_stops_placer_run_promptly_with_one_line_and_no_orphans",
    "streams: plan": "stream/test_stream_plan.py::test_best_placement_plans_a_stream_and_returns_its_settings",
    "streams: advise, verify and report": "test_advise_stream.py::test_advise_plans_runs_and_reports_a_stream",
    "streams: plan for a target": "stream/test_stream_target.py::test_a_bundled_stream_planned_for_the_h200_from_here",
    "streams: persistent workers": "stream/test_stream_persistent.py::"
                                   "test_the_profile_finds_whether_the_epochs_read_the_same_dataset",
    "the drop-in: advice and the advised loader's batches":
        "stream/test_stream_dropin.py::test_the_tuned_loader_yields_the_same_batches_in_order_with_a_seeded_shuffle",
    "the drop-in: fresh processes": "stream/test_dropin_fresh.py::"
                                    "test_the_runs_are_fresh_by_default_unless_placer_fresh_runs_is_0",
    "the drop-in: datasets holding open handles":
        "stream/test_fresh_reopen.py::test_a_dataset_holding_open_handles_is_measured_in_fresh_processes",
    "the drop-in: the process put back": "stream/test_dropin_keeps_the_process.py::"
                                         "test_requires_grad_grads_modes_and_dataset_attributes_are_put_back",
    "the drop-in: a cache inside the Dataset": "stream/test_dataset_cache.py::"
                                               "test_a_dominant_deterministic_decode_is_offered_with_its_gain",
    "caches by argument, whatever the key's layout":
        "stream/test_cache_shapes.py::test_a_decode_inside_an_epoch_seeded_key_is_cached_by_its_own_argument",
    "caches inside a ConcatDataset": "stream/test_cache_shapes.py::"
                                     "test_a_concatenation_is_searched_in_its_datasets_and_cached_in_copies_of_them",
    "caches through a batched __getitems__": "stream/test_cache_shapes.py::"
                                             "test_a_batched_getitems_is_fetched_as_the_loader_fetches_and_its_decode_cached",
    "the drop-in: memory per setting": "stream/test_dropin_memory.py::"
                                       "test_a_setting_over_the_memory_budget_is_not_recommended_and_the_advice_says_why",
    "the drop-in: slow samples and in_order": "stream/test_dropin_reorder.py::"
                                              "test_without_permission_in_order_false_is_not_recommended_and_its_gain_is_said",
    "the drop-in: threads inside workers": "stream/test_dropin_worker_threads.py::"
                                           "test_one_thread_per_worker_is_recommended_iff_its_rounds_beat_the_settings",
    "the plain scripts' batches": "test_plain_scripts.py::test_digest_does_not_depend_on_loader_settings",
    "placer tune: a setting applied to an unchanged script":
        "tune/test_tune.py::test_an_applied_run_reads_the_batches_the_script_reads_as_written",
    "placer tune: a script that never iterates a loader":
        "tune/test_tune.py::test_a_script_that_never_iterates_a_loader_is_refused_naming_the_loaders_it_built",
    "placer tune: no process left behind": "tune/test_tune.py::test_a_stopped_trial_leaves_no_process_behind",
}


def _is_slow(node: ast.expr) -> bool:
    """Whether a decorator or a ``marks=`` value is ``pytest.mark.slow`` (or a list holding it)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_slow(e) for e in node.elts)
    return ast.unparse(node) == "pytest.mark.slow"


def _params_all_slow(deco: ast.expr) -> bool:
    """Whether a ``parametrize`` decorator marks every one of its values slow."""
    if not (isinstance(deco, ast.Call) and ast.unparse(deco.func).endswith("mark.parametrize") and len(deco.args) > 1):
        return False
    values = deco.args[1]
    if not isinstance(values, (ast.List, ast.Tuple)) or not values.elts:
        return False
    return all(isinstance(v, ast.Call) and ast.unparse(v.func) == "pytest.param"
               and any(k.arg == "marks" and _is_slow(k.value) for k in v.keywords) for v in values.elts)


def _default_tier(path: Path, name: str) -> str | None:
    """None when ``name`` is a test function of ``path`` that runs in the default tier, else why not."""
    if not path.exists():
        return f"{path} does not exist"
    tree = ast.parse(path.read_text())
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in stmt.targets) \
                and _is_slow(stmt.value):
            return f"{path.name} marks every test slow (pytestmark)"
    found = [s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == name]
    if not found:
        return f"{path.name} has no test {name}"
    for deco in found[0].decorator_list:
        if _is_slow(deco):
            return f"{name} is marked slow"
        if _params_all_slow(deco):
            return f"every parameter of {name} is marked slow"
    return None


@pytest.mark.parametrize("capability", sorted(END_TO_END))
def test_each_capability_has_an_end_to_end_test_in_the_default_tier(capability):
    where, name = END_TO_END[capability].split("::")
    assert _default_tier(TESTS / where, name) is None, (capability, _default_tier(TESTS / where, name))


def test_the_check_sees_each_way_a_test_leaves_the_default_tier(tmp_path):
    f = tmp_path / "test_x.py"
    f.write_text("import pytest\n\n"
                 "@pytest.mark.slow\ndef test_marked():\n    pass\n\n"
                 "@pytest.mark.parametrize('k', [pytest.param(1, marks=pytest.mark.slow), "
                 "pytest.param(2, marks=[pytest.mark.slow])])\ndef test_every_param():\n    pass\n\n"
                 "@pytest.mark.parametrize('k', [pytest.param(1, marks=pytest.mark.slow), 2])\n"
                 "def test_one_param_left(k):\n    pass\n")
    assert "marked slow" in _default_tier(f, "test_marked")
    assert "every parameter" in _default_tier(f, "test_every_param")
    assert _default_tier(f, "test_one_param_left") is None
    assert "no test" in _default_tier(f, "test_gone")
    f.write_text("import pytest\npytestmark = pytest.mark.slow\n\ndef test_a():\n    pass\n")
    assert "pytestmark" in _default_tier(f, "test_a")
