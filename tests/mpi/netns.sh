#!/bin/sh
# netns.sh MPIRUN... -- PROGRAM: runs PROGRAM as two MPI ranks in two network
# namespaces joined by a veth pair, over Open MPI's TCP transport only (btl
# self,tcp: no shared memory), so every all-gather and sum of the shards
# crosses a real network stack; passes when PROGRAM does and the veth carried
# the traffic. mpirun runs in the first namespace; the second rank reaches its
# PMIx server over the veth (ptl_tcp remote connections). Exits 77 (ctest:
# skipped), saying why, where `ip netns` is missing or not permitted (no
# CAP_SYS_ADMIN / CAP_NET_ADMIN, as in most unprivileged containers), or mpirun
# is not Open MPI's.
set -u
mpirun=""
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  mpirun="$mpirun $1"
  shift
done
shift
program=$1
if ! command -v ip >/dev/null 2>&1; then
  echo "netns.sh: skipped: no ip command (iproute2)"
  exit 77
fi
case "$($mpirun --version 2>&1)" in
  *"Open MPI"* | *OpenRTE*) ;;
  *) echo "netns.sh: skipped: the test drives Open MPI's TCP transport and PMIx; this mpirun is another MPI"; exit 77 ;;
esac
tag="sxtp$$"
a="${tag}a" b="${tag}b"
if ! reason=$(ip netns add "$a" 2>&1); then
  echo "netns.sh: skipped: ip netns is not permitted here ($reason)"
  exit 77
fi
cleanup() {
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
}
trap cleanup EXIT
set -e
ip netns add "$b"
ip link add "${tag}x" type veth peer name "${tag}y"
ip link set "${tag}x" netns "$a"
ip link set "${tag}y" netns "$b"
ip -n "$a" addr add 10.231.0.1/24 dev "${tag}x"
ip -n "$b" addr add 10.231.0.2/24 dev "${tag}y"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "${tag}x" up
ip -n "$b" link set "${tag}y" up
set +e
bytes() { ip netns exec "$a" cat "/sys/class/net/${tag}x/statistics/$1_bytes"; }
tx0=$(bytes tx) rx0=$(bytes rx)
PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=10.231.0.0/24 \
  timeout -s KILL 300 ip netns exec "$a" $mpirun --mca btl self,tcp --mca btl_tcp_if_include 10.231.0.0/24 \
  -np 1 "$program" : -np 1 ip netns exec "$b" "$program"
status=$?
tx=$(( $(bytes tx) - tx0 )) rx=$(( $(bytes rx) - rx0 ))
echo "netns.sh: the veth carried $tx bytes out of and $rx bytes into rank 0's namespace"
if [ "$status" -ne 0 ]; then
  echo "netns.sh: FAIL: the ranks failed (status $status)"
  exit 1
fi
# Each rank sends its share of every output it sums: llama3-8B's case alone sums
# 3 + 8 + 2 + 2 + 2 rows of 16 KiB, 272 KiB.
if [ "$tx" -lt 262144 ] || [ "$rx" -lt 262144 ]; then
  echo "netns.sh: FAIL: under 256 KiB each way: the ranks did not sum over the veth"
  exit 1
fi
echo "netns.sh: passed"
