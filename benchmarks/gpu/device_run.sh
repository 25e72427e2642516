#!/usr/bin/env bash
# One call on the lent GPU machine (run from the repo root): install infer without network,
# show the device and `infer doctor`, run the CUDA plugin's tests compiled on the GPU, then the
# engine benchmarks. Logs land in $OUT.
# Usage: benchmarks/gpu/device_run.sh [tests] [bench] [gemv] [decode] [profile] [flashinfer]
# `gemv`: cuBLAS (and the fp8 quantize + _scaled_mm path) against the Triton GEMV per Llama-3-8B
# weight shape at M = 1 and 8. `decode`: the batch-1/64 A/B of RESULTS.md, Llama-3-8B shape,
# compile + prefill graphs, with the Triton GEMV off (cuBLAS only) and on (timed per shape).
# `decode-fp8`: the same A/B with --quantization fp8 --kv-cache-dtype fp8_e4m3.
# GEMV_MODES (default "off auto") sets which INFER_CUDA_GEMV settings `decode` runs, in order.
# `profile`: the kernel-level breakdown of a compiled decode step. Each call must end within the
# device tool's 10 minutes: `tests gemv`, then `decode`, then `decode-fp8 profile`.
# `parallel`: the pending multi-GPU checks of issue 15 (NCCL collectives replayed inside a CUDA
# graph; tp=2 with CUDA graphs = tp=2 eager = one rank; the graph runner's capture order under
# tp), which skip with fewer than two GPUs (reported by -rs). The matrix row stays experimental on
# CUDA until this has passed on a multi-GPU machine.
# PYTEST_ARGS: extra pytest arguments for `tests` (the image has pytest-xdist: "-n 8" compiles the
# conformance kit's attention tests side by side).
# Session 27 (H200) ran the conformance kit on CUDA and `decode-fp8` (RESULTS.md). Still pending:
# `parallel` on a machine with two or more GPUs.
set -u
OUT=${OUT:-/tmp/infer-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
want() { [[ " $* " == *" all "* ]] || [[ " $SECTIONS " == *" $1 "* ]]; }
SECTIONS="${*:-tests bench}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
# wheels the image lacks (pydantic-settings, gguf, pyzmq, msgspec, ...), carried in .whl/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/cpu -e plugins/cuda 2>&1 | grep -v WARN | tail -3
if [[ " $SECTIONS " == *" flashinfer "* ]] && [ -f .carry/flashinfer_python-0.2.14.post1.tar.gz ]; then
  mkdir -p /tmp/fi && tar xzf .carry/flashinfer_python-0.2.14.post1.tar.gz -C /tmp/fi
  FI=/tmp/fi/flashinfer_python-0.2.14.post1
  mkdir -p $FI/flashinfer/data
  for d in include csrc tvm_binding; do ln -sfn $FI/$d $FI/flashinfer/data/$d; done
  for d in cutlass spdlog; do ln -sfn $FI/3rdparty/$d $FI/flashinfer/data/$d; done
  export FLASHINFER_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
  if PYTHONPATH=$FI:$PYTHONPATH python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)"; then
    export PYTHONPATH=$FI:$PYTHONPATH
  fi
fi
timeout 30 infer doctor > "$OUT/doctor.txt" 2>&1; tail -5 "$OUT/doctor.txt"
if [[ " $SECTIONS " == *" tests "* ]]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -v -p no:cacheprovider ${TEST_PATHS:-plugins/cuda/tests} --maxfail=15 -rs ${PYTEST_ARGS:-} \
    2>&1 | tee "$OUT/pytest.log" | tail -25
fi
if [[ " $SECTIONS " == *" bench "* ]]; then
  timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/gpu/bench_engine.py --model llama3-8b --batch 1 64 \
    ${BENCH_ARGS:---hf-peer} --json-out "$OUT/bench_llama.json" 2>&1 | grep -v "it/s\]" > "$OUT/bench_llama.log"
  tail -8 "$OUT/bench_llama.log"
  if [[ " $SECTIONS " == *" compile "* ]]; then
    timeout ${COMPILE_TIMEOUT:-200} python3 benchmarks/gpu/bench_engine.py --model llama3-8b --batch 1 64 \
      --enable-torch-compile ${COMPILE_ARGS:-} --json-out "$OUT/bench_llama_compile.json" 2>&1 | grep -v "it/s\]" > "$OUT/bench_llama_compile.log"
    tail -6 "$OUT/bench_llama_compile.log"
  fi
  timeout ${MOE_TIMEOUT:-120} python3 benchmarks/gpu/bench_engine.py --model mixtral-16l --batch 1 64 \
    --max-total-tokens 40000 ${MOE_ARGS:-} --json-out "$OUT/bench_mixtral.json" 2>&1 | grep -v "it/s\]" > "$OUT/bench_mixtral.log"
  tail -6 "$OUT/bench_mixtral.log"
fi
if [[ " $SECTIONS " == *" gemv "* ]]; then
  (cd benchmarks/gpu && timeout ${GEMV_TIMEOUT:-240} python3 profile_kernels.py --gemv --gemv-rows 1 8 \
    --gemv-fp8 > "$OUT/gemv.txt" 2>&1); grep -v "us per config" "$OUT/gemv.txt" | tail -24
fi
# decode_ab NAME [bench_engine flags...]: Llama-3-8B, batch 1 and 64, compile + prefill graphs,
# once with the Triton GEMV off (cuBLAS only) and once on (timed per shape)
decode_ab() {
  local name=$1; shift
  for gemv in ${GEMV_MODES:-off auto}; do
    INFER_CUDA_GEMV=$gemv timeout ${DECODE_TIMEOUT:-240} python3 benchmarks/gpu/bench_engine.py --model llama3-8b \
      --batch 1 64 --enable-torch-compile --enable-piecewise-cuda-graph "$@" \
      --json-out "$OUT/${name}_gemv_$gemv.json" 2>&1 | grep -v "it/s\]" > "$OUT/${name}_gemv_$gemv.log"
    echo "== $name, INFER_CUDA_GEMV=$gemv"; tail -6 "$OUT/${name}_gemv_$gemv.log"
  done
}
if [[ " $SECTIONS " == *" decode "* ]]; then decode_ab decode; fi
if [[ " $SECTIONS " == *" decode-fp8 "* ]]; then
  decode_ab decode_fp8 --quantization fp8 --kv-cache-dtype fp8_e4m3
fi
if [[ " $SECTIONS " == *" parallel "* ]]; then
  nvidia-smi -L | tee "$OUT/parallel_gpus.txt"
  timeout ${PARALLEL_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -rs \
    tests/parallel/test_nccl_comm.py tests/parallel/test_cuda_graph_tp.py 2>&1 | tee "$OUT/parallel_pytest.log" | tail -12
fi
if [[ " $SECTIONS " == *" profile "* ]]; then
  (cd benchmarks/gpu && timeout ${PROFILE_TIMEOUT:-200} python3 profile_kernels.py --enable-torch-compile \
    > "$OUT/profile.txt" 2>&1); head -45 "$OUT/profile.txt"
fi
