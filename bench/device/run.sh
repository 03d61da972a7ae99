#!/bin/bash
# Runs on a GPU machine from the repository root, with .device/ carried there
# by bench/device/prepare.sh. Builds moea2a from the tarball against that machine's
# CUDA, the NCCL inside its PyTorch install and its UCX (headers from the carried
# .deb); runs `make check` (GPU tests included), the GPU test under compute-sanitizer
# (memcheck, racecheck), and the benchmarks; every log lands in $OUT. After the build,
# bench/device/convert_check.cu checks the combine's 16-bit rounding on every float,
# bench/device/combine_check.cu its sums of 2-4 rows in every way, on one GPU.
# Variables: ARCH (default 90), REUSE=1 keeps the build an earlier call on the same warm
# machine left, KCHECK=0 skips convert_check and combine_check, CHECK=0 skips make check, SANITIZE=0 skips
# compute-sanitizer, CHECK_TESTS limits make check to those tests, RANKS (default "2 4"),
# TOKENS (default 128,1024,4096), ITERS, BENCH=0 skips the benchmarks, SMS_CURVE ("16 24
# 32 48") the load/store path at those SM budgets in one run (moea2a_perf --sms; SPLIT=1
# adds --split: the split halves and their overlap with a GEMM), GENERIC=1 the generic path next to it,
# SANITIZE_TESTS the tests run under compute-sanitizer, then combine_check quick (with
# SANITIZE_TOOLS, default "memcheck racecheck", and SANITIZE_TIMEOUT per run); SANITIZE_PARTS="tool:GPUs:points
# ..." instead runs test_gpu's quick mode in those parts at once (e.g. "memcheck:0,1:1-17
# memcheck:2,3:18- racecheck:0,1:1-", points as TAP_POINTS of tests/tap.h), PROFILE=1 builds with the
# load/store kernels' phase profile (-DM2A_FAST_PROFILE: each context prints its
# phase medians to stderr when destroyed), VARIANTS="flags;flags" reruns the 4-GPU benchmark
# with the load/store kernels rebuilt with each set of NVCCFLAGS (an A/B of kernel flags; at
# the SM budgets VARIANT_SMS="16,24" when set; VARIANT_ARGS: more moea2a_perf options),
# FLOORS="sms:MiB:chunk:issuers ..." first measures the floors under the benchmark's
# numbers (NVLink ceilings, an event-timed empty kernel: bench/device/floors.cu) with
# each of those settings, e.g. FLOORS="48:64:14336:3". NETWORK=0 skips the run with
# NCCL forced onto its network transport (as ranks on two nodes see each other): the
# GPU tests (NETWORK_TESTS, default tests/test_gpu) and moea2a_perf --check 1 on the
# default path, which must fall back to the generic path (done in every run unless
# turned off). With a base tarball staged
# (prepare.sh BASE=<rev>), the A/B block builds it too and runs the same benchmarks
# with both builds, alternating, AB_ROUNDS times (default 3): on AB_RANKS GPUs (default
# 2; "2 4": each), AB_TOKENS (default 128,4096), at the SM budgets AB_SMS when set (AB_ARGS: more
# moea2a_perf options; AB_ARGS_SETS="opts;opts": each set in turn, tagged s0, s1, ...), and --op
# fp4 on one GPU; AB=0 skips it. WIRE=0 skips quantize
# on dispatch (--wire fp8, fp8-ue8m0, nvfp4 with --baseline, at WIRE_TOKENS).
# EXPERT=0 skips the expert-major layout next to rank-major (EXPERT_RANKS GPUs, default
# FP4RANKS; EXPERT_TOKENS, default 128,4096); BENCH=expert runs only that benchmark.
# GEMM=0 skips the FP4 expert GEMM next to cuBLAS (1 GPU; GEMM_ARGS adds moea2a_perf
# options; GEMM_MMA=1 repeats it on mma.sync); BENCH=gemm runs only that one. CE=0 skips copy-engine mode next to the fused
# kernels (--engine ce / sm, checked; CE_RANKS GPUs, default FP4RANKS; CE_TOKENS,
# default 128,1024,4096; at the SM budgets CE_SMS, default "8,48"); BENCH=ce runs only
# that one. BENCH=cwire runs only the FP8 combine wire next to rows as they are (CWIRE_RANKS,
# default "2 4"; CWIRE_TOKENS, default 128,4096; CWIRE_ROUNDS, default 2; CWIRE_ENV, e.g.
# MOEA2A_NVLINK=0 for the generic path), checked; CWIRE=1
# adds it to a full run. DECODE="2 4" times the decode sizes (DECODE_TOKENS, default 1,8,32,128,256,512,
# 1024,4096) on those GPU counts with the CUPTI kernel times, once per assignment in DECODE_ENVS
# ("MOEA2A_X=1 MOEA2A_X=2": a run with each in the environment); PHASE_RANKS="2 4" builds the
# tarball a second time with the phase profile, alongside, and prints the phases there at
# PHASE_TOKENS (default 1,128,1024), rank PHASE_RANK's lines (default 0; "[0-9]+": every rank's), once per
# option set in PHASE_ARGS ("a;b": moea2a_perf options, an empty set for the defaults). PY=0 skips the Python package's bench (python -m moea2a.bench on PY_RANKS GPUs,
# default FP4RANKS, at PY_TOKENS, and its --overhead); BENCH=python runs only that one.
# MOVES="4 8": placement changes in place (moea2a_perf --moves MOVES_N, default 50, at
# MOVES_TOKENS, default 128) on that many ranks, ranks beyond the GPUs sharing them over
# CUDA IPC: the host's and the stream's time per change, the moved context checked.
# NODES=N: emulated nodes of N GPUs, each its own NCCL_HOSTID (NCCL's network transport
# between them): the transports NCCL chose, then the hierarchical path next to the flat
# one and the base build's flat path (NODES_TOKENS, default 128,4096; NODES_ROUNDS,
# default 2), checked; NODES_ARGS_SETS="opts;opts" runs this build's two paths once per set of
# moea2a_perf options (tagged s0, s1, ...; e.g. ";--combine-wire fp8").
set -uo pipefail
K=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=/tmp/moea2a-deps; B=/tmp/moea2a-build
# REUSE=1 keeps the build a previous call left on this (warm) machine: later calls of a
# sequence skip the configure and compile steps
reuse=0; [ "${REUSE:-0}" = 1 ] && [ -f "$B/config.status" ] && reuse=1
rm -rf "$D"; [ "$reuse" = 1 ] || rm -rf "$B"; mkdir -p "$D/nccl/lib" "$B"
W=$(python3 -c 'import importlib.util as u; print(list(u.find_spec("nvidia.nccl").submodule_search_locations)[0])' 2>/dev/null)
[ -n "$W" ] || { echo "no NCCL in the PyTorch install" | tee "$OUT/summary.log"; exit 1; }
ln -s "$W/include" "$D/nccl/include"
ln -s "$W/lib/libnccl.so.2" "$D/nccl/lib/libnccl.so.2"; ln -s "$W/lib/libnccl.so.2" "$D/nccl/lib/libnccl.so"
for f in "$K"/debs/*.deb; do [ -e "$f" ] && dpkg -x "$f" "$D/ucx"; done
for l in "$D"/ucx/usr/lib/x86_64-linux-gnu/lib*.so; do
  n=$(basename "$l"); [ -e "/usr/lib/x86_64-linux-gnu/$n.0" ] && ln -sf "/usr/lib/x86_64-linux-gnu/$n.0" "$l"
done
# cuBLAS (moea2a_perf --split loads it at run time): the toolkit's, else PyTorch's wheel
CB=$(python3 -c 'import importlib.util as u; print(list(u.find_spec("nvidia.cublas").submodule_search_locations)[0])' 2>/dev/null)
export LD_LIBRARY_PATH="$D/nccl/lib:/usr/local/cuda/lib64${CB:+:$CB/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="/usr/local/cuda/bin:$PATH"
[ "$reuse" = 1 ] || tar -C "$B" -xzf "$(ls "$K"/moea2a-*.tar.gz | head -1)" --strip-components=1
cd "$B"
modules_of() { echo "$1/transports/ucx/.libs:$1/transports/nccl/.libs:$1/cuda/.libs"; } # a build tree's modules
export MOEA2A_TRANSPORT_PATH=$(modules_of "$B")
# A second build beside this one (its callers run it in the background): side_build DIR TARBALL LOG [CPPFLAGS]
side_build() {
  rm -rf "$1"; mkdir -p "$1"; tar -C "$1" -xzf "$2" --strip-components=1
  (cd "$1" && CPPFLAGS="${4:-}" NVCCFLAGS="${4:-}" ./configure --with-cuda=/usr/local/cuda --with-cuda-arch="${ARCH:-90}" \
      --with-nccl="$D/nccl" --with-ucx="$D/ucx/usr" && make -j16) >"$3" 2>&1
}
{
  # The A/B's base build runs alongside everything before the A/B block: its compile of
  # the large kernel files overlaps this build's
  base_tar=$(ls "$K"/base/moea2a-*.tar.gz 2>/dev/null | head -1)
  BB=/tmp/moea2a-base-build; base_pid=
  if [ -n "$base_tar" ] && [ "${AB:-1}" != 0 ]; then
    side_build "$BB" "$base_tar" "$OUT/build-base.log" & base_pid=$!
  fi
  # PHASE_RANKS: the same tarball built again with the load/store kernels' phase profile,
  # alongside this build, for the phase table (PHASE_RANKS, PHASE_TOKENS) without a
  # second call
  PB=/tmp/moea2a-phase-build; phase_pid=
  if [ -n "${PHASE_RANKS:-}" ]; then
    side_build "$PB" "$(ls "$K"/moea2a-*.tar.gz | head -1)" "$OUT/build-phase.log" -DM2A_FAST_PROFILE & phase_pid=$!
  fi
  echo "== $(date -u) $(nvidia-smi -L | wc -l) GPU(s): $(nvidia-smi -L | head -1)"
  nvidia-smi topo -m 2>/dev/null | head -8
  prof=""; [ "${PROFILE:-0}" = 1 ] && prof=-DM2A_FAST_PROFILE
  [ "$reuse" = 1 ] || CPPFLAGS="$prof" NVCCFLAGS="$prof" ./configure --with-cuda=/usr/local/cuda --with-cuda-arch="${ARCH:-90}" --with-nccl="$D/nccl" --with-ucx="$D/ucx/usr" \
      >"$OUT/build.log" 2>&1 || { echo "configure failed"; tail -20 "$OUT/build.log"; exit 1; }
  tail -12 "$OUT/build.log"
  make -j16 >>"$OUT/build.log" 2>&1 || { echo "make failed"; grep -m8 -iE 'error' "$OUT/build.log"; exit 1; }
  echo "== built"
  if [ "${KCHECK:-1}" != 0 ]; then
    # the combine's 16-bit rounding: the pair instruction against convert.h on every float
    nvcc -O3 -std=c++17 -arch=sm_"${ARCH:-90}" -I. -Iinclude -Ilib -Icuda/kernels -o convert_check bench/device/convert_check.cu \
        >>"$OUT/build.log" 2>&1 && timeout 60 ./convert_check || echo "convert_check: failed (rc $?)"
    # the combine's sums of 2-4 rows (every way) with the peers' workspaces on this GPU
    nvcc -O3 -std=c++17 -arch=sm_"${ARCH:-90}" -I. -Iinclude -Ilib -Icuda/kernels -o combine_check bench/device/combine_check.cu \
        >>"$OUT/build.log" 2>&1 && timeout 300 ./combine_check || echo "combine_check: failed (rc $?)"
  fi
  if [ -n "${FLOORS:-}" ]; then
    nvcc -O3 -arch=sm_"${ARCH:-90}" -o floors bench/device/floors.cu >>"$OUT/build.log" 2>&1 || echo "floors: build failed"
    for c in $FLOORS; do IFS=: read -r sm mib chunk iss <<<"$c"; timeout 60 ./floors "$sm" "$mib" "$chunk" "$iss"; done
  fi
  if [ "${CHECK:-1}" != 0 ]; then
    MOEA2A_TEST_EXPECT_NVLINK=1 timeout "${CHECK_TIMEOUT:-1500}" make -j8 check ${CHECK_TESTS:+TESTS="$CHECK_TESTS"} >"$OUT/check.log" 2>&1
    echo "== make check rc=$?"
    grep -E '^# (TOTAL|PASS|SKIP|FAIL|ERROR):|^(FAIL|ERROR|SKIP):' "$OUT/check.log"
    for t in test_gpu test_nvlink; do
      [ -f tests/$t.log ] && { grep -E '^(ok|not ok)' tests/$t.log; grep '^# ' tests/$t.log | head -20; }
    done
    for r in $(grep -lE '^:global-test-result: (FAIL|ERROR)' tests/*.trs 2>/dev/null); do # failed tests' logs come back
      l=${r%.trs}.log; cp "$l" "$OUT/"; echo "== $l:"; grep -vE '^ok ' "$l" | tail -25
    done
  fi
  if [ "${NETWORK:-1}" != 0 ]; then
    net="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
    ngpu=$(nvidia-smi -L | wc -l)
    NL=/tmp/moea2a-nodes; rm -rf "$NL"; mkdir -p "$NL" # every rank's log; what matters goes to the summary
    echo "== NCCL on its network transport ($net): make check's GPU test, default path"
    env $net MOEA2A_TEST_EXPECT_NVLINK=0 timeout "${CHECK_TIMEOUT:-1500}" make -j8 check \
        TESTS="${NETWORK_TESTS:-tests/test_gpu}" >"$OUT/check-net.log" 2>&1
    echo "== make check (network) rc=$?"
    grep -E '^# (TOTAL|PASS|SKIP|FAIL|ERROR):|^(FAIL|ERROR):' "$OUT/check-net.log"
    [ -f tests/test_gpu.log ] && { grep -E '^(ok|not ok)' tests/test_gpu.log; grep '^# ' tests/test_gpu.log | head -12; }
    for r in $(grep -lE '^:global-test-result: (FAIL|ERROR)' tests/*.trs 2>/dev/null); do
      l=${r%.trs}.log; cp "$l" "$OUT/net-$(basename "$l")"; echo "== $l (network):"; grep -vE '^ok ' "$l" | tail -25
    done
    for n in 2 4; do
      [ "$n" -le "$ngpu" ] || continue
      echo "== moea2a_perf --mem cuda --ranks $n --check 1, NCCL on its network transport, default path"
      env $net MOEA2A_DEBUG=INFO MOEA2A_DEBUG_SUBSYS=MOE timeout 300 ./tools/moea2a_perf --moe --mem cuda --ranks "$n" \
          --tokens 128,1024 --iters 5 --warmup 2 --check 1 2>&1 | grep -E "unavailable|wrong|dispatch|combine|rror|rank [0-9]+:" | head -12
      echo "rc=${PIPESTATUS[0]}"
    done
  fi
  if [ -n "${SANITIZE_PARTS:-}" ] && [ "${SANITIZE:-1}" != 0 ]; then
    # test_gpu's quick mode in parts at once, each "tool:GPUs:points" (TAP_POINTS of
    # tests/tap.h) on its own GPUs, so that a whole sanitizer pass fits one run
    [ -e tests/test_gpu ] || make -j16 tests/test_gpu >>"$OUT/build.log" 2>&1
    pids=""
    for p in $SANITIZE_PARTS; do
      IFS=: read -r tool gpus points <<<"$p"
      CUDA_VISIBLE_DEVICES=$gpus TAP_POINTS=$points TEST_GPU_QUICK=1 timeout "${SANITIZE_TIMEOUT:-300}" \
          compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 9 --kernel-name-exclude kns=nccl \
          --report-api-errors no ./tests/test_gpu >"$OUT/sanitizer-$tool-test_gpu-$points.log" 2>&1 &
      pids="$pids $!"
    done
    for pid in $pids; do wait "$pid"; done
    for p in $SANITIZE_PARTS; do
      IFS=: read -r tool gpus points <<<"$p"; l="$OUT/sanitizer-$tool-test_gpu-$points.log"
      echo "== compute-sanitizer $tool test_gpu points $points on GPUs $gpus: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$l" | sort | uniq -c | tr '\n' ' ')"
      grep -E '^(ok|not ok)' "$l" | grep -v 'not in TAP_POINTS'; grep -E '^1\.\.' "$l" || echo "(no plan: cut off)"
    done
  elif [ "${SANITIZE:-1}" != 0 ]; then
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
      # moea2a's kernels only: NCCL's own kernels and its start-up probes of kernel
      # images for other GPUs are NCCL's business (and reported as hazards/errors).
      for t in ${SANITIZE_TESTS:-test_gpu test_nvlink}; do
        [ -e tests/$t ] || make -j16 tests/$t >>"$OUT/build.log" 2>&1 # CHECK=0 built no tests
        TEST_GPU_QUICK=1 TEST_NVLINK_ITERS=20 timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool $tool --target-processes all \
            --error-exitcode 9 --kernel-name-exclude kns=nccl --report-api-errors no ./tests/$t >"$OUT/sanitizer-$tool-$t.log" 2>&1
        echo "== compute-sanitizer $tool $t rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool-$t.log" | sort | uniq -c | tr '\n' ' ')"
        grep -E '^(ok|not ok)' "$OUT/sanitizer-$tool-$t.log"
      done
      if [ -x ./combine_check ]; then # the combine's sums of 2-4 rows, every way, a few cases
        timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool $tool --error-exitcode 9 ./combine_check quick \
            >"$OUT/sanitizer-$tool-combine_check.log" 2>&1
        echo "== compute-sanitizer $tool combine_check quick rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool-combine_check.log" | tr '\n' ' ')"
      fi
    done
  fi
  if [ "${PROFILE:-0}" = 1 ]; then
    tl=${TOKENS:-128,1024,4096}
    for t in ${tl//,/ }; do
      echo "== load/store phase profile, ${SMS_RANKS:-4} GPUs, $t tokens, MOEA2A_NUM_SMS=${MOEA2A_NUM_SMS:-48}"
      timeout 120 ./tools/moea2a_perf --moe --mem cuda --ranks "${SMS_RANKS:-4}" --tokens "$t" --iters "${ITERS:-30}" \
          --warmup 10 --check 0 2>&1 | grep -E "profile rank 0| $t "
    done
  fi
  if [ -n "${DECODE:-}" ]; then # decode sizes: event, graph and CUPTI kernel times per call
    for n in $DECODE; do
      for env in ${DECODE_ENVS:-DECODE_DEFAULTS=1}; do
        echo "== decode sizes, $n GPUs (default path, MOEA2A_NUM_SMS=${MOEA2A_NUM_SMS:-48}, $env)"
        env "$env" timeout 300 ./tools/moea2a_perf --moe --mem cuda --ranks "$n" \
            --tokens "${DECODE_TOKENS:-1,8,32,128,256,512,1024,4096}" --iters "${ITERS:-30}" --warmup 10 2>&1 |
          grep -E "^ +[0-9]+ |kernel times|rank [0-9]+:|rror"; echo "rc=${PIPESTATUS[0]}"
      done
    done
  fi
  if [ -n "${MOVES:-}" ]; then # placement changes in place: host and stream time per change, checked
    for n in $MOVES; do # ranks; more ranks than GPUs share them over CUDA IPC (UCX for the host side)
      ngpu=$(nvidia-smi -L | wc -l); share=""
      [ "$n" -gt "$ngpu" ] && share="MOEA2A_TRANSPORT=ucx MOEA2A_SYMMETRIC_MEMORY=cuda_ipc"
      echo "== placement changes, $n ranks on $([ "$n" -gt "$ngpu" ] && echo "$ngpu" || echo "$n") GPUs${share:+ ($share)}"
      env $share timeout 200 ./tools/moea2a_perf --moe --mem cuda --ranks "$n" --tokens "${MOVES_TOKENS:-128}" \
          --moves "${MOVES_N:-50}" --iters "${ITERS:-30}" --warmup 10 2>&1 | grep -E "path|placement|wrong|rror"
      echo "rc=${PIPESTATUS[0]}"
    done
  fi
  if [ -n "$phase_pid" ]; then
    if wait "$phase_pid"; then
      tp=$(modules_of "$PB")
      IFS=';' read -ra pargs <<<"${PHASE_ARGS:-}"
      [ ${#pargs[@]} = 0 ] && pargs=("")
      for n in $PHASE_RANKS; do
        for t in $(echo "${PHASE_TOKENS:-1,128,1024}" | tr , ' '); do
          for a in "${pargs[@]}"; do
            echo "== load/store phase profile, $n GPUs, $t tokens${a:+, $a} (phase build; us from each block's start)"
            MOEA2A_TRANSPORT_PATH="$tp" timeout 120 "$PB/tools/moea2a_perf" --moe --mem cuda --ranks "$n" --tokens "$t" \
                $a --iters "${ITERS:-30}" --warmup 10 --check 0 2>&1 | grep -E "profile rank ${PHASE_RANK:-0}|-kernel|graph"
          done
        done
      done
    else
      echo "== the phase build failed"; tail -15 "$OUT/build-phase.log"
    fi
  fi
  if [ -n "${PHASES:-}" ]; then
    echo "== dispatch/combine phases (MOEA2A_DEBUG=TRACE, stream synchronized at each phase)"
    MOEA2A_DEBUG=TRACE MOEA2A_DEBUG_SUBSYS=MOE timeout 120 ./tools/moea2a_perf --moe --mem cuda --ranks "$PHASES" \
        --tokens 4096 --iters 3 --warmup 2 --check 0 2>&1 | grep -E "phases" | tail -8
  fi
  if [ -n "$base_pid" ]; then
    if wait "$base_pid"; then
      echo "== A/B: base $(basename "$base_tar") vs this build, ${AB_RANKS:-2} GPUs, alternating ${AB_ROUNDS:-3} rounds"
      for round in $(seq 1 "${AB_ROUNDS:-3}"); do
        for tree in "$BB" "$B"; do
          tag=new; [ "$tree" = "$BB" ] && tag=base
          tp=$(modules_of "$tree")
          IFS=';' read -ra sets <<<"${AB_ARGS_SETS:-${AB_ARGS:-}}"
          [ ${#sets[@]} -gt 0 ] || sets=("")
          for si in "${!sets[@]}"; do
            for n in ${AB_RANKS:-2}; do
              MOEA2A_TRANSPORT_PATH="$tp" timeout 200 "$tree/tools/moea2a_perf" --moe --mem cuda --ranks "$n" \
                  --tokens "${AB_TOKENS:-128,4096}" ${AB_SMS:+--sms "$AB_SMS"} ${sets[$si]} --iters "${ITERS:-30}" \
                  --warmup 10 2>&1 |
                grep -E "num_sms|^ +[0-9]+ (dispatch|combine|roundtrip)" |
                sed "s/^/  $tag r$round ${n}g${AB_ARGS_SETS:+ s$si} /"
            done
          done
          MOEA2A_TRANSPORT_PATH="$tp" timeout 120 "$tree/tools/moea2a_perf" --op fp4 --mem cuda --ranks 1 --rows 16384 \
              --hidden 7168 --iters 20 2>&1 | grep -E "^ +(copy|quantize|dequantize)" | sed "s/^/  $tag r$round /"
        done
      done
    else
      echo "== A/B: the base build failed"; tail -15 "$OUT/build-base.log"
    fi
  fi
  if [ -n "${NODES:-}" ]; then
    # Emulated nodes of NODES GPUs, each with its own NCCL_HOSTID, so NCCL joins them
    # through its network transport (sockets on loopback) as separate hosts: the
    # hierarchical path next to the flat one (MOEA2A_HIERARCHICAL=0) and, when the A/B
    # built it, the base build's flat path, alternating NODES_ROUNDS times (default 2)
    ngpu=$(nvidia-smi -L | wc -l)
    NL=/tmp/moea2a-nodes; rm -rf "$NL"; mkdir -p "$NL" # every rank's log; what matters goes to the summary
    nodes_run() { # nodes_run TREE HIERARCHICAL TAG TOKENS ITERS [VAR=value ...]
      local tree=$1 h=$2 tag=$3 tok=$4 it=$5 port=$((20000 + RANDOM % 20000)) pids="" r rc=0 p
      shift 5
      for r in $(seq 0 $((ngpu - 1))); do
        env "$@" MOEA2A_TRANSPORT_PATH="$(modules_of "$tree")" MOEA2A_RANK="$r" MOEA2A_NRANKS="$ngpu" \
            MOEA2A_ROOT_ADDR="127.0.0.1:$port" MOEA2A_NODE_SIZE="$NODES" NCCL_HOSTID="m2a-node-$((r / NODES))" \
            NCCL_SOCKET_IFNAME=lo MOEA2A_HIERARCHICAL="$h" timeout 300 "$tree/tools/moea2a_perf" --moe --mem cuda \
            --tokens "$tok" --iters "$it" --warmup 5 --check 1 ${NODES_ARGS:-} >"$NL/nodes-$tag-$r.log" 2>&1 &
        pids="$pids $!"
      done
      for p in $pids; do wait "$p" || rc=$?; done
      grep -E "^ +[0-9]+ (dispatch|combine|roundtrip) |network|rror" "$NL/nodes-$tag-0.log" | sed "s/^/  $tag /"
      echo "  $tag rc=$rc"
    }
    echo "== emulated nodes of $NODES GPUs ($ngpu GPUs), NCCL_HOSTID per node: NCCL's transports (rank 0's log)"
    nodes_run "$B" 1 info 128 3 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,NET >/dev/null
    grep -oE "via (NET/[A-Za-z]+|P2P/[A-Za-z/]+|SHM)" "$NL/nodes-info-0.log" | sort | uniq -c
    grep -E "^ +[0-9]+ (dispatch|combine) |rror" "$NL/nodes-info-0.log" | head -4
    for round in $(seq 1 "${NODES_ROUNDS:-2}"); do
      [ -x "$BB/tools/moea2a_perf" ] && NODES_ARGS="" nodes_run "$BB" 0 "base-flat-r$round" "${NODES_TOKENS:-128,4096}" "${ITERS:-30}"
      IFS=';' read -ra nsets <<<"${NODES_ARGS_SETS:-}"
      [ ${#nsets[@]} -gt 0 ] || nsets=("")
      for si in "${!nsets[@]}"; do
        NODES_ARGS="${nsets[$si]}" nodes_run "$B" 0 "flat-r$round${NODES_ARGS_SETS:+-s$si}" "${NODES_TOKENS:-128,4096}" "${ITERS:-30}"
        NODES_ARGS="${nsets[$si]}" nodes_run "$B" 1 "hier-r$round${NODES_ARGS_SETS:+-s$si}" "${NODES_TOKENS:-128,4096}" "${ITERS:-30}"
      done
    done
  fi
  [ "${BENCH:-1}" = 0 ] && exit 0
  expert_block() {
    echo "== expert-major layout (--layout expert:128, checked) next to rank-major, ${EXPERT_RANKS:-${FP4RANKS:-4}} GPUs"
    timeout 300 ./tools/moea2a_perf --moe --mem cuda --ranks "${EXPERT_RANKS:-${FP4RANKS:-4}}" \
        --tokens "${EXPERT_TOKENS:-128,4096}" --layout expert:128 --check 1 --iters "${ITERS:-30}" --warmup 10 |
      grep -E "dispatch|combine|expert-major|wrong|rror"; echo "rc=${PIPESTATUS[0]}"
  }
  gemm_block() {
    echo "== FP4 expert GEMM next to cuBLAS bf16 grouped, 1 GPU${GEMM_ARGS:+ ($GEMM_ARGS)}"
    timeout 500 ./tools/moea2a_perf --op expert-gemm --mem cuda --ranks 1 --iters "${ITERS:-20}" --warmup 5 \
        ${GEMM_ARGS:-}; echo "rc=$?"
    if [ "${GEMM_MMA:-0}" = 1 ]; then
      echo "== the same with MOEA2A_GEMM_WGMMA=0 (mma.sync, as before sm_90a builds)"
      MOEA2A_GEMM_WGMMA=0 timeout 500 ./tools/moea2a_perf --op expert-gemm --mem cuda --ranks 1 \
          --iters "${ITERS:-20}" --warmup 5 ${GEMM_ARGS:-}; echo "rc=$?"
    fi
  }
  ce_block() {
    echo "== copy-engine mode (--engine ce) next to the fused kernels, checked, ${CE_RANKS:-${FP4RANKS:-4}} GPUs"
    for eng in sm ce; do
      timeout 300 ./tools/moea2a_perf --moe --mem cuda --ranks "${CE_RANKS:-${FP4RANKS:-4}}" --engine $eng \
          --tokens "${CE_TOKENS:-128,1024,4096}" --sms "${CE_SMS:-8,48}" --check 1 --iters "${ITERS:-30}" --warmup 10 |
        grep -E "path|num_sms|dispatch|combine|roundtrip|host|wrong|rror"; echo "rc=${PIPESTATUS[0]}"
    done
  }
  cwire_block() { # the combine's rows as they are next to the FP8 combine wire, alternating, checked
    for n in ${CWIRE_RANKS:-2 4}; do
      for round in $(seq 1 "${CWIRE_ROUNDS:-2}"); do
        for w in as-is fp8 fp8-ue8m0; do
          echo "== combine wire $w, $n GPUs, round $round${CWIRE_ENV:+, $CWIRE_ENV}"
          env ${CWIRE_ENV:-} timeout 200 ./tools/moea2a_perf --moe --mem cuda --ranks "$n" --tokens "${CWIRE_TOKENS:-128,4096}" \
              $([ $w = as-is ] || echo "--combine-wire $w") --check 1 --iters "${ITERS:-30}" --warmup 10 |
            grep -E "dispatch|combine|graph|wrong|rror"; echo "rc=${PIPESTATUS[0]}"
        done
      done
    done
  }
  python_block() { # the Python package over this build: the bench next to torch all_to_all_single, its overhead
    local py="env MOEA2A_LIBRARY=$B/lib/.libs/libmoea2a.so.1 MOEA2A_INCLUDE=$B/include PYTHONPATH=$B/python python3"
    echo "== python -m moea2a.bench, ${PY_RANKS:-${FP4RANKS:-4}} GPUs, next to torch.distributed all_to_all_single"
    timeout 300 $py -m moea2a.bench --ranks "${PY_RANKS:-${FP4RANKS:-4}}" --tokens "${PY_TOKENS:-128,1024,4096}"
    echo "rc=$?"
    echo "== python -m moea2a.bench --overhead --mem cuda (the Python layer's cost per call)"
    timeout 200 $py -m moea2a.bench --overhead --mem cuda; echo "rc=$?"
  }
  if [ "${BENCH:-1}" = python ]; then python_block; exit 0; fi
  if [ "${BENCH:-1}" = ce ]; then ce_block; exit 0; fi
  if [ "${BENCH:-1}" = cwire ]; then cwire_block; exit 0; fi
  if [ "${BENCH:-1}" = expert ]; then expert_block; exit 0; fi # that block only
  if [ "${BENCH:-1}" = gemm ]; then gemm_block; exit 0; fi
  echo "== NVFP4 and FP8 quantize/dequantize vs copy, 1 GPU"
  timeout 120 ./tools/moea2a_perf --op fp4 --mem cuda --ranks 1 --rows 16384 --hidden 7168 --iters 20; echo "rc=$?"
  timeout 120 ./tools/moea2a_perf --op fp8 --mem cuda --ranks 1 --rows 16384 --hidden 7168 --iters 20; echo "rc=$?"
  echo "== NVFP4 dispatch next to bf16, 4096 tokens, ${FP4RANKS:-4} GPUs"
  for dt in bf16 nvfp4; do
    timeout 200 ./tools/moea2a_perf --moe --mem cuda --ranks "${FP4RANKS:-4}" --tokens 4096 --dtype $dt --iters "${ITERS:-30}" \
        --warmup 10 | grep -E " 4096 |Out of"
  done
  if [ "${WIRE:-1}" != 0 ]; then
    echo "== quantize on dispatch (--wire, checked) next to quantize + dispatch (--baseline), ${FP4RANKS:-4} GPUs"
    for w in fp8 fp8-ue8m0 nvfp4; do
      timeout 200 ./tools/moea2a_perf --moe --mem cuda --ranks "${FP4RANKS:-4}" --tokens "${WIRE_TOKENS:-128,4096}" \
          --dtype bf16 --wire $w --baseline --check 1 --iters "${ITERS:-30}" --warmup 10 |
        grep -E "wire|dispatch|q\+|wrong|rror"; echo "rc=${PIPESTATUS[0]}"
    done
    # the default quantizes FP8 alongside the dispatch kernel on 2+ GPUs (first on one);
    # next to it, inside the dispatch's copies, and first
    for env in "MOEA2A_QUANT_IN_COPY=1" "MOEA2A_QUANT_OVERLAP=0"; do
      echo "== the same, FP8 with $env"
      env $env timeout 200 ./tools/moea2a_perf --moe --mem cuda --ranks "${FP4RANKS:-4}" \
          --tokens "${WIRE_TOKENS:-128,4096}" --dtype bf16 --wire fp8 --baseline --check 1 --iters "${ITERS:-30}" \
          --warmup 10 | grep -E "wire|dispatch|q\+|wrong|rror"; echo "rc=${PIPESTATUS[0]}"
    done
  fi
  [ "${EXPERT:-1}" != 0 ] && expert_block
  [ "${GEMM:-1}" != 0 ] && gemm_block
  [ "${CE:-1}" != 0 ] && ce_block
  [ "${CWIRE:-0}" != 0 ] && cwire_block
  [ "${PY:-1}" != 0 ] && python_block
  for n in ${RANKS:-2 4}; do
    echo "== moea2a_perf --mem cuda --ranks $n (default path, MOEA2A_NUM_SMS=${MOEA2A_NUM_SMS:-48})"
    timeout 300 ./tools/moea2a_perf --moe --mem cuda --ranks "$n" --tokens "${TOKENS:-128,1024,4096}" \
        --iters "${ITERS:-30}" --warmup 10 --baseline; echo "rc=$?"
  done
  if [ -n "${SMS_CURVE:-}" ]; then
    echo "== load/store path, SM budgets ${SMS_CURVE}, ${SMS_RANKS:-4} GPUs${SPLIT:+, split halves and overlap}"
    timeout 500 ./tools/moea2a_perf --moe --mem cuda --ranks "${SMS_RANKS:-4}" --sms "$(echo $SMS_CURVE | tr ' ' ,)" \
        ${SPLIT:+--split} --tokens "${TOKENS:-128,1024,4096}" --iters "${ITERS:-30}" --warmup 10 |
      grep -E "dispatch|combine|roundtrip-|path|num_sms|overlap|Out of"
  fi
  if [ -n "${GENERIC:-}" ]; then
    echo "== generic NCCL path (MOEA2A_NVLINK=0), ${SMS_RANKS:-4} GPUs"
    MOEA2A_NVLINK=0 timeout 200 ./tools/moea2a_perf --moe --mem cuda --ranks "${SMS_RANKS:-4}" \
        --tokens "${TOKENS:-128,1024,4096}" --iters "${ITERS:-30}" --warmup 10 | grep -E "dispatch|combine|path"
  fi
  if [ -n "${VARIANTS:-}" ]; then # A/B: the load/store kernels rebuilt with each flag set (last: the build
    # stays a variant's)
    IFS=';' read -ra vs <<<"$VARIANTS"
    for v in "${vs[@]}"; do
      echo "== variant NVCCFLAGS='$v', ${SMS_RANKS:-4} GPUs"
      touch cuda/kernels/moe_fast.cu
      make -j16 NVCCFLAGS="$prof $v" >>"$OUT/build.log" 2>&1 || { echo "make failed"; continue; }
      timeout 200 ./tools/moea2a_perf --moe --mem cuda --ranks "${SMS_RANKS:-4}" --tokens "${TOKENS:-128,1024,4096}" \
          ${VARIANT_SMS:+--sms "$VARIANT_SMS"} ${VARIANT_ARGS:-} --iters "${ITERS:-30}" --warmup 10 2>&1 |
        grep -E "profile rank 0|num_sms|dispatch|combine|b2b|graph|rank [0-9]+:|rror"; echo "rc=${PIPESTATUS[0]}"
    done
  fi
} 2>&1 | tee "$OUT/summary.log"
