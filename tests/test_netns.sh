#!/bin/sh
# Multi-host for real: three "hosts", each a network namespace with its own address
# (192.0.2.0/24, the documentation range, on a bridge in a fourth namespace) and its
# own UTS hostname, run moea2a_comm_init_env (authenticated with MOEA2A_KEY) and MoE
# dispatch/combine over UCX's TCP transport, checked against the reference of
# tests/moe_roundtrip.h. Then a host is killed (its link deleted, its process
# SIGKILLed): the others must fail with PEER_FAILED or TIMEOUT within
# MOEA2A_TIMEOUT_S + 1 s. Last a host is cut off (its link deleted, its process left
# running): the others learn of it from its silent watch link, then shrink without it,
# move their MoE context to the rest (moea2a_recovery(7)) and go on with checked
# round trips. Needs
# root; skips with the reason otherwise.
N=3
echo "1..4"
skip() { i=1; while [ $i -le 4 ]; do echo "ok $i # SKIP $1"; i=$((i + 1)); done; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 && command -v unshare >/dev/null 2>&1 || skip "needs ip (iproute2) and unshare (util-linux)"
tag=m2a$$
sw=${tag}sw
ip netns add $sw 2>/dev/null || skip "cannot create network namespaces here"
work=$(mktemp -d)
cleanup() {
    i=0; while [ $i -lt $N ]; do ip netns pids ${tag}h$i 2>/dev/null | xargs -r kill -9 2>/dev/null; ip netns del ${tag}h$i 2>/dev/null; i=$((i + 1)); done
    ip netns del $sw 2>/dev/null; rm -rf "$work"
}
trap cleanup EXIT INT TERM
ip -n $sw link add br0 type bridge && ip -n $sw link set br0 up || skip "cannot create a bridge"
# Host $1's link to the bridge (again, after a test cut it).
wire() {
    h=${tag}h$1
    ip link add ${tag}v$1 type veth peer name ${tag}p$1 &&
        ip link set ${tag}v$1 netns $h && ip link set ${tag}p$1 netns $sw &&
        ip -n $sw link set ${tag}p$1 master br0 up && ip -n $h link set ${tag}v$1 name eth0 &&
        ip -n $h addr add 192.0.2.$(($1 + 1))/24 dev eth0 && ip -n $h link set eth0 up && ip -n $h link set lo up
}
i=0
while [ $i -lt $N ]; do
    ip netns add ${tag}h$i && wire $i || skip "cannot wire namespace ${tag}h$i"
    i=$((i + 1))
done
prog="$top_builddir/tests/netns_rank"
export MOEA2A_NRANKS=$N MOEA2A_ROOT_ADDR=192.0.2.1:29517 MOEA2A_KEY="netns test $$" MOEA2A_SOCKET_IFNAME=eth0 \
    UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 MOEA2A_TIMEOUT_S=4

# Starts every host's rank with arguments "$1".
start() {
    i=0
    while [ $i -lt $N ]; do
        MOEA2A_RANK=$i ip netns exec ${tag}h$i unshare --uts sh -c "hostname host$i && exec \"$prog\" $1" \
            >"$work/out$i" 2>"$work/err$i" &
        eval pid$i=$!
        i=$((i + 1))
    done
}
# Waits for every host; prints their lines; returns the number that failed.
wait_all() {
    bad=0; i=0
    while [ $i -lt $N ]; do
        eval p=\$pid$i
        wait $p || { [ "$i" = "${1:--1}" ] || bad=$((bad + 1)); }
        sed "s/^/# /" "$work/out$i"; grep -v "WARN.*unreachable" "$work/err$i" | head -5 | sed "s/^/# /"
        i=$((i + 1))
    done
    return $bad
}

start 200
wait_all
r=$?
[ $r -eq 0 ] && echo "ok 1 - $N hosts (namespaces, own addresses and hostnames): init_env with a key, a node per host, 200 MoE round trips over UCX tcp exact" ||
    echo "not ok 1 - $N hosts: init_env and MoE round trips over UCX tcp ($r failed)"
hosts=$(cat "$work"/out* | sed -n 's/^\(host[0-9]*\): rank.*/\1/p' | sort -u | wc -l)
[ "$hosts" -eq $N ] && echo "ok 2 - every rank ran on its own host name ($hosts)" ||
    echo "not ok 2 - every rank ran on its own host name ($hosts of $N)"

# A host dies: its link is cut first (no FIN or RST reaches the others), then its rank.
victim=$((N - 1))
start survive
for t in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    grep -q looping "$work/out0" 2>/dev/null && grep -q looping "$work/out$victim" 2>/dev/null && break
    sleep 0.5
done
ip -n ${tag}h$victim link del eth0
ip netns pids ${tag}h$victim | xargs -r kill -9
wait_all $victim
r=$?
[ $r -eq 0 ] && echo "ok 3 - a host killed mid-run: the others fail with PEER_FAILED or TIMEOUT within MOEA2A_TIMEOUT_S + 1 s" ||
    echo "not ok 3 - a host killed mid-run: $r survivors did not fail cleanly in time"

# A host cut off: its link goes, its rank keeps running. No socket closes, so the
# others learn of it from the silence of its watch link (MOEA2A_WATCH_SILENCE_S 1 s,
# below the 4 s timeout); then they shrink without it and go on.
wire $victim || echo "# cannot wire host $victim again"
export MOEA2A_WATCH_SILENCE_S=1
start "recover $victim"
for t in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    grep -q looping "$work/out0" 2>/dev/null && grep -q looping "$work/out$victim" 2>/dev/null && break
    sleep 0.5
done
ip -n ${tag}h$victim link del eth0
wait_all $victim
r=$?
silent=$(grep -l "PEER_FAILED.*rank $victim .*silent" "$work/out0" "$work/out1" | wc -l)
grep -q "without rank $victim: rank 1 of 2" "$work/out1" && [ $r -eq 0 ] && [ "$silent" -eq 2 ] &&
    echo "ok 4 - a host cut off mid-run: the others name it from its silent watch link before the timeout, shrink without it, retarget and make 50 exact round trips" ||
    echo "not ok 4 - a host cut off mid-run: $r survivors did not recover ($silent named it from the silence)"
