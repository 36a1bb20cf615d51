#!/bin/sh
# Creates the Secret redis-credentials (namespace interference-system) with a random password
# for each Redis user: admin, agent, scheduler, viewer. Run it once per cluster, before
# `kubectl apply -k deploy/` (docs/operations.md, Install). Nothing in deploy/ holds a
# password; without this Secret Redis, the agents and the scheduler do not start.
#
#   scripts/create-redis-secret.sh            create it (an existing Secret is kept)
#   scripts/create-redis-secret.sh --rotate   replace it with new passwords
#   scripts/create-redis-secret.sh --print    print it as YAML, touch no cluster
#
# Environment: NAMESPACE (default interference-system), KUBECTL (default kubectl), and
# ADMIN_PASSWORD / AGENT_PASSWORD / SCHEDULER_PASSWORD / VIEWER_PASSWORD to use given
# passwords instead of random ones (an external Redis whose users already exist).
# Passwords are never printed except with --print.
set -eu

NAMESPACE=${NAMESPACE:-interference-system}
KUBECTL=${KUBECTL:-kubectl}
SECRET=redis-credentials
MODE=create
case "${1:-}" in
    "") ;;
    --rotate) MODE=rotate ;;
    --print) MODE=print ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "create-redis-secret.sh: unknown option $1 (use --rotate, --print or --help)" >&2
       exit 2 ;;
esac

random_password() {  # 48 hex characters (192 bits) from the kernel's CSPRNG
    od -An -N24 -tx1 /dev/urandom | tr -d ' \n'
}

ADMIN=${ADMIN_PASSWORD:-$(random_password)}
AGENT=${AGENT_PASSWORD:-$(random_password)}
SCHEDULER=${SCHEDULER_PASSWORD:-$(random_password)}
VIEWER=${VIEWER_PASSWORD:-$(random_password)}
for value in "$ADMIN" "$AGENT" "$SCHEDULER" "$VIEWER"; do
    if [ "${#value}" -lt 16 ]; then
        echo "create-redis-secret.sh: a given password is shorter than 16 characters" >&2
        exit 2
    fi
done

secret_yaml() {  # the passwords go through stdin, never on a command line (ps)
    "$KUBECTL" create secret generic "$SECRET" --namespace "$NAMESPACE" \
        --from-env-file=/dev/stdin --dry-run=client -o yaml <<END
admin-password=$ADMIN
agent-password=$AGENT
scheduler-password=$SCHEDULER
viewer-password=$VIEWER
END
}

if [ "$MODE" = print ]; then
    secret_yaml
    exit 0
fi

if ! "$KUBECTL" get namespace "$NAMESPACE" >/dev/null 2>&1; then
    "$KUBECTL" create namespace "$NAMESPACE" >/dev/null
    echo "created namespace $NAMESPACE"
fi
if "$KUBECTL" --namespace "$NAMESPACE" get secret "$SECRET" >/dev/null 2>&1; then
    if [ "$MODE" != rotate ]; then
        echo "secret $NAMESPACE/$SECRET exists; kept (use --rotate for new passwords)"
        exit 0
    fi
    secret_yaml | "$KUBECTL" replace -f - >/dev/null
    echo "secret $NAMESPACE/$SECRET replaced with new passwords; restart Redis, the agents" \
         "and the scheduler: kubectl -n $NAMESPACE rollout restart deploy/redis" \
         "daemonset/interference-agent deploy/interference-scheduler"
    exit 0
fi
secret_yaml | "$KUBECTL" create -f - >/dev/null
echo "created secret $NAMESPACE/$SECRET with random passwords for admin, agent, scheduler" \
     "and viewer"
