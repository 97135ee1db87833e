#!/usr/bin/env bash
# The GPU check, in one call on a machine with an NVIDIA GPU and no Rust toolchain (the binaries
# are built elsewhere). Prepare it where cargo is, from the repository root:
#
#   scripts/gpu-check.sh --pack     # builds, then writes .gpu/bin.tar.xz and .gpu/fashion-mnist/
#
# then on the GPU machine, from a copy of the repository holding .gpu/:
#
#   scripts/gpu-check.sh [OUTDIR]   # tests, benchmarks beside PyTorch, training on cuda:0 and cpu
#
# What it runs, each step with its own time limit so one failure leaves the others their time:
#  1. the backend tests, GPU runs included (PS_REQUIRE_GPU=1, --include-ignored);
#  2. gpu-bench step --batch 256 and 4096 beside scripts/torch_baseline.py step, interleaved,
#     twice; gpu-bench topk beside torch_baseline.py topk (16 M floats, 1%);
#  3. psctl local (MLP 256, Fashion-MNIST, BSP, EPOCHS=20) with --device cuda:0 and with
#     --device cpu, side by side; the last line of each is its test accuracy, and the GPU's
#     process list taken meanwhile shows the workers on it.
# A summary of every figure is printed last and written to OUTDIR/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--pack" ]; then
  set -e
  cargo build --release -p ps-worker -p ps-cli -p ps-server -p ps-scheduler --bins
  tests=$(cargo test --release -p ps-worker --lib --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"]:
        print(m["executable"])')
  rm -rf .gpu/stage && mkdir -p .gpu/stage .gpu/fashion-mnist
  cp target/release/{psctl,ps-server,scheduler,worker,gpu-bench} .gpu/stage/
  cp "$tests" .gpu/stage/ps-worker-tests
  strip .gpu/stage/*
  tar -C .gpu/stage -cJf .gpu/bin.tar.xz .
  rm -rf .gpu/stage
  cp /usr/share/datasets/fashion-mnist/*.gz .gpu/fashion-mnist/
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >>.git/info/exclude
  du -sh .gpu
  exit 0
fi

OUT=${1:-${OUT:-/tmp/gpu-check}}
mkdir -p "$OUT"
B=/tmp/gpu-check-bin
rm -rf "$B" && mkdir -p "$B/lib"
tar -C "$B" -xJf .gpu/bin.tar.xz || { echo "no .gpu/bin.tar.xz: run --pack first"; exit 1; }
# The backend opens libnvrtc.so and libcublas.so by their usual names; a CUDA 13 toolkit or
# PyTorch's wheels may hold only versioned ones, so link the newest found under the usual names.
for name in nvrtc cublas cublasLt; do
  f=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt -name "lib$name.so*" \
        \( -type f -o -type l \) 2>/dev/null | grep -v -e '\.alt\.' -e stubs | sort -V | tail -1)
  if [ -n "$f" ]; then
    ln -sf "$f" "$B/lib/lib$name.so"
    export LD_LIBRARY_PATH="$B/lib:$(dirname "$f"):${LD_LIBRARY_PATH:-}"
    echo "lib$name.so -> $f"
  fi
done
export PATH="$B:$PATH"
S="$OUT/summary.txt"
: >"$S"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee -a "$S"

echo "== 1. backend tests with the GPU" | tee -a "$S"
PS_REQUIRE_GPU=1 timeout 300 "$B/ps-worker-tests" --include-ignored backend 2>&1 | tee "$OUT/tests.log" | tail -40
grep -E '^test result|FAILED|panicked' "$OUT/tests.log" | head -20 >>"$S"

echo "== 2. gpu-bench beside PyTorch eager (same GPU)" | tee -a "$S"
# One figure of each: the same arguments mean the same work in both.
pair() {
  timeout 120 gpu-bench "$@" 2>&1 | tail -1 | tee -a "$S"
  timeout 120 python3 scripts/torch_baseline.py "$@" 2>&1 | tail -1 | tee -a "$S"
}
for round in 1 2; do
  for batch in 256 4096; do pair step --batch "$batch"; done
done
for round in 1 2; do
  for ratio in 0.01 0.0001; do pair topk --ratio "$ratio"; done
done

echo "== 3. psctl local, MLP on Fashion-MNIST: cuda:0 and cpu side by side" | tee -a "$S"
for dev in cuda:0 cpu; do
  tag=${dev%%:*}
  (
    start=$(date +%s.%N)
    timeout "${TRAIN_LIMIT:-300}" psctl local --device "$dev" --data .gpu/fashion-mnist \
      --epochs "${EPOCHS:-20}" --run-dir "/tmp/run-$tag" >"$OUT/train-$tag.log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    echo "train $dev rc=$rc seconds=$(echo "$end - $start" | bc 2>/dev/null || python3 -c "print($end-$start)")" \
      >"$OUT/train-$tag.rc"
  ) &
done
sleep 15
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv | tee -a "$S"
wait
for dev in cuda cpu; do
  cat "$OUT/train-$dev.rc" | tee -a "$S"
  grep -a -i -E 'device|cuda|accuracy' "$OUT/train-$dev.log" | tail -4 | tee -a "$S"
  grep -a -r -i -h -E 'compute on' /tmp/run-"$dev"/logs/ 2>/dev/null | head -2 | cut -c1-300 | tee -a "$S"
done
echo "== summary"
cat "$S"
