#!/usr/bin/env bash
# The node agent on a real NVIDIA GPU, in one short run (about 2 minutes).
#
# Usage, from the repository root on a machine with an NVIDIA driver:
#     OUT=/tmp/gputask-gpu bash bench/device_check.sh
# Where the machine cannot reach PyPI, put wheels for Python on that machine in .devwheels/
# first (pip download ... -d .devwheels; see the closing note of issue 5) and they are installed
# from there. Writes to $OUT: machine.txt (uname, nvidia-smi), nvidia-smi-q.txt, the probe
# capture nvml_reading.json (bench/agent_probe_capture.py) and pytest.txt: the agent's unit and
# emulator tests plus tests/integration/test_agent_real_gpu.py, which skip without NVML.
set -u
OUT=${OUT:-/tmp/gputask-gpu}
PY=${PYTHON:-python3}
DEVWHEELS=${DEVWHEELS-.devwheels}
mkdir -p "$OUT"
{ date -u; uname -a; "$PY" --version; nvidia-smi; } >"$OUT/machine.txt" 2>&1
nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1
if [ -n "$DEVWHEELS" ] && [ -d "$DEVWHEELS" ]; then
    "$PY" -m pip install --no-index --find-links "$DEVWHEELS" kopf==1.45.2 kubernetes==37.0.2 pydantic==2.14.4 \
        pytest-asyncio==1.5.0 kmock==0.8 nvidia-ml-py==13.615.71 typer==0.29.2 rich==15.0.0 >"$OUT/pip.txt" 2>&1 \
        || echo "pip install failed: see pip.txt"
fi
export PYTHONPATH="$PWD/operator" PYTHONUNBUFFERED=1
"$PY" bench/agent_probe_capture.py --output "$OUT/nvml_reading.json"; echo "capture exit $?"
timeout 420 "$PY" -m pytest -p no:cacheprovider -p no:benchmark -q -rs \
    tests/unit/test_agent_probe.py tests/unit/test_agent_report.py tests/unit/test_agent_metrics.py \
    tests/integration/test_agent.py tests/integration/test_agent_real_gpu.py 2>&1 | tee "$OUT/pytest.txt"
