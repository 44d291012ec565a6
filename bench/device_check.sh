#!/usr/bin/env bash
# The node agent on a real NVIDIA GPU, in one short run (about 2 minutes).
#
# Usage, from the repository root on a machine with an NVIDIA driver:
#     OUT=/tmp/gputask-gpu bash bench/device_check.sh
# Where the machine cannot reach PyPI, put wheels for Python on that machine in .devwheels/
# first (pip download ... -d .devwheels; see the closing note of issue 5) and they are installed
# from there. Writes to $OUT: machine.txt (uname, nvidia-smi), nvidia-smi-q.txt, the probe
# capture nvml_reading.json (bench/agent_probe_capture.py; with MIG devices where a GPU is in MIG mode),
# pytest.txt: the agent's unit and emulator tests plus tests/integration/test_agent_real_gpu.py, which skip
# without NVML, figures.txt and budgets.txt (bench/device_budget_check.py). Never changes a GPU setting.
set -u
OUT=${OUT:-/tmp/gputask-gpu}
PY=${PYTHON:-python3}
DEVWHEELS=${DEVWHEELS-.devwheels}
mkdir -p "$OUT"
{ date -u; uname -a; "$PY" --version; nvidia-smi; } >"$OUT/machine.txt" 2>&1
nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1
if [ -n "$DEVWHEELS" ] && [ -d "$DEVWHEELS" ]; then
    "$PY" -m pip install --no-index --find-links "$DEVWHEELS" kopf==1.45.2 kubernetes==37.0.2 pydantic==2.14.4 \
        pytest-asyncio==1.5.0 kmock==0.8 nvidia-ml-py==13.615.71 typer==0.29.2 rich==15.0.0 jsonschema >"$OUT/pip.txt" 2>&1 \
        || echo "pip install failed: see pip.txt"
    # The agent's PodResources client and its tests (apart, so a missing wheel does not stop the rest).
    "$PY" -m pip install --no-index --find-links "$DEVWHEELS" grpcio protobuf grpcio-tools >>"$OUT/pip.txt" 2>&1 \
        || echo "grpcio/protobuf not installed: the PodResources tests will fail to import (see pip.txt)"
fi
export PYTHONPATH="$PWD/operator" PYTHONUNBUFFERED=1
"$PY" bench/agent_probe_capture.py --output "$OUT/nvml_reading.json"; echo "capture exit $?"
timeout 420 "$PY" -m pytest -p no:cacheprovider -p no:benchmark -q -rs \
    tests/unit/test_agent_probe.py tests/unit/test_agent_report.py tests/unit/test_agent_metrics.py \
    tests/unit/test_agent_attribution.py tests/unit/test_podresources.py \
    tests/integration/test_agent.py tests/integration/test_agent_real_gpu.py 2>&1 | tee "$OUT/pytest.txt"
# Figures for the closing note: NVML used memory for a known allocation held by another
# process (torch), and the probe's read() time.
"$PY" - >"$OUT/figures.txt" 2>&1 <<'PYEOF'
import subprocess, sys, time
from gputask.agent import NvmlProbe

def used() -> int:
    with NvmlProbe() as probe:
        return probe.read().gpus[0].memory_used_mib

base = used()
print("allocatable MiB", NvmlProbe().read().gpus[0].memory_total_mib, "idle used MiB", base)
for mib in (8192, 65536):
    code = f"import sys,torch;x=torch.empty({mib}*2**20,dtype=torch.uint8,device='cuda');torch.cuda.synchronize();print('held',flush=True);sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    holder.stdout.readline(); time.sleep(1)
    now = used(); print(f"held {mib} MiB in another process: used {now} MiB (CUDA context {now - base - mib} MiB)")
    holder.stdin.close(); holder.wait(); time.sleep(1); print("after release: used", used(), "MiB")
probe = NvmlProbe(); probe.open(); start = time.perf_counter()
for _ in range(1000):
    probe.read()
print(f"NvmlProbe.read(): {(time.perf_counter() - start):.3f} ms per read over 1000 reads; XID events supported: {probe.events}")
probe.close()
PYEOF
cat "$OUT/figures.txt"
# Issue 18: memory budgets as gputask hands them out (PyTorch and JAX honouring GPUTASK_GPU_MEMORY_MIB, an MPS
# client under CUDA_MPS_PINNED_DEVICE_MEM_LIMIT where an MPS daemon can be started) and MIG mode (read only).
timeout 400 "$PY" bench/device_budget_check.py 2>&1 | tee "$OUT/budgets.txt"
