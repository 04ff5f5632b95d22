#!/usr/bin/env bash
# GPU validation on one H200: a FLUX.1-dev-config transformer with random bf16 weights, 1024x1024, 28 steps.
#   bash benchmarks/gpu_h200.sh build|matrix1|matrix2|phases|profile|rerun|keep|twin OUT_DIR
# Needs diffusers 0.42.1 and cache-dit 1.5.3 importable (the GPU image has torch, transformers and the rest).
set -euo pipefail
step=$1; out=$2; mkdir -p "$out"
model=/tmp/fluxdev; run=/tmp/fluxdev-matrix
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DITGATE_HOME=/tmp/ditgate-home CACHE_DIT_LOG_LEVEL=warning
export USE_HUB_KERNELS=NO  # transformers 5.25 asks for the `kernels` package on CUDA unless told not to
common=(--dtype bf16 --device cuda --warmup 1 --repeats 3)
case $step in
  build)   [ -f $model/model_index.json ] || python3 benchmarks/flux_dev_random.py $model ;;
  matrix1) python3 -m ditgate matrix $model "${common[@]}" --out $run \
             --rows cache-conservative,cache-conservative+taylorseer,cache-balanced,cache-balanced+taylorseer,cache-fast,cache-fast+taylorseer,cp-ulysses-2,tp-2 \
             > "$out/matrix1.txt" 2>&1 || true; tail -40 "$out/matrix1.txt" ;;
  matrix2) python3 -m ditgate matrix $model "${common[@]}" --out $run --resume > "$out/matrix.txt" 2>&1 || true
           cp $run/matrix.md $run/matrix.json $run/speedup_vs_psnr.png "$out/" 2>/dev/null || true
           tail -45 "$out/matrix.txt" ;;
  phases)  python3 -m ditgate run $model --dtype bf16 --device cuda --warmup 1 --repeats 2 --out /tmp/fluxdev-phases \
             > "$out/phases.txt" 2>&1 || true; cp /tmp/fluxdev-phases/report.md "$out/phases_report.md"; tail -30 "$out/phases.txt" ;;
  profile) python3 -m ditgate flops $model --height 1024 --width 1024 --steps 28 --json > "$out/flops.json"
           python3 -m ditgate flops $model --height 1024 --width 1024 --steps 28 | head -20
           python3 benchmarks/profile_split.py $model | tee "$out/profile_split.json" ;;
  rerun)   python3 benchmarks/rerun.py $model --build --rows cache --dtype bf16 --device cuda --warmup 1 --server \
             --out /tmp/fluxdev-rerun > "$out/rerun.txt" 2>&1 || true
           cp /tmp/fluxdev-rerun/rerun.json "$out/" 2>/dev/null || true; tail -15 "$out/rerun.txt" ;;
  keep)    # two served runs in a row: the second takes the pristine pipeline the first gave back (its load_s)
           python3 -m ditgate serve --idle 900 2> "$out/serve.txt" & sleep 1
           until grep -q listening "$out/serve.txt"; do sleep 1; done
           for k in 1 2; do
             t0=$(date +%s%N)
             python3 -m ditgate run $model --rows cache --dtype bf16 --device cuda --warmup 1 --twin off --fresh -q \
               --out /tmp/fluxdev-keep$k >> "$out/keep.txt" 2>&1 || true
             echo "served run $k: $(( ($(date +%s%N) - t0) / 1000000 )) ms from the command to its end" >> "$out/keep.txt"
             python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['time']; print('run', sys.argv[2], 'load_s', t.get('load_s'), 'generate_s', t.get('generate_s'))" \
               /tmp/fluxdev-keep$k/report.json $k >> "$out/keep.txt" 2>&1 || true
           done
           python3 -m ditgate serve --stop || true; cat "$out/keep.txt" ;;
  twin)    python3 benchmarks/twin_overhead.py $model --device cuda --dtype bf16 --rows cache,tp-2 --build \
             --out /tmp/twin_overhead > "$out/twin_overhead.txt" 2>&1 || true
           cp /tmp/twin_overhead/twin_overhead.json "$out/" 2>/dev/null || true; tail -12 "$out/twin_overhead.txt" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
