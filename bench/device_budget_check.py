"""On a real NVIDIA GPU: does a memory budget as gputask hands it out hold? Prints one line per check.

Run by ``bench/device_check.sh`` (``python bench/device_budget_check.py``). Needs PyTorch with CUDA;
JAX and NVIDIA's MPS control daemon are used where present. Never changes a GPU setting: MPS runs in the
GPU's current compute mode, its daemon is started in private pipe and log directories and stopped at the end;
MIG mode is only read.

1. ``GPUTASK_GPU_MEMORY_MIB`` as the README's PyTorch snippet uses it: an allocation under the budget
   succeeds and one over it raises ``torch.OutOfMemoryError`` in a process that set the fraction;
2. the same budget through JAX's ``XLA_PYTHON_CLIENT_MEM_FRACTION``: the allocator's ``bytes_limit``;
3. ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` as gputask sets it (``0=<MiB>M``) for a client of an MPS daemon
   started here: under the limit succeeds, over it fails;
4. MIG mode of each GPU (MIG devices are recorded by ``bench/agent_probe_capture.py`` when enabled).

Each check runs in a child process with its environment, so one failing or hanging (90 s) cannot stop the
others. Exit code 0 always: the lines are the result.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BUDGET_MIB = 4096
UNDER_MIB, OVER_MIB = 2048, 6144
TIMEOUT_S = 90

ALLOC = """
import torch
def alloc(mib):
    try:
        x = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); del x
        torch.cuda.empty_cache(); return "ok"
    except torch.OutOfMemoryError:
        return "OutOfMemoryError"
"""

TORCH_CHILD = ALLOC + """
import os
budget = int(os.environ["GPUTASK_GPU_MEMORY_MIB"]) * 2**20
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), 0)
print(f"fraction {budget / total:.4f} of {total // 2**20} MiB; {UNDER} MiB: {alloc(UNDER)}; {OVER} MiB: {alloc(OVER)}")
"""

JAX_CHILD = """
import math, os, subprocess
total = min(int(x) for x in subprocess.check_output(
    ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]).split())
fraction = math.floor(int(os.environ["GPUTASK_GPU_MEMORY_MIB"]) / total * 1000) / 1000
os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(fraction)
import jax, jax.numpy as jnp
stats = jax.devices()[0].memory_stats() or {}
limit = stats.get("bytes_limit", 0) // 2**20
try:
    jnp.zeros((OVER * 2**20,), dtype=jnp.uint8).block_until_ready(); over = "ok"
except Exception as exc:
    over = type(exc).__name__
print(f"XLA_PYTHON_CLIENT_MEM_FRACTION={fraction} of {total} MiB: bytes_limit {limit} MiB; {OVER} MiB: {over}")
"""

MPS_CHILD = ALLOC + """
print(f"{UNDER} MiB: {alloc(UNDER)}; {OVER} MiB: {alloc(OVER)}")
"""


def child(code: str, env: dict[str, str]) -> str:
    """Run ``code`` in a fresh interpreter with ``env`` added; its last output line, or why it gave none."""
    text = code.replace("UNDER", str(UNDER_MIB)).replace("OVER", str(OVER_MIB))
    try:
        done = subprocess.run([sys.executable, "-c", text], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"timed out after {TIMEOUT_S} s"
    lines = (done.stdout or "").strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return f"exit {done.returncode}: {tail[0]}"
    return lines[-1]


def mps_check() -> str:
    """Start an MPS control daemon in private directories, run a limited client, stop the daemon."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return "not run: nvidia-cuda-mps-control is not on PATH"
    with tempfile.TemporaryDirectory(prefix="gputask-mps-") as tmp:
        dirs = {"CUDA_MPS_PIPE_DIRECTORY": str(Path(tmp, "pipe")), "CUDA_MPS_LOG_DIRECTORY": str(Path(tmp, "log"))}
        for path in dirs.values():
            Path(path).mkdir()
        env = {**os.environ, **dirs}
        started = subprocess.run([control, "-d"], env=env, capture_output=True, text=True, timeout=30)
        if started.returncode != 0:
            return f"not run: the MPS control daemon did not start ({started.stderr.strip() or started.returncode})"
        try:
            limit = {**dirs, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={BUDGET_MIB}M"}
            return f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={BUDGET_MIB}M: {child(MPS_CHILD, limit)}"
        finally:
            subprocess.run([control], input="quit\n", env=env, capture_output=True, text=True, timeout=30)
            log = Path(dirs["CUDA_MPS_LOG_DIRECTORY"], "control.log")
            if log.exists():
                print("mps control.log (last lines):", *log.read_text().splitlines()[-5:], sep="\n  ")


def mig_modes() -> str:
    """``nvidia-smi``'s MIG mode per GPU (read only)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,mig.mode.current", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"
    return out.replace("\n", "; ") or "no GPU listed"


def main() -> int:
    """Run the four checks and print their lines."""
    budget = {"GPUTASK_GPU_MEMORY_MIB": str(BUDGET_MIB)}
    print(f"1. PyTorch, GPUTASK_GPU_MEMORY_MIB={BUDGET_MIB}: {child(TORCH_CHILD, budget)}")
    print(f"2. JAX, GPUTASK_GPU_MEMORY_MIB={BUDGET_MIB}: {child(JAX_CHILD, budget)}")
    print(f"3. MPS: {mps_check()}")
    print(f"4. MIG mode per GPU (index, mode): {mig_modes()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
