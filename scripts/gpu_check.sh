#!/usr/bin/env bash
# GPU check, one short script (under 5 minutes on an H200): the kernel tests compiled
# (tests/conftest.py picks the compiled backend when CUDA is present), the compile test
# (which here also checks the offline sm_90/sm_80 figures against the driver's), the run
# command on the GPU, then a quick timing of the untraced kernel. Uses the machine's own
# torch and triton; pagetrace runs from this checkout (PYTHONPATH), nothing is installed.
# Everything it prints is also written to $GPU_CHECK_LOG (default gpu_check.log).
#   bash scripts/gpu_check.sh            quick timing
#   FULL=1 bash scripts/gpu_check.sh     the whole GPU table of bench/README.md
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
LOG=${GPU_CHECK_LOG:-gpu_check.log}
exec > >(tee "$LOG") 2>&1
python3 - <<'PY'
import torch, triton
assert torch.cuda.is_available(), "no CUDA device"
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
PY
echo "== kernel tests, compiled"
python3 -m pytest -q -p no:cacheprovider -rs tests/attention/test_kernel.py tests/attention/test_prefill.py tests/commands/test_cli_run.py tests/commands/test_cli_prefill.py tests/attention/test_compile.py
echo "== pagetrace run on the GPU"
python3 -m pagetrace run --tokens 38 --device cuda | tail -8
python3 -m pagetrace run --tokens 38 --query-len 6 --device cuda | tail -8
python3 -m pagetrace run --tokens 4000,300,20 --query-len 2000,1,1 --heads 32 --kv-heads 8 --head-dim 128 --dtype fp8_e4m3 --k-scale 0.5 --device cuda --rows 6 --show-heads 0 | tail -8
python3 -m pagetrace run --tokens 100000,3000 --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --device cuda --rows 6 --show-heads 0 | tail -8
echo "== untraced kernel timing"
if [ "${FULL:-0}" = 1 ]; then python3 bench/bench_gpu.py; else python3 bench/bench_gpu.py --quick; fi
echo "== figures written to $LOG"
