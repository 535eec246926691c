"""The tests the quick tier (`pytest -m "not slow"`) leaves out: tests/conftest.py marks them."""

# Measured with `pytest -n 2 --durations=250` over the whole suite (torch 2.13.0, 2 cores shared
# at load ~15, so ~10x an idle machine's times): whole files whose tests start processes or sweep
# PyTorch's OpInfo database, and each other test function whose runs took 5 s or more there
# (every parametrization of it). A file or test here that no longer exists fails
# tests/test_docs.py, so the list cannot rot silently.

SLOW_FILES = {
    "test_action.py", "test_any_folder.py", "test_conformance.py", "test_isolation.py", "test_lowprec_ops.py",
    "test_python_versions.py",
    "test_repro.py", "test_seeds.py", "test_trace.py", "test_trace_held.py", "test_trace_record.py",
    "test_triton_op.py",
}
SLOW_TESTS = {
    "test_true_numbers.py": ("test_a_timeout_says_how_far_the_check_got",
                             "test_a_timeout_in_contract_or_layout_says_how_far_it_got"),
    "test_mutant_battery.py": ("test_a_visible_mutant_fails",),  # the sample stays quick
    "test_linear_rows.py": ("test_opinfo_samples_keep_the_contract_s_verdicts_with_the_rows",),
    "test_newuser.py": (
        "test_a_slow_check_piped_says_its_estimate_progress_and_how_far_it_got",
        "test_every_kind_of_reproduce_line_runs_as_printed",
        "test_list_shows_the_estimated_cost",
        "test_the_cli_gives_each_message_from_the_project_folder",
        "test_the_fixtures_reproduce_line_runs_as_printed_from_the_test_folder",
        "test_the_terminal_display_under_a_pseudo_terminal",
    ),
    "test_callcounts.py": (
        "test_a_failing_full_check_confirms_failures_with_few_extra_calls",
        "test_a_wide_zero_second_order_is_coloured_and_a_detached_one_still_fails",
        "test_a_worker_freezes_what_importing_torch_made_and_a_host_with_torch_is_left_alone",
        "test_full_mode_on_an_elementwise_op_needs_a_handful_of_evaluations",
        "test_full_mode_on_linear_64_is_far_below_gradcheck",
        "test_no_default_check_imports_dynamo_or_sympy",
        "test_no_sympy_import_during_a_check",
    ),
    "test_cli.py": (
        "test_bad_input_exits_2",
        "test_bad_targets_exit_2_without_traceback",
        "test_closed_pipe_is_quiet_and_keeps_the_verdict",
        "test_error_in_backward_other_targets_still_run",
        "test_failing_target_exits_1_and_reproduces",
        "test_json_report_alone_on_stdout",
        "test_no_sympy_import_during_a_check",
        "test_nothing_to_check",
        "test_passing_target_exits_0",
        "test_python_dash_m",
        "test_uninferable_inputs_exit_2_with_how_to_pass_them",
        "test_unusable_device_is_a_usage_error",
        "test_wrong_number_of_inputs_exits_2",
    ),
    "test_cli_ci.py": (
        "test_annotations_follow_the_flag_and_the_environment",
        "test_check_without_arguments_runs_the_configured_paths",
        "test_color_flag",
        "test_command_line_targets_and_flags_override_the_config",
        "test_github_annotations_point_at_the_failing_backward",
        "test_json_alone_on_stdout_human_messages_on_stderr",
        "test_json_format_usage_error_leaves_stdout_empty",
        "test_junit_xml_of_specs_with_expected_failures_validates",
        "test_junit_xml_path_from_the_config",
        "test_junit_xml_validates_and_carries_the_plain_report",
        "test_list_shows_targets_and_inputs_without_running_checks",
        "test_quiet_prints_only_failures_and_the_summary",
        "test_terminal_colour_progress_and_no_color",
        "test_verbose_adds_per_check_timing",
    ),
    "test_custom_ops.py": (
        "test_cli_import_list_and_no_vmap_notice",
        "test_op_compiled_is_opcheck_in_gradtool_words",
    ),
    "test_exprs.py": (
        "test_fuzz_compile_raises_only_spec_errors",
    ),
    "test_graph.py": (
        "test_deeper_than_recursion_limit",
        "test_same_op_chain_collapses",
    ),
    "test_html_report.py": (
        "test_cli_writes_page_and_junit_links_it",
        "test_json_report_with_grids_and_reproducers_validates",
        "test_page_has_one_heat_map_per_failing_block",
    ),
    "test_internal_error.py": (
        "test_the_same_target_without_the_bug_passes",
    ),
    "test_json_schema.py": (
        "test_passing_and_failing_reports_validate",
        "test_spec_report_with_xfail_validates",
    ),
    "test_layout.py": (
        "test_no_import_circle",
    ),
    "test_lowprec_kernels.py": (
        "test_a_correct_kernel_passes_at_float32_over_20_seeds",
    ),
    "test_lowprec.py": (
        "test_cli_exit_codes_and_reproduce_flags",
        "test_cli_reference_that_cannot_be_loaded_is_a_usage_error",
        "test_correct_gelu_passes_and_its_broken_twins_fail",
        "test_matmul_twins",
    ),
    "test_measured.py": (
        "test_a_passing_run_costs_what_the_fixed_tolerance_costs",
        "test_a_solver_stopped_at_a_loose_tolerance_is_not_failed_within_gradchecks_tolerance",
        "test_issue_gelu_mistakes_fail_beside_their_correct_twin",
        "test_low_precision_catches_a_0_1_percent_bug_wherever_it_lives",
        "test_one_element_names_that_element",
        "test_the_float64_reference_of_a_low_precision_run_is_judged_by_the_measured_tolerance",
        "test_the_report_says_which_tolerance_judged",
    ),
    "test_numerics.py": (
        "test_flags_that_no_single_element_bears_out_do_not_fail_the_check",
        "test_full_mode_catches_every_seeded_linear_bug",
    ),
    "test_probe.py": (
        "test_double_backward_probe_catches_a_detached_backward",
        "test_localisation_at_100k_elements_finds_the_index",
        "test_no_false_failure_of_double_backward_over_100_seeds",
        "test_no_false_failure_on_correct_functions_over_100_seeds",
        "test_probe_catches_one_wrong_element_and_a_small_scale_in_99_percent_of_seeds",
    ),
    "test_probe_phase.py": (
        "test_a_check_run_alone_sees_the_facts_a_full_run_sees",
    ),
    "test_pytest_gradcheck.py": (
        "test_under_xdist_the_controller_sums_its_workers_calls",
    ),
    "test_pytest_plugin.py": (
        "test_gradtool_trace_fixture_and_marker_fail_the_test_that_calls_a_wrong_function",
        "test_xdist_two_workers",
    ),
    "test_readme.py": (
        "test_readme_failure_example_is_the_tools_output",
    ),
    "test_reproduce.py": (
        "test_replaying_the_reproduce_line_of_a_failing_case_gives_the_same_verdict",
    ),
    "test_spec_trust.py": (
        "test_both_opt_ins_run_the_callable",
        "test_existing_refusals_stay",
        "test_file_writing_callables_are_refused_and_write_nothing",
        "test_flag_alone_is_not_enough",
        "test_functions_modules_and_torch_operators_need_no_opt_in",
        "test_spec_opt_in_alone_is_not_enough",
    ),
    "test_specs.py": (
        "test_fuzz_random_yaml_documents",
        "test_fuzz_spec_shaped_documents",
    ),
    "test_surrogates.py": (
        "test_broken_surrogate_twins_fail_naming_the_surrogate",
        "test_the_example_surrogates_pass_end_to_end",
    ),
    "test_user_inputs.py": (
        "test_cli_bad_nested_or_keyword_input_is_exit_2",
        "test_cli_nested_and_keyword_inputs",
        "test_factory_that_raises_or_returns_junk_is_exit_2_and_named",
        "test_inference_tries_a_tuple_where_forward_says_so",
        "test_init_checks_lstmcell_and_multihead_attention",
        "test_init_refuses_non_literals_and_non_module_classes",
        "test_inputs_from_factory_passes_where_random_inputs_fail",
        "test_junit_names_the_path",
        "test_readme_input_examples_run",
        "test_save_inputs_replays_the_same_values",
        "test_spec_factory_that_raises_is_rejected",
        "test_spec_nested_keyword_and_factory",
    ),
    "test_version.py": (
        "test_json_report_carries_the_version",
    ),
    "test_warnings.py": (
        "test_ignore_in_pyproject_and_in_a_spec",
    ),
    "test_wolf.py": (
        "test_one_triangle_symmetric_function_passes_in_its_tangent_space",
    ),
}
