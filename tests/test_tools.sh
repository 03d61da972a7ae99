#!/bin/sh
# The tools refuse what they cannot do, naming it: moea2a_perf's options (each bad
# value named, exit 2, nothing run), moea2a_info's arguments (a stray one refused before
# anything is printed), -t FILE, -c flagging values the library refuses, -w numbers that
# do not fit, and "does not fit" as its own exit status. TAP.
build=${top_builddir:-.}; src=${top_srcdir:-.}
perf="$build/tools/moea2a_perf"; info="$build/tools/moea2a_info"
n=0; failed=0
check() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }
out=$(mktemp); trap 'rm -f "$out"' EXIT

# moea2a_perf: a bad value exits 2 at once, its message names the option and the value
for args in "--ranks 0" "--check 2" "--tokens abc --moe" "--iters 0" "--dtype foo" "--mem gpu" "--warmup -1" \
            "--layout expert:0" "--hidden 12x --moe" "--skew 2 --moe" "--sms 0 --moe" "--moves 256 --moe" "extra"; do
    "$perf" $args >"$out" 2>&1; rc=$?
    opt=${args%% *}; val=${args#* }; val=${val%% *}
    [ "$opt" = extra ] && val=extra
    [ $rc = 2 ] && grep -q -- "'$val'" "$out" && ! grep -q '^#' "$out"
    check $? "moea2a_perf $args: exit 2 naming '$val' (got $rc: $(head -1 "$out"))"
done
# --moves compares round trips of the rows as they are: refused with a quantized wire
"$perf" --moe --moves 2 --wire fp8 >"$out" 2>&1; rc=$?
[ $rc = 2 ] && grep -q -- "--moves: needs a bf16 payload as it is" "$out"
check $? "moea2a_perf --moves with --wire: exit 2 saying why (got $rc: $(head -1 "$out"))"
# placement changes timed, and the moved context's round trip equal to a fresh one's
"$perf" --moe --ranks 2 --tokens 8,64 --hidden 256 --iters 2 --warmup 1 --moves 3 >"$out" 2>&1; rc=$?
[ $rc = 0 ] && [ "$(grep -c '# *placement [0-9]* tokens: 3 changes of 256 experts.*: 0 elements differ' "$out")" = 2 ]
check $? "moea2a_perf --moves 3: a placement line per size, 0 elements differing from a context created with the map (got $rc)"
# ranks beyond the cores: a warning that says what it does to the numbers
cores=$(getconf _NPROCESSORS_ONLN)
"$perf" --ranks $((cores + 1)) --op bcast --minbytes 4 --maxbytes 4 --iters 1 --warmup 0 >"$out" 2>&1
grep -q "ranks on $cores cores" "$out"; check $? "moea2a_perf with more ranks than cores warns that times vary"
# --mem cuda without a usable GPU: one message, not one per rank
if ! "$info" -T 2>/dev/null | grep -q 'cuda .*loadable' || ! command -v nvidia-smi >/dev/null 2>&1 ||
   ! nvidia-smi -L >/dev/null 2>&1; then
    "$perf" --mem cuda --ranks 3 --moe >"$out" 2>&1; rc=$?
    [ $rc = 1 ] && [ "$(grep -c 'no usable CUDA device' "$out")" = 1 ]
    check $? "moea2a_perf --mem cuda without a GPU: exit 1 and one message (got $rc, $(grep -c 'no usable' "$out"))"
else
    check 0 "moea2a_perf --mem cuda without a GPU # SKIP this machine has one"
fi

# moea2a_info
"$info" -c extra >"$out" 2>&1; rc=$?
[ $rc = 2 ] && ! grep -q '^MOEA2A_' "$out" && grep -q "'extra'" "$out"
check $? "moea2a_info -c extra: exit 2 before printing anything (got $rc)"
"$info" -t "$src/tests/topologies/cpu-only.xml" >"$out" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "topology of .*cpu-only.xml: 1 package(s), 16 core(s)" "$out"
check $? "moea2a_info -t FILE (a space between) reads the file (got $rc)"
MOEA2A_TIMEOUT_S=abc MOEA2A_NUM_SMS=999 "$info" -c >"$out" 2>/dev/null; rc=$?
[ $rc = 1 ] && grep -q "^# INVALID: MOEA2A_TIMEOUT_S='abc'" "$out" && grep -q "^# INVALID: MOEA2A_NUM_SMS=999 is outside 0..256" "$out"
check $? "moea2a_info -c flags values the library refuses, exit 1 (got $rc)"
"$info" -c >"$out" 2>&1; rc=$?
[ $rc = 0 ] && ! grep -q INVALID "$out"; check $? "moea2a_info -c with the defaults: no INVALID line, exit 0 (got $rc)"
"$info" -w cap=99999999999 >"$out" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "cap=99999999999" "$out" && ! grep -q "max_tokens_per_rank 1215752191" "$out"
check $? "moea2a_info -w cap=99999999999 is refused, not cut to 32 bits (got $rc)"
# the workspace alone (0.88 GiB) exceeds it, with or without staging for peers that NVLink does not reach,
# so that the answer is the same on every machine
"$info" -w ep=8,cap=4096,mem=512M >"$out" 2>&1; rc=$?
[ $rc = 3 ] && grep -q "does NOT fit" "$out"; check $? "moea2a_info -w ... mem=512M that does not fit: exit 3 (got $rc)"
"$info" -w ep=8,cap=64,mem=1G >"$out" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "fits in" "$out"; check $? "moea2a_info -w ... mem=1G that fits: exit 0 (got $rc)"
# the network memory of both schemes across unequal nodes (ranks 0-3 and 4-5): rank 5, index 1
# of its node of 2, is the rail peer of sources 1 and 3 of the other node; rank 3 serves none
# (its index 3 is beyond the other node's); records of 14372 B, combine rows 14336 B, cap 1024
"$info" --workspace ep=6,ranks_per_node=4,rank=5 >"$out" 2>&1
grep -q "flat 117587968 bytes (4 ranks on other nodes.*node-aware 88190976 bytes ((1 other nodes + 2 sources served" "$out" &&
    "$info" --workspace ep=6,ranks_per_node=4,rank=3 | grep -q "node-aware 29396992 bytes ((1 other nodes + 0 sources"
check $? "moea2a_info --workspace with ranks_per_node: both schemes' network memory, rail peers of unequal nodes"
echo "1..$n"
exit $failed
