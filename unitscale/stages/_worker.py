"""Entry point of a pipeline worker: ``python -m unitscale.stages._worker SCRATCH_DIR``.

Started by :func:`~unitscale.run_pipeline` with torchrun's environment variables. The
stack-dump handler is registered before torch is imported, so a worker asked where it is
(SIGUSR1, on a timeout) answers even while it is still starting.
"""

import faulthandler
import os
import signal
import sys


def main() -> None:
    scratch = sys.argv[1]
    dump = open(os.path.join(scratch, f"rank{os.environ['RANK']}.stack"), "w")  # noqa: SIM115 - open until exit
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=False)

    from unitscale.stages.pipeline import worker_main  # after the handler, on purpose

    worker_main(scratch)


if __name__ == "__main__":
    main()
