#!/usr/bin/env bash
# Builds gradscope with CUDA on a machine with an NVIDIA GPU, runs the CUDA unit tests and the CUDA
# benchmarks, and collects everything in one folder:
#
#   scripts/gpu_check.sh [OUT_DIR]        # default OUT_DIR: build/gpu-results
#
# OUT_DIR receives nvidia-smi.txt, configure.log, build.log, cuda_tests.log, cuda_tests.json (gtest),
# cuda_bench.log, cuda_bench.json (Google Benchmark), nccl_bench.csv (gradscope bench --backend nccl,
# one rank), nccl_strategies-np2.log and -np3.log (every strategy on NCCL with 2 and 3 ranks, checked),
# the agent on real NCCL jobs (agent_build.log, agent_nccl.log; agent_nccl/ and
# agent_nccl-nvtx/ with the trace and its report; agent_nccl-pair*/ for two ranks on the one GPU with the
# NCCL plugins; agent_ddp/ (observe, one rank), agent_ddp2-explore/ and agent_ddp2/ (explore and apply, two
# ranks) for PyTorch DDP where torch is installed,
# agent_windows/ for the step model's GPU windows on it: their cost per step and the GPU-measured steps),
# nccl_compare.txt (gradscope bench against an nccl-tests-style loop), gpu_timing_costs.txt,
# nccl_overhead.txt (what the agent adds to an NCCL call, bench/nccl_overhead.py) and
# summary.txt.
#
# Environment:
#   GRADSCOPE_SKIP_BOOTSTRAP=1    never run scripts/bootstrap.sh (GPU machines often have no package
#                                 mirror). Otherwise it runs only when a build package is missing and
#                                 apt-get exists; if it fails the script carries on and lets CMake say
#                                 what is missing.
#   CMAKE_PREFIX_PATH             colon-separated prefixes where dependencies live, e.g. .deb packages
#                                 unpacked with `dpkg -x pkg.deb /opt/debs` -> /opt/debs/usr. CMake
#                                 reads it; this script also puts <prefix>/lib[/<multiarch>] on
#                                 LD_LIBRARY_PATH so the test and benchmark binaries find those libraries.
#   GRADSCOPE_GPU_BUILD_DIR       the build directory (default: build/gpu).
#   GRADSCOPE_GPU_PREBUILT=1      the build directory already holds what the checks run (built elsewhere and
#                                 staged by scripts/gpu_stage.sh): no bootstrap, configure or build here.
#   GRADSCOPE_CUDA_ARCHITECTURES  CMAKE_CUDA_ARCHITECTURES (default: the project's "80;90", whose PTX
#                                 also runs on newer GPUs through the driver's JIT).
#   GRADSCOPE_BENCH_FILTER        --benchmark_filter for the benchmarks (default: all of them).
#   GRADSCOPE_SKIP_BENCH=1        build and test only.
#   GRADSCOPE_STRATEGIES_TIMEOUT  seconds each run of the NCCL strategy tests may take (default 900).
#   GRADSCOPE_SKIP_STRATEGIES=1   do not run the NCCL strategy tests (a rerun whose change left comm/ alone).
#   GRADSCOPE_WINDOWS_ROUNDS      interleaved rounds of the DDP GPU-windows figure (default 5).
#   GRADSCOPE_ALLOW_SKIPPED=1     accept GPU tests that skipped for want of a usable GPU (normally an
#                                 error here: on a GPU machine it means the library could not use it).
#
# Exit status: 0 when every CUDA test passed (and the benchmarks ran), 1 when a test failed or the
# benchmarks failed, 2 when the build could not be set up or did not compile.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
out_dir=${1:-$repo_root/build/gpu-results}
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
build_dir=${GRADSCOPE_GPU_BUILD_DIR:-$repo_root/build/gpu}
jobs=$(nproc 2>/dev/null || echo 4)

say() { echo "==> [$((SECONDS / 60))m$((SECONDS % 60))s] $*"; }
die() {
  echo "==> FAILED: $*" >&2
  echo "FAILED: $*" >>"$out_dir/summary.txt"
  exit "${2:-2}"
}

: >"$out_dir/summary.txt"
{
  echo "gradscope GPU check"
  echo "date:   $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host:   $(uname -n) ($(uname -sr))"
  echo "commit: $(git -C "$repo_root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo_root" diff --quiet 2>/dev/null || echo ' (with local changes)')"
} >>"$out_dir/summary.txt"
say "GPU check of $repo_root; results in $out_dir"

# ---- The GPU ---------------------------------------------------------------------------------------
say "GPU (nvidia-smi)"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >"$out_dir/nvidia-smi.txt" 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
  say "found: $gpu"
  echo "gpu:    $gpu" >>"$out_dir/summary.txt"
else
  echo "gpu:    none (nvidia-smi missing or failing; see nvidia-smi.txt)" >>"$out_dir/summary.txt"
  say "WARNING: nvidia-smi is missing or failed: the CUDA tests will skip (continuing to check the build)"
fi

# ---- Dependencies ------------------------------------------------------------------------------------
prebuilt=${GRADSCOPE_GPU_PREBUILT:-0}
build_packages=(cmake g++ libsqlite3-dev libfmt-dev libcli11-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev)
if [ "$prebuilt" = 1 ]; then
  say "dependencies: prebuilt binaries in $build_dir (GRADSCOPE_GPU_PREBUILT=1)"
elif [ "${GRADSCOPE_SKIP_BOOTSTRAP:-0}" = 1 ]; then
  say "dependencies: bootstrap skipped (GRADSCOPE_SKIP_BOOTSTRAP=1)"
else
  missing=()
  if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${build_packages[@]}"; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
  fi
  if [ ${#missing[@]} -eq 0 ]; then
    say "dependencies: build packages present (or not a dpkg system)"
  elif ! command -v apt-get >/dev/null 2>&1; then
    say "dependencies: missing ${missing[*]} and no apt-get; relying on CMAKE_PREFIX_PATH"
  else
    say "dependencies: missing ${missing[*]}; running scripts/bootstrap.sh"
    if ! scripts/bootstrap.sh; then
      say "WARNING: bootstrap failed (no package mirror?); continuing with CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-<unset>}"
    fi
  fi
fi

# Libraries from unpacked packages must be found at run time too.
if [ -n "${CMAKE_PREFIX_PATH:-}" ]; then
  multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  IFS=: read -r -a prefixes <<<"$CMAKE_PREFIX_PATH"
  for prefix in "${prefixes[@]}"; do
    for dir in "$prefix/lib/$multiarch" "$prefix/lib" "$prefix/lib64"; do
      [ -d "$dir" ] && LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
  done
  export LD_LIBRARY_PATH
  say "CMAKE_PREFIX_PATH=$CMAKE_PREFIX_PATH (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
fi

# ---- Configure and build ----------------------------------------------------------------------------------
# build_targets LOG TARGET...: builds the targets into the build directory, or nothing when it is prebuilt.
build_targets() {
  local log=$1
  shift
  if [ "$prebuilt" = 1 ]; then
    echo "prebuilt: $*" >"$log"
    return 0
  fi
  cmake --build "$build_dir" --parallel "$jobs" --target "$@" >"$log" 2>&1
}

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake_args=(-S "$repo_root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo
  -DGRADSCOPE_WITH_CUDA=ON -DGRADSCOPE_BUILD_TESTS=ON -DGRADSCOPE_BUILD_BENCHMARKS=ON)
[ -n "${GRADSCOPE_CUDA_ARCHITECTURES:-}" ] && cmake_args+=("-DCMAKE_CUDA_ARCHITECTURES=$GRADSCOPE_CUDA_ARCHITECTURES")
[ -n "${CMAKE_PREFIX_PATH:-}" ] && cmake_args+=("-DCMAKE_PREFIX_PATH=$(echo "$CMAKE_PREFIX_PATH" | tr : ';')")

say "configuring $build_dir (CUDA on)"
if [ "$prebuilt" = 1 ]; then
  [ -x "$build_dir/tests/gradscope_unit_tests" ] || die "GRADSCOPE_GPU_PREBUILT=1 but $build_dir has no tests/gradscope_unit_tests (scripts/gpu_stage.sh)"
  echo "prebuilt" >"$out_dir/configure.log"
elif ! cmake "${cmake_args[@]}" >"$out_dir/configure.log" 2>&1; then
  tail -n 20 "$out_dir/configure.log" >&2
  die "configure failed; see $out_dir/configure.log"
fi
say "building gradscope_unit_tests, gradscope_cuda_bench and gradscope-bench ($jobs jobs; nvcc takes a few minutes)"
if ! build_targets "$out_dir/build.log" gradscope_unit_tests gradscope_cuda_bench gradscope-bench; then
  grep -E "error|Error" "$out_dir/build.log" | head -n 20 >&2 || tail -n 20 "$out_dir/build.log" >&2
  die "build failed; see $out_dir/build.log"
fi
warnings=$(grep -c -i "warning" "$out_dir/build.log" || true)
say "built ($warnings warning lines in build.log)"
echo "build:  ok, $warnings warning lines (build.log)" >>"$out_dir/summary.txt"

tests_bin=$build_dir/tests/gradscope_unit_tests
bench_bin=$build_dir/bench/gradscope_cuda_bench
status=0

# ---- CUDA tests ---------------------------------------------------------------------------------------------
say "CUDA tests (gtest filter '*Cuda*')"
test_status=0
"$tests_bin" --gtest_filter='*Cuda*' --gtest_output="json:$out_dir/cuda_tests.json" \
  >"$out_dir/cuda_tests.log" 2>&1 || test_status=$?
passed=$(grep -c '^\[       OK \]' "$out_dir/cuda_tests.log" || true)
failed=$(grep -c '^\[  FAILED  \] .*(' "$out_dir/cuda_tests.log" || true)
skipped=$(grep -c '^\[  SKIPPED \] .*(' "$out_dir/cuda_tests.log" || true)
echo "tests:  $passed passed, $failed failed, $skipped skipped (exit $test_status; cuda_tests.log)" >>"$out_dir/summary.txt"
if [ "$test_status" -ne 0 ]; then
  grep -E '^\[  FAILED  \]' "$out_dir/cuda_tests.log" | sort -u >&2 || true
  say "CUDA tests FAILED ($failed failed); see $out_dir/cuda_tests.log"
  grep -E '^\[  FAILED  \]' "$out_dir/cuda_tests.log" | sort -u >>"$out_dir/summary.txt" || true
  status=1
elif grep -q 'GPU tests skipped' "$out_dir/cuda_tests.log" && [ "${GRADSCOPE_ALLOW_SKIPPED:-0}" != 1 ]; then
  # The GPU fixtures skip with this message when cuda::available() is false: on a GPU machine that
  # means the library could not use the GPU (driver too old, wrong architecture, ...).
  reason=$(grep -m 1 -o 'GPU tests skipped.*' "$out_dir/cuda_tests.log" || true)
  say "CUDA tests SKIPPED ($skipped): $reason"
  echo "tests skipped on what should be a GPU machine: $reason" >>"$out_dir/summary.txt"
  status=1
else
  say "CUDA tests passed ($passed passed, $skipped skipped)"
fi

# ---- CUDA benchmarks -----------------------------------------------------------------------------------------
if [ "${GRADSCOPE_SKIP_BENCH:-0}" = 1 ]; then
  say "benchmarks skipped (GRADSCOPE_SKIP_BENCH=1)"
else
  say "CUDA benchmarks (256 MiB buffers; a few minutes)"
  bench_args=(--benchmark_out="$out_dir/cuda_bench.json" --benchmark_out_format=json)
  [ -n "${GRADSCOPE_BENCH_FILTER:-}" ] && bench_args+=("--benchmark_filter=$GRADSCOPE_BENCH_FILTER")
  bench_status=0
  "$bench_bin" "${bench_args[@]}" >"$out_dir/cuda_bench.log" 2>&1 || bench_status=$?
  if [ "$bench_status" -ne 0 ]; then
    tail -n 20 "$out_dir/cuda_bench.log" >&2
    say "benchmarks FAILED (exit $bench_status); see $out_dir/cuda_bench.log"
    echo "bench:  FAILED (exit $bench_status; cuda_bench.log)" >>"$out_dir/summary.txt"
    status=1
  elif command -v python3 >/dev/null 2>&1; then
    python3 - "$out_dir/cuda_bench.json" >>"$out_dir/summary.txt" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
rows = [b for b in data.get("benchmarks", []) if b.get("run_type", "iteration") == "iteration"]
print(f"bench:  {len(rows)} benchmarks on {data.get('context', {}).get('gpu', '?')} (cuda_bench.json)")
print(f"  {'benchmark':<44} {'ms_min':>8} {'GB/s':>8} {'vs_d2d':>7}")
slow = 0
for b in rows:
    if b.get("error_occurred"):
        print(f"  {b['name']:<44} skipped: {b.get('error_message', '')}")
        continue
    ratio = b.get("vs_d2d", 0.0)
    flag = "" if ratio >= 0.9 or b["name"].startswith("BM_CudaD2DCopy") else "  < 0.9"
    slow += bool(flag)
    print(f"  {b['name']:<44} {b.get('ms_min', 0):8.3f} {b.get('GBps_best', 0):8.1f} {ratio:7.3f}{flag}")
print(f"  {slow} benchmark(s) below 90% of the device-to-device copy rate")
EOF
    say "benchmarks done"
  else
    echo "bench:  ok (cuda_bench.json; no python3 for a table)" >>"$out_dir/summary.txt"
  fi
fi

# ---- NCCL: one rank of gradscope bench (all NCCL strategies, checked) -------------------------------------
if [ "${GRADSCOPE_SKIP_BENCH:-0}" != 1 ]; then
  say "NCCL strategies, one rank (gradscope bench --backend nccl)"
  nccl_status=0
  "$build_dir/cli/gradscope-bench" --backend nccl -b 8 -e 256M -f 4 -n 20 -w 5 --no-progress \
    --csv >"$out_dir/nccl_bench.csv" 2>"$out_dir/nccl_bench.log" || nccl_status=$?
  if [ "$nccl_status" -ne 0 ]; then
    tail -n 5 "$out_dir/nccl_bench.log" >&2
    say "NCCL bench FAILED (exit $nccl_status); see $out_dir/nccl_bench.log"
    echo "nccl:   FAILED (exit $nccl_status; nccl_bench.log)" >>"$out_dir/summary.txt"
    status=1
  else
    wrong=$(awk -F, 'NR > 1 && $14 != "" && $14 != "0" { n++ } END { print n + 0 }' "$out_dir/nccl_bench.csv")
    echo "nccl:   $(($(wc -l <"$out_dir/nccl_bench.csv") - 1)) points, $wrong with #wrong > 0 (nccl_bench.csv)" >>"$out_dir/summary.txt"
    [ "$wrong" -eq 0 ] || status=1
  fi
fi

# ---- NCCL: every strategy with 2 and 3 ranks, checked exactly or against its error bound ----------------
# tests/strategies on NCCL communicators; with one GPU the ranks share it as separate NCCL hosts
# (strategies_test_nccl_main.cc). Logs in nccl_strategies-np2.log and -np3.log.
say "NCCL strategies with 2 and 3 ranks (gradscope_strategy_tests_nccl)"
if [ "${GRADSCOPE_SKIP_STRATEGIES:-0}" = 1 ]; then
  echo "strategies: skipped (GRADSCOPE_SKIP_STRATEGIES=1)" >>"$out_dir/summary.txt"
elif ! build_targets "$out_dir/strategies_build.log" gradscope_strategy_tests_nccl; then
  tail -n 5 "$out_dir/strategies_build.log" >&2
  say "NCCL strategy tests FAILED to build; see $out_dir/strategies_build.log"
  echo "strategies: FAILED to build (strategies_build.log)" >>"$out_dir/summary.txt"
  status=1
else
  strategies_bin=$build_dir/tests/strategies/gradscope_strategy_tests_nccl
  for ranks in 2 3; do
    strategies_status=0
    timeout "${GRADSCOPE_STRATEGIES_TIMEOUT:-900}" "$strategies_bin" --ranks "$ranks" >"$out_dir/nccl_strategies-np$ranks.log" 2>&1 ||
      strategies_status=$?
    summary=$(grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test' "$out_dir/nccl_strategies-np$ranks.log" | tr '\n' ' ' || true)
    echo "strategies: NCCL, $ranks ranks: exit $strategies_status; $summary(nccl_strategies-np$ranks.log)" \
      >>"$out_dir/summary.txt"
    if [ "$strategies_status" -ne 0 ]; then
      grep -E '^\[rank|FAILED|Failure' "$out_dir/nccl_strategies-np$ranks.log" | head -n 10 >&2 || true
      say "NCCL strategy tests with $ranks ranks FAILED (exit $strategies_status)"
      status=1
    fi
  done
fi

# ---- The agent on real NCCL jobs --------------------------------------------------------------------------
# tests/agent/nccl/nccl_job.cc built on the real NCCL (gradscope_nccl_job_real), run plain and under the
# agent by check_nccl.py: same output, the exact calls and communicators, CUDA-event spans; then with the
# NVTX step marker. Results in agent_nccl/ and agent_nccl-nvtx/ (trace, report.txt), log in agent_nccl.log.
say "agent on a one-rank NCCL job (check_nccl.py real, real-nvtx)"
agent_so=$build_dir/agent/libgradscope-agent.so
gradscope_bin=$build_dir/cli/gradscope
if ! build_targets "$out_dir/agent_build.log" gradscope_agent gradscope \
  gradscope_nccl_job_real gradscope_nccl_pair_real gradscope_nccl_profiler gradscope_nccl_tuner \
  gradscope_nccl_tests_allreduce gradscope_gpu_timing_costs; then
  tail -n 5 "$out_dir/agent_build.log" >&2
  say "agent NCCL check FAILED to build (is tests/agent/nccl in the build?); see $out_dir/agent_build.log"
  echo "agent:  NCCL job FAILED to build (agent_build.log)" >>"$out_dir/summary.txt"
  status=1
else
  job_bin=$(find "$build_dir/tests" -name nccl-job-real -type f | head -n 1)
  agent_status=0
  for mode in real real-nvtx; do
    python3 tests/agent/nccl/check_nccl.py --agent "$agent_so" --job "$job_bin" --gradscope "$gradscope_bin" \
      --workdir "$out_dir/agent_nccl${mode#real}" "$mode" >>"$out_dir/agent_nccl.log" 2>&1 || agent_status=1
  done
  # Two ranks on this one GPU (NCCL_HOSTID per rank): NCCL really chooses, so the profiler plugin's
  # report and the tuner plugin's rules show in the agent's rows (check_nccl.py real-pair*).
  pair_bin=$(find "$build_dir/tests" -name nccl-pair -type f | head -n 1)
  plugins=(--profiler "$build_dir/plugins/nccl-profiler/libnccl-profiler-gradscope.so"
    --tuner "$build_dir/plugins/nccl-tuner/libnccl-tuner-gradscope.so")
  for mode in real-pair real-pair-graph real-pair-p2p real-pair-explore real-pair-shadow; do
    python3 tests/agent/nccl/check_nccl.py --agent "$agent_so" --job "$pair_bin" --gradscope "$gradscope_bin" \
      "${plugins[@]}" --workdir "$out_dir/agent_nccl-${mode#real-}" "$mode" >>"$out_dir/agent_nccl.log" 2>&1 ||
      agent_status=1
  done
  if [ "$agent_status" -ne 0 ]; then
    grep 'FAIL' "$out_dir/agent_nccl.log" | head -n 10 >&2 || true
    say "agent NCCL check FAILED; see $out_dir/agent_nccl.log"
    echo "agent:  NCCL job FAILED (agent_nccl.log)" >>"$out_dir/summary.txt"
    grep 'FAIL' "$out_dir/agent_nccl.log" | head -n 10 >>"$out_dir/summary.txt" || true
    status=1
  else
    echo "agent:  NCCL jobs ok: exact calls, GPU spans, NVTX steps; two ranks: NCCL's choices, the tuner's rules, explore, apply (bf16 wire, async/stale1, async/dga1) (agent_nccl.log)" >>"$out_dir/summary.txt"
  fi

  # gradscope bench against an independent nccl-tests-style loop, and what the agent's GPU timing costs.
  if [ "${GRADSCOPE_SKIP_BENCH:-0}" != 1 ]; then
    say "gradscope bench against an nccl-tests-style loop; costs of the agent's GPU primitives"
    python3 bench/nccl_compare.py --gradscope "$gradscope_bin" --loop "$build_dir/bench/gradscope_nccl_tests_allreduce" \
      --runs 5 -b 8 -e 256M -n 1000 -w 50 >"$out_dir/nccl_compare.txt" 2>&1 || status=1
    "$build_dir/bench/gradscope_gpu_timing_costs" >"$out_dir/gpu_timing_costs.txt" 2>&1 || status=1
    echo "bench:  $(tail -n 1 "$out_dir/nccl_compare.txt") (nccl_compare.txt); gpu_timing_costs.txt" >>"$out_dir/summary.txt"
    # What the agent adds to an NCCL call: 8 B (launch-bound) and 64 MiB, bare, under the agent (CUPTI's
    # spans) and with timing events (GRADSCOPE_CUPTI=0), interleaved rounds.
    python3 bench/nccl_overhead.py "$build_dir" --rounds 5 --out "$out_dir/nccl_overhead" \
      >"$out_dir/nccl_overhead.txt" 2>&1 || status=1
    grep -E "^host time" "$out_dir/nccl_overhead.txt" | sed 's/^/bench:  /' >>"$out_dir/summary.txt" || true
  fi

  # PyTorch DDP, one rank, under the agent with the NVTX step marker; then `gradscope report` on the trace.
  if python3 -c 'import torch, torch.distributed as d; assert torch.cuda.is_available() and d.is_nccl_available()' \
    >/dev/null 2>&1; then
    say "agent on a one-rank PyTorch DDP job"
    ddp_dir=$out_dir/agent_ddp
    rm -rf "$ddp_dir" && mkdir -p "$ddp_dir"
    ddp_status=0
    env LD_PRELOAD="$agent_so" GRADSCOPE_OUTPUT="$ddp_dir/trace-%p.db" GRADSCOPE_STEP_NVTX=step \
      NVTX_INJECTION64_PATH="$agent_so" python3 -c '
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29531", rank=0, world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
ddp = DDP(model, device_ids=[0], bucket_cap_mb=1)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
for step in range(5):
    torch.cuda.nvtx.range_push("step")
    x, y = torch.randn(64, 256, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
dist.destroy_process_group()
print("ddp: done, loss %.4f" % loss.item())
' >"$ddp_dir/ddp.log" 2>&1 || ddp_status=$?
    trace=$(find "$ddp_dir" -name "trace-*.db" -type f | head -n 1)
    if [ "$ddp_status" -eq 0 ] && [ -n "$trace" ] && "$gradscope_bin" report "$trace" >"$ddp_dir/report.txt" 2>&1; then
      # At least one NCCL all-reduce in each of the 5 steps, with a GPU span, on a CUDA device.
      if python3 - "$trace" >>"$ddp_dir/ddp.log" 2>&1 <<'PYTHON'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT step, count(*), min(end_ns - start_ns) FROM calls WHERE api = 16 GROUP BY step").fetchall()
device = db.execute("SELECT device FROM ranks").fetchone()[0]
print("ddp: all-reduces per step (step, calls, shortest span ns):", rows, "device:", device)
steps = [row for row in rows if row[0] is not None]
sys.exit(0 if len(steps) >= 5 and all(row[2] > 0 for row in steps) and device.startswith("cuda") else 1)
PYTHON
      then
        echo "agent:  PyTorch DDP ok (agent_ddp/report.txt)" >>"$out_dir/summary.txt"
      else
        say "agent DDP check FAILED (expected NCCL all-reduces in 5 NVTX steps); see $ddp_dir/ddp.log"
        echo "agent:  PyTorch DDP FAILED: no all-reduces per step in the trace (agent_ddp/ddp.log; NCCL linked statically into torch?)" >>"$out_dir/summary.txt"
        status=1
      fi
    else
      tail -n 10 "$ddp_dir/ddp.log" >&2
      say "agent DDP job FAILED (exit $ddp_status); see $ddp_dir/ddp.log"
      echo "agent:  PyTorch DDP FAILED (exit $ddp_status; agent_ddp/ddp.log)" >>"$out_dir/summary.txt"
      status=1
    fi

    # The step model's GPU windows on samples/pytorch_ddp (one rank, NVTX-marked steps): the ms per step bare,
    # under the agent with kernel records only around the windows (GRADSCOPE_CUPTI=windows) and with CUPTI
    # timing every call (the default), 5 rounds interleaved; the merged trace must hold GPU-measured steps.
    say "step model: GPU windows on a one-rank PyTorch DDP job"
    win_dir=$out_dir/agent_windows
    rm -rf "$win_dir" && mkdir -p "$win_dir"
    win_status=0
    for round in $(seq "${GRADSCOPE_WINDOWS_ROUNDS:-5}"); do
      for kind in bare windows cupti; do
        mkdir -p "$win_dir/$kind-$round"
        case $kind in
          bare) agent_env=() ;;
          windows) agent_env=(LD_PRELOAD="$agent_so" NVTX_INJECTION64_PATH="$agent_so" GRADSCOPE_CUPTI=windows) ;;
          cupti) agent_env=(LD_PRELOAD="$agent_so" NVTX_INJECTION64_PATH="$agent_so") ;;
        esac
        env "${agent_env[@]}" GRADSCOPE_OUTPUT="$win_dir/$kind-$round/trace-%p.db" GRADSCOPE_STEP_NVTX=train_step \
          GRADSCOPE_GPU_WINDOWS=4/50 \
          torchrun --nproc_per_node=1 samples/pytorch_ddp/train.py --steps 400 --print-every 0 \
          >"$win_dir/$kind-$round/train.log" 2>&1 || win_status=1
      done
    done
    "$gradscope_bin" merge "$win_dir"/windows-1/trace-*.db -o "$win_dir/windows.db" >/dev/null 2>&1 || win_status=1
    if [ "$win_status" -eq 0 ] && python3 - "$win_dir" >"$win_dir/summary.txt" 2>&1 <<'PYTHON'
import glob, re, sqlite3, statistics, sys
d = sys.argv[1]
ms = {}
for kind in ("bare", "windows", "cupti"):
    for log in sorted(glob.glob(f"{d}/{kind}-*/train.log")):
        ms.setdefault(kind, []).append(float(re.search(r"\(([0-9.]+) ms per step\)", open(log).read()).group(1)))
bare = statistics.median(ms["bare"])
for kind in ("windows", "cupti"):
    ratios = [a / b for a, b in zip(ms[kind], ms["bare"])]
    print(f"{kind}: {statistics.median(ms[kind]):.3f} ms per step against {bare:.3f} bare; ratio median "
          f"{statistics.median(ratios):.4f} (min {min(ratios):.4f}, max {max(ratios):.4f})")
db = sqlite3.connect(f"{d}/windows.db")
rows = db.execute("SELECT basis, count(*), avg(exposed_ns), avg(hidden_ns), avg(idle_ns), avg(end_ns - start_ns) "
                  "FROM steps GROUP BY basis").fetchall()
print("steps by basis (basis, rows, mean exposed, hidden, idle, span ns):", rows)
sys.exit(0 if any(r[0] == 1 and r[1] >= 8 for r in rows) else 1)
PYTHON
    then
      echo "agent:  step model GPU windows ok: $(head -n 2 "$win_dir/summary.txt" | tr '\n' ';') (agent_windows/summary.txt)" >>"$out_dir/summary.txt"
    else
      say "step model GPU windows check FAILED; see $win_dir"
      echo "agent:  step model GPU windows FAILED (agent_windows/)" >>"$out_dir/summary.txt"
      status=1
    fi

    # samples/pytorch_ddp with two ranks on this GPU (NCCL_HOSTID per rank, LOCAL_RANK 0 for both) under
    # `gradscope run --mode explore`, the budget lifted: both ranks time every strategy on the same DDP
    # buckets, and `gradscope recommend` reads the trace.
    ddp2_job=(torchrun --nproc_per_node=2 --no-python bash -c
      'export NCCL_HOSTID=gradscope-ddp-$RANK LOCAL_RANK=0 NCCL_SOCKET_IFNAME=lo; exec python3 samples/pytorch_ddp/train.py "$@"'
      ddp2)
    say "agent exploring a two-rank PyTorch DDP job (one GPU)"
    ddpx_dir=$out_dir/agent_ddp2-explore
    rm -rf "$ddpx_dir" && mkdir -p "$ddpx_dir"
    ddpx_status=0
    GRADSCOPE_EXPLORE_WARMUP=0 GRADSCOPE_AGENT_PATH="$agent_so" "$gradscope_bin" run --mode explore \
      --explore-budget 1 -o "$ddpx_dir/run" -- "${ddp2_job[@]}" --steps 40 --print-every 20 \
      >"$ddpx_dir/ddp2.log" 2>&1 || ddpx_status=$?
    if [ "$ddpx_status" -eq 0 ] && python3 - "$ddpx_dir/run/trace.db" >>"$ddpx_dir/ddp2.log" 2>&1 <<'PYTHON' &&
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT r.rank, m.strategy, count(*), max(m.rel_l2_error), min(m.median_ns) FROM measurements m "
                  "JOIN calls c ON c.id = m.call_id JOIN ranks r ON r.id = c.rank_id GROUP BY 1, 2").fetchall()
print("ddp2 explore: (rank, strategy, samples, worst rel error, fastest median ns; async: errors only):")
for row in rows:
    print("  ", row)
ranks = {row[0] for row in rows}
strategies = {row[1] for row in rows}
lossless = all(row[3] < 1e-5 for row in rows if row[1] in ("sum/native", "sum/rs_ag"))
sys.exit(0 if ranks == {0, 1} and {"sum/native", "sum/rs_ag", "sum/native/bf16"} <= strategies and lossless
         and all(row[4] > 0 for row in rows if not row[1].startswith("async/")) else 1)
PYTHON
      "$gradscope_bin" recommend "$ddpx_dir/run/trace.db" >"$ddpx_dir/recommend.txt" 2>&1; then
      echo "agent:  two-rank PyTorch DDP explored and recommended: $(grep -c . "$ddpx_dir/recommend.txt") lines (agent_ddp2-explore/)" >>"$out_dir/summary.txt"
    else
      say "two-rank DDP explore check FAILED (exit $ddpx_status); see $ddpx_dir"
      echo "agent:  two-rank PyTorch DDP explore FAILED (agent_ddp2-explore/ddp2.log)" >>"$out_dir/summary.txt"
      status=1
    fi

    # The same job under `gradscope run --mode apply`: NCCL loads both plugins, every NCCL call gets
    # NCCL's algorithm and protocol, and the all-reduces the plan's Ring/Simple.
    say "agent and both NCCL plugins on a two-rank PyTorch DDP job (one GPU)"
    ddp2_dir=$out_dir/agent_ddp2
    rm -rf "$ddp2_dir" && mkdir -p "$ddp2_dir"
    cat >"$ddp2_dir/plan.json" <<'JSON'
{"format": "gradscope-recommendation", "version": 1, "backend": "nccl",
 "rules": [{"api": "ncclAllReduce", "dtype": "fp32", "min_bytes": 0, "max_bytes": 1073741824,
            "strategy": "sum/nccl.ring.simple", "error_class": "lossless"}]}
JSON
    ddp2_status=0
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING GRADSCOPE_AGENT_PATH="$agent_so" \
      "$gradscope_bin" run --mode apply --recommendation "$ddp2_dir/plan.json" -o "$ddp2_dir/run" -- \
      "${ddp2_job[@]}" --steps 40 --print-every 20 >"$ddp2_dir/ddp2.log" 2>&1 || ddp2_status=$?
    if [ "$ddp2_status" -eq 0 ] && python3 - "$ddp2_dir/run/trace.db" "$ddp2_dir/ddp2.log" >>"$ddp2_dir/ddp2.log" 2>&1 <<'PYTHON'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
log = open(sys.argv[2]).read()
rows = db.execute("SELECT c.api, g.algo, g.proto, count(*) FROM calls c LEFT JOIN gpu_calls g ON g.call_id = c.id "
                  "GROUP BY 1, 2, 3").fetchall()
drops = db.execute("SELECT kind, sum(count) FROM drops GROUP BY kind").fetchall()
print("ddp2: (api, algo, proto, calls):", rows, "drops:", drops)
loaded = all(line in log for line in ("PROFILER/Plugin: Loaded gradscope", "TUNER/Plugin: Using gradscope"))
facts = all(algo is not None for _, algo, _, _ in rows)
planned = all((algo, proto) == (1, 2) for api, algo, proto, _ in rows if api == 16)  # Ring / Simple
sys.exit(0 if loaded and facts and planned and not drops and db.execute("SELECT count(*) FROM ranks").fetchone()[0] == 2 else 1)
PYTHON
    then
      echo "agent:  two-rank PyTorch DDP with both plugins ok (agent_ddp2/ddp2.log)" >>"$out_dir/summary.txt"
    else
      say "two-rank DDP check FAILED (exit $ddp2_status); see $ddp2_dir/ddp2.log"
      echo "agent:  two-rank PyTorch DDP with both plugins FAILED (agent_ddp2/ddp2.log)" >>"$out_dir/summary.txt"
      status=1
    fi
  else
    say "agent DDP check skipped: no PyTorch with CUDA and NCCL (python3 -c 'import torch')"
    echo "agent:  PyTorch DDP skipped (no torch with CUDA and NCCL)" >>"$out_dir/summary.txt"
  fi
fi

say "summary ($out_dir/summary.txt):"
cat "$out_dir/summary.txt"
exit "$status"
