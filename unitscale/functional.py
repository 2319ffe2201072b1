"""Unit-scaled ops (import as ``U``): for unit-normal inputs, outputs and gradients have std close to 1."""
