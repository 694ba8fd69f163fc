# Namespace "hosts" for the benchmark scripts (sourced): HOSTS network namespaces, each with one
# NIC (a veth into a bridge in a switch namespace) shaped to RATE by `tc tbf`, torn down on
# exit. Ranks of one host share its namespace (so shared memory between them), hosts talk TCP.
#   hosts_up HOSTS RATE        build them (needs root, iproute2, sch_tbf)
#   host_ns H / host_addr H    the namespace and the address of host H
#   on_host H CMD...           run CMD in host H's namespace
hosts_tag="nh$$"
hosts_count=0
host_ns() { echo "${hosts_tag}h$1"; }
host_addr() { echo "10.79.0.$(($1 + 1))"; }
on_host() { local h=$1; shift; ip netns exec "$(host_ns "$h")" "$@"; }
hosts_down() {
    local h
    for h in $(seq 0 $((hosts_count - 1))); do ip netns del "$(host_ns "$h")" 2>/dev/null || true; done
    ip netns del "${hosts_tag}sw" 2>/dev/null || true
}
hosts_up() {
    local count=$1 rate=$2 h n
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
        ip link add nic netns "$n" type veth peer name "p$h" netns "${hosts_tag}sw"
        ip -n "${hosts_tag}sw" link set "p$h" master br0
        ip -n "${hosts_tag}sw" link set "p$h" up
        ip -n "$n" link set nic up
        ip -n "$n" addr add "$(host_addr "$h")/24" dev nic
        ip netns exec "$n" tc qdisc add dev nic root tbf rate "$rate" burst 256kb latency 10ms
    done
}
