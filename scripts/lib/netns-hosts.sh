# Namespace "hosts" for the benchmark scripts (sourced): HOSTS network namespaces, each with
# NICS NICs (veths into a bridge in a switch namespace; NIC k on subnet 10.(79+k).0.0/24, named
# nic when alone, else nic0, nic1, ...) each shaped to RATE by `tc tbf`, torn down on exit.
# Ranks of one host share its namespace (so shared memory between them), hosts talk TCP.
#   hosts_up HOSTS RATE [NICS]       build them (needs root, iproute2, sch_tbf)
#   host_ns H / host_addr H [K]      the namespace of host H, its address (on NIC K, default 0)
#   on_host H CMD...                 run CMD in host H's namespace
hosts_tag="nh$$"
hosts_count=0
host_ns() { echo "${hosts_tag}h$1"; }
host_addr() { echo "10.$((79 + ${2:-0})).0.$(($1 + 1))"; }
on_host() { local h=$1; shift; ip netns exec "$(host_ns "$h")" "$@"; }
hosts_down() {
    local h
    for h in $(seq 0 $((hosts_count - 1))); do ip netns del "$(host_ns "$h")" 2>/dev/null || true; done
    ip netns del "${hosts_tag}sw" 2>/dev/null || true
}
hosts_up() {
    local count=$1 rate=$2 nics=${3:-1} h n k nic
    hosts_count=$count
    trap hosts_down EXIT
    trap "exit 130" INT TERM
    ip netns add "${hosts_tag}sw"
    ip -n "${hosts_tag}sw" link add br0 type bridge
    ip -n "${hosts_tag}sw" link set br0 up
    for h in $(seq 0 $((count - 1))); do
        n=$(host_ns "$h")
        ip netns add "$n"
        ip -n "$n" link set lo up
        for k in $(seq 0 $((nics - 1))); do
            nic=nic; [ "$nics" -gt 1 ] && nic=nic$k
            ip link add "$nic" netns "$n" type veth peer name "p${h}n$k" netns "${hosts_tag}sw"
            ip -n "${hosts_tag}sw" link set "p${h}n$k" master br0
            ip -n "${hosts_tag}sw" link set "p${h}n$k" up
            ip -n "$n" link set "$nic" up
            ip -n "$n" addr add "$(host_addr "$h" "$k")/24" dev "$nic"
            ip netns exec "$n" tc qdisc add dev "$nic" root tbf rate "$rate" burst 256kb latency 10ms
        done
    done
}
