"""Every test of the reference's own suite (unit-scaling 0.3.5, ``unit_scaling/tests/``), and where it stands here.

``REFERENCE_TESTS`` lists each test function of the reference, by file. A test of a file in ``OUTSIDE`` is
not translated (the reason is given per file); one in ``NO_COUNTERPART`` tests an API this library does
not have (the reason is given per test); every other one is translated to a test of the same name in
``test_reference_own_tests.py`` (ops, scales, constraints, formats), ``test_reference_own_module_tests.py``
(modules, optimisers, parameters) or ``test_reference_own_transform_tests.py`` (graph transforms, scale
tracking, ``analyse_module``), which passes. Of those, the ones in ``DIFFERENCES`` pin a deliberate
difference (its test's docstring gives the numbers and the reason); the rest assert what the reference
asserts, translated. ``test_the_ledger_names_a_translation_for_every_reference_test_with_a_counterpart``
checks the ledger against the tests; ``docs/against-the-reference.md`` prints the counts from it.
"""

from __future__ import annotations

REFERENCE_TESTS: dict[str, list[str]] = {
    "test_functional.py": [
        "test_gelu_no_constraint",
        "test_gelu_scale_for_output",
        "test_gelu_scale_for_grad_input",
        "test_silu_no_constraint",
        "test_silu_scale_for_output",
        "test_silu_scale_for_grad_input",
        "test_silu_glu",
        "test_softmax_no_constraint",
        "test_softmax_scale_for_output",
        "test_softmax_scale_for_grad_input",
        "test_softmax_dim",
        "test_dropout",
        "test_matmul_no_constraint",
        "test_matmul_scale_for_output",
        "test_matmul_scale_for_grad_left",
        "test_matmul_scale_for_grad_right",
        "test_linear_no_constraint",
        "test_linear_geo_mean",
        "test_linear_scale_for_output",
        "test_linear_scale_for_grad_input",
        "test_linear_readout",
        "test_conv1d",
        "test_conv1d_stride",
        "test_conv1d_padding",
        "test_conv1d_dilation",
        "test_conv1d_groups",
        "test_layer_norm",
        "test_layer_norm_no_affine",
        "test_rms_norm",
        "test_rms_norm_no_affine",
        "test_add_no_constraint",
        "test_add_geo_mean",
        "test_add_broadcast",
        "test_add_scalar",
        "test_residual",
        "test_residual_apply",
        "test_embedding",
        "test_scaled_dot_product_attention",
        "test_cross_entropy",
        "test_mse_loss",
    ],
    "core/test_functional.py": [
        "test_scale_elementwise_no_constraint",
        "test_scale_elementwise_for_output",
        "test_scale_elementwise_for_grad_input",
        "test_rms",
        "test_transformer_residual_scaling_rule",
    ],
    "test_scale.py": ["test_scale_fwd", "test_scale_bwd"],
    "test_constraints.py": [
        "test_gmean",
        "test_hmean",
        "test_amean",
        "test_to_output_scale",
        "test_to_grad_input_scale",
        "test_apply_constraint",
    ],
    "test_formats.py": ["test_fp_format", "test_fp_format_rounding", "test_fp_format_bwd"],
    "test_modules.py": [
        "test_gelu",
        "test_silu",
        "test_softmax",
        "test_dropout",
        "test_linear",
        "test_conv1d",
        "test_linear_readout",
        "test_layer_norm",
        "test_rms_norm",
        "test_embedding",
        "test_cross_entropy_loss",
        "test_mlp",
        "test_mhsa",
        "test_transformer_layer",
        "test_depth_module_list",
        "test_depth_sequential",
        "test_transformer_decoder",
    ],
    "test_optim.py": ["test_optim_optimizers", "test_scaled_parameters", "test_scaled_parameters_with_existing_groups"],
    "test_parameter.py": ["test_parameter", "test_parameter_compile"],
    "test_utils.py": ["test_analyse_mlp", "test_analyse_mhsa"],
    "test_docs.py": [
        "test_validate_no_args",
        "test_validate_positional_args",
        "test_validate_positional_kwargs",
        "test_validate_invalid_arg",
        "test_validate_no_default_arg",
    ],
    "test_analysis.py": [
        "test_example_seqs",
        "test_create_batch",
        "test_example_batch",
        "test_plot",
        "test_visualiser",
    ],
    "transforms/test_compile.py": ["test_compile"],
    "transforms/test_simulate_format.py": [
        "test_simulate_fp8_linear",
        "test_simulate_fp8_unit_scaled_linear",
        "test_simulate_fp8_attention",
        "test_simulate_fp8_unit_scaled_attention",
    ],
    "transforms/test_track_scales.py": [
        "test_track_scales",
        "test_prune_non_float_tensors",
        "test_prune_same_scale_tensors",
        "test_prune_same_scale_tensors_with_grad",
        "test_prune_selected_nodes",
    ],
    "transforms/test_unit_scale.py": ["test_unit_scale", "test_unit_scale_residual_add", "test_fp8_unit_scaling"],
}

#: files not translated: what they test is not in this library
OUTSIDE: dict[str, str] = {
    "test_docs.py": "the reference's private docstring helper, _validate",
    "test_analysis.py": "example text batches (a tokenizer from the network) and its plots",
}

#: reference tests of an API this library does not have
NO_COUNTERPART: dict[str, str] = {
    "core/test_functional.py::test_rms": "rms is the reference's private helper; torch has torch.linalg.vector_norm",
}

#: translated tests that pin a deliberate difference (the test's docstring has the numbers and the reason)
DIFFERENCES: dict[str, str] = {
    "test_functional.py::test_softmax_no_constraint": "unit output std, not rms (rms 4.06 at mult=1/4)",
    "test_functional.py::test_softmax_scale_for_output": "unit std both ways under every constraint",
    "test_functional.py::test_softmax_dim": "unit output std, not rms",
    "test_functional.py::test_dropout": "inplace=True works as in torch (the reference refuses it)",
    "test_functional.py::test_embedding": "scale_grad_by_freq and sparse work as in torch",
    "test_functional.py::test_scaled_dot_product_attention": "q and k gradients unit (one scale for q, k, v)",
    "test_functional.py::test_cross_entropy": "weight and label_smoothing give torch's loss",
    "test_formats.py::test_fp_format": "IEEE exponent bias and inf codes: every E2M1 value twice the reference's",
    "test_formats.py::test_fp_format_bwd": "the same E2M1 grid, twice the reference's",
    "test_formats.py::test_fp_format_rounding": "no srbits: stochastic rounding draws a full random number",
    "test_modules.py::test_gelu": "default constraint gmean: output std 0.86",
    "test_modules.py::test_silu": "default constraint gmean: output std 0.88",
    "test_modules.py::test_linear": "default constraint gmean: output std 0.71",
    "test_modules.py::test_conv1d": "default constraint gmean: output std 0.89",
    "test_modules.py::test_transformer_layer": "default constraint gmean: output std 0.85",
    "test_modules.py::test_dropout": "Dropout(inplace=True) works as in torch",
    "test_modules.py::test_embedding": "no scale_grad_by_freq or sparse arguments (TypeError)",
    "test_modules.py::test_cross_entropy_loss": "weight and label_smoothing give torch's loss",
    "test_modules.py::test_depth_module_list": "a plain torch layer: UntaggedParameterError, a TypeError",
    "test_modules.py::test_depth_sequential": "a plain torch layer: UntaggedParameterError, a TypeError",
    "test_optim.py::test_scaled_parameters_with_existing_groups": "lr is always required",
    "transforms/test_simulate_format.py::test_simulate_fp8_linear": "parameters shared with the model, not copied",
    "transforms/test_simulate_format.py::test_simulate_fp8_unit_scaled_linear": "parameters shared, not copied",
    "transforms/test_track_scales.py::test_track_scales": "std and abs max only: no mean |x|, |mean x|, min |x|",
    "transforms/test_track_scales.py::test_prune_same_scale_tensors_with_grad": (
        "same scale judged on the std: b * 1.0 keeps its gradient's std (the mean |g| moves 0.5009 -> 0.4991)"
    ),
    "test_utils.py::test_analyse_mlp": "another text format: scales in a comment, the module's own names",
    "test_utils.py::test_analyse_mhsa": "another text format, and torch's reshapes for einops.rearrange",
}


def counts() -> dict[str, int]:
    """Reference tests considered (outside the ``OUTSIDE`` files), with a counterpart, passing as they are,
    and pinning a documented difference."""
    considered = [f"{f}::{n}" for f, names in REFERENCE_TESTS.items() if f not in OUTSIDE for n in names]
    translated = [key for key in considered if key not in NO_COUNTERPART]
    return {
        "considered": len(considered),
        "with a counterpart": len(translated),
        "pass as they are": len([key for key in translated if key not in DIFFERENCES]),
        "documented differences": len([key for key in translated if key in DIFFERENCES]),
        "outside (not in this library)": sum(len(REFERENCE_TESTS[f]) for f in OUTSIDE),
    }
