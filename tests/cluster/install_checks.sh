# Sourced by tests/cluster/e2e_cluster.sh after the install (skipped by `make demo-cluster`,
# E2E_CHECKS=demo): the identity path, the example service, `interference top`, the password
# rotation and the figures of memory and signal age. It uses the script's variables and
# functions (NS, NODE, STATE, kctl, actl, redis_cli, wait_for, mark, fail, ...).
# shellcheck shell=bash

# --- identity: each node speaks only for itself (docs/design.md §4.2) ---------------------
# The agent logged in as agent:<node>, a user the issuer made after the API server reviewed
# the agent's projected token; the user may touch only this node's keys.
all_agent_users=$(redis_cli ACL LIST | grep '^user agent:' || true)
[[ $(sort <<<"$all_agent_users" | cut -d' ' -f2 | tr '\n' ' ') == "$(printf 'agent:%s ' "${WORKER_NODES[@]}")" ]] \
    || fail "Redis should have exactly the ACL users agent:{${WORKER_NODES[*]}}, has: ${all_agent_users:-none}"
acl_users=$(grep "^user agent:$NODE " <<<"$all_agent_users")
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
# checks wait for it to go. Only the issuer creates agent:$NODE, so the user in the new
# Redis is the issuer's new issue (its log would not do: a restarted container's is new).
issuer_restarts() {
    kctl get pod -l app.kubernetes.io/name=interference-credentials \
        -o jsonpath='{range .items[*]}{.status.containerStatuses[0].restartCount}{" "}{end}'
}
restarts_before=$(issuer_restarts)
old_redis=$(kctl get pod -l app.kubernetes.io/name=redis -o jsonpath='{.items[*].metadata.name}')
restart_started=$SECONDS
kctl rollout restart deploy/redis >/dev/null
kctl rollout status deploy/redis --timeout=300s >/dev/null || fail "Redis did not come back"
for pod in $old_redis; do
    wait_for 120 "the old Redis pod $pod to go" bash -c "! kubectl -n $NS get pod $pod"
done
redis_back=$((SECONDS - restart_started))
agent_user() { [[ $(redis_cli ACL LIST | grep -c "^user agent:$NODE ") -eq 1 ]]; }
wait_for 120 "the issuer creating agent:$NODE in the restarted Redis (issuer container restarts before: $restarts_before)" agent_user
wait_for 120 "the agent publishing again after Redis restarted" record_age 3
mark "Redis restarted (back in $redis_back s): the agent enrolled again (record $(record_age 3) s old; issuer restarts $restarts_before→$(issuer_restarts))"

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
EX_NODE=$(kubectl -n "$EX_NS" get pod "$EX_POD" -o jsonpath='{.spec.nodeName}')
mark "example $EX_NS/$EX_POD bound by interference-scheduler to $EX_NODE and Running"

wait_for 60 "the agent's report naming $EX_NS/$EX_POD" bash -c \
    "kubectl -n $NS exec deploy/redis -- redis-cli SMEMBERS '$(key node_pods_key "$EX_NODE")' | grep -qx '$EX_NS/$EX_POD'"
# The agent found the pod by its cgroup (kubelet's cgroupfs layout, kubepods[/qos]/pod<uid>)
# and named it through its pod watch: the row's uid and QoS class come from that path.
EX_UID=$(kubectl -n "$EX_NS" get pod "$EX_POD" -o jsonpath='{.metadata.uid}')
EX_QOS=$(kubectl -n "$EX_NS" get pod "$EX_POD" -o jsonpath='{.status.qosClass}')
pod_cgroup=$({ find "/sys/fs/cgroup/unified/$CGROUP_PARTITION" "/sys/fs/cgroup/$CGROUP_PARTITION" -maxdepth 4 -type d \
    -name "pod$EX_UID" 2>/dev/null || true; } | head -1)
[[ -n $pod_cgroup ]] || fail "no kubelet cgroup pod$EX_UID for $EX_NS/$EX_POD"
POD_KEY=$(key pod_key "$EX_NODE" "$EX_NS" "$EX_POD")
row_uid=$(redis_cli HGET "$POD_KEY" uid)
row_qos=$(redis_cli HGET "$POD_KEY" qos)
[[ $row_uid == "$EX_UID" ]] || fail "the agent's row for $EX_NS/$EX_POD has uid '$row_uid', not $EX_UID"
[[ ${row_qos,,} == "${EX_QOS,,}" ]] || fail "the agent's row for $EX_NS/$EX_POD has QoS '$row_qos', not $EX_QOS"
mark "agent names $EX_NS/$EX_POD (uid and QoS $row_qos from the kubelet cgroup ${pod_cgroup#/sys/fs/cgroup/})"
kubectl delete -k "$STATE/example" --wait=true --timeout=120s >/dev/null

# interference top through kubectl port-forward, as the viewer user (docs/operations.md,
# "Secrets and Redis users").
PF_PORT=$(free_port)
start port-forward kubectl -n "$NS" port-forward svc/redis "$PF_PORT:6379" --address 127.0.0.1
wait_for 30 "kubectl port-forward" bash -c "exec 3<>/dev/tcp/127.0.0.1/$PF_PORT"
top_out=$(REDIS_USERNAME=interference-viewer REDIS_PASSWORD_FILE=$STATE/viewer.password \
    REDIS_CA_FILE=$STATE/viewer-ca.crt \
    .venv/bin/interference --redis-url "rediss://127.0.0.1:$PF_PORT/0" top 2>&1) \
    || fail "interference top through port-forward failed: $top_out"
for node in "${WORKER_NODES[@]}"; do
    grep -q "$node" <<<"$top_out" || fail "interference top does not list $node: $top_out"
done
stop_pid "${PIDS[port-forward]}" port-forward
mark "interference top through kubectl port-forward lists ${WORKER_NODES[*]} (TLS, viewer's Secret)"

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
agent_cg=$({ find "/sys/fs/cgroup/unified/$CGROUP_PARTITION" "/sys/fs/cgroup/memory/$CGROUP_PARTITION" -type d -name "$agent_cid" 2>/dev/null || true; } | tr '\n' ' ')
for cg in $agent_cg; do
    if [[ -r $cg/memory.peak ]]; then log "agent container memory.peak $(($(cat "$cg/memory.peak") / 1048576)) MiB, memory.current $(($(cat "$cg/memory.current") / 1048576)) MiB"; fi
    if [[ -r $cg/memory.max_usage_in_bytes ]]; then
        log "agent container max_usage $(($(cat "$cg/memory.max_usage_in_bytes") / 1048576)) MiB, limit $(($(cat "$cg/memory.limit_in_bytes") / 1048576)) MiB, failcnt $(cat "$cg/memory.failcnt"), rss $(($(awk '$1=="total_rss"{print $2}' "$cg/memory.stat") / 1048576)) MiB"
    fi
done
# The credential issuers' memory after the enrolments above (a figure for their requests).
for pod in $(kctl get pod -l app.kubernetes.io/name=interference-credentials -o jsonpath='{.items[*].metadata.name}'); do
    cid=$(kctl get pod "$pod" -o jsonpath='{.status.containerStatuses[0].containerID}')
    for cg in $({ find "/sys/fs/cgroup/unified/$CGROUP_PARTITION" "/sys/fs/cgroup/memory/$CGROUP_PARTITION" -type d -name "${cid#containerd://}" 2>/dev/null || true; }); do
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
