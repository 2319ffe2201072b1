"""The test suite, a package so that shared helpers import by their path from the repository root:
``from tests.real_models import gpt2``, ``from tests.fx.module_trees import build``."""
