"""``import unitscale`` stays cheap: it runs in every notebook kernel, pipeline worker and script."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_importing_unitscale_does_not_import_torchdynamo() -> None:
    """TorchDynamo costs about 1.5 s to import; only a graph capture should pay it."""
    code = "import sys, unitscale; print(sorted(m for m in ('torch._dynamo', 'transformers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
