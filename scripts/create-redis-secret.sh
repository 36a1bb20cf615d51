#!/bin/sh
# Creates the Secret redis-credentials (namespace interference-system, type
# kubernetes.io/basic-auth) with a random password for each Redis user: username/password
# (admin), credentials-password (the credential issuer, which creates each agent's own
# user), scheduler-password, viewer-password. Run it once per cluster,
# before `kubectl apply -k deploy/` (docs/operations.md, Install). deploy/ holds only a
# data-less stub of this Secret, which the API server refuses to create on its own: without
# this script's Secret the apply fails with `The Secret "redis-credentials" is invalid`.
#
#   scripts/create-redis-secret.sh            create it (an existing Secret is kept; a key
#                                             it lacks, e.g. credentials-password in one
#                                             made before the issuer, is added)
#   scripts/create-redis-secret.sh --rotate   replace it with new passwords (also converts a
#                                             Secret of an older type, which kubectl cannot
#                                             change in place)
#   scripts/create-redis-secret.sh --print    print it as YAML, touch no cluster
#
# Environment: NAMESPACE (default interference-system), KUBECTL (default kubectl), and
# ADMIN_PASSWORD / CREDENTIALS_PASSWORD / SCHEDULER_PASSWORD / VIEWER_PASSWORD to use given
# passwords instead of random ones (an external Redis whose users already exist).
# Passwords are never printed except with --print.
set -eu

NAMESPACE=${NAMESPACE:-interference-system}
KUBECTL=${KUBECTL:-kubectl}
SECRET=redis-credentials
# The stub in deploy/base/redis/credentials.yaml has this type; a type is immutable.
TYPE=kubernetes.io/basic-auth
MODE=create
case "${1:-}" in
    "") ;;
    --rotate) MODE=rotate ;;
    --print) MODE=print ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "create-redis-secret.sh: unknown option $1 (use --rotate, --print or --help)" >&2
       exit 2 ;;
esac

random_password() {  # 48 hex characters (192 bits) from the kernel's CSPRNG
    od -An -N24 -tx1 /dev/urandom | tr -d ' \n'
}

ADMIN=${ADMIN_PASSWORD:-$(random_password)}
CREDENTIALS=${CREDENTIALS_PASSWORD:-$(random_password)}
SCHEDULER=${SCHEDULER_PASSWORD:-$(random_password)}
VIEWER=${VIEWER_PASSWORD:-$(random_password)}
for value in "$ADMIN" "$CREDENTIALS" "$SCHEDULER" "$VIEWER"; do
    if [ "${#value}" -lt 16 ]; then
        echo "create-redis-secret.sh: a given password is shorter than 16 characters" >&2
        exit 2
    fi
done

secret_yaml() {  # the passwords go through stdin, never on a command line (ps)
    "$KUBECTL" create secret generic "$SECRET" --namespace "$NAMESPACE" --type "$TYPE" \
        --from-env-file=/dev/stdin --dry-run=client -o yaml <<END
username=admin
password=$ADMIN
credentials-password=$CREDENTIALS
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
RESTART="kubectl -n $NAMESPACE rollout restart deploy/redis deploy/interference-credentials deploy/interference-scheduler"
if existing=$("$KUBECTL" --namespace "$NAMESPACE" get secret "$SECRET" -o 'jsonpath={.type}' 2>/dev/null); then
    if [ "$MODE" != rotate ]; then
        if [ "$existing" != "$TYPE" ]; then
            echo "create-redis-secret.sh: secret $NAMESPACE/$SECRET exists with type" \
                 "${existing:-Opaque}, made by an older release; deploy/ needs type $TYPE" \
                 "with the admin password under the key password, and a Secret's type cannot" \
                 "change: run scripts/create-redis-secret.sh --rotate to recreate it with new" \
                 "passwords (with ADMIN_PASSWORD=... CREDENTIALS_PASSWORD=... SCHEDULER_PASSWORD=..." \
                 "VIEWER_PASSWORD=... to keep the current ones)" >&2
            exit 1
        fi
        # A Secret made before the credential issuer lacks its key: add it (a random
        # password, through stdin), keep every other one.
        if [ -z "$("$KUBECTL" --namespace "$NAMESPACE" get secret "$SECRET" \
                -o 'jsonpath={.data.credentials-password}' 2>/dev/null)" ]; then
            "$KUBECTL" --namespace "$NAMESPACE" patch secret "$SECRET" --type merge \
                --patch-file /dev/stdin >/dev/null <<END
{"stringData": {"credentials-password": "$CREDENTIALS"}}
END
            echo "secret $NAMESPACE/$SECRET exists; added credentials-password (the" \
                 "credential issuer's), kept the rest; restart Redis: kubectl -n $NAMESPACE" \
                 "rollout restart deploy/redis"
            exit 0
        fi
        echo "secret $NAMESPACE/$SECRET exists; kept (use --rotate for new passwords)"
        exit 0
    fi
    if [ "$existing" = "$TYPE" ]; then
        secret_yaml | "$KUBECTL" replace -f - >/dev/null
    else  # the type is immutable: replace cannot convert, delete and create can
        "$KUBECTL" --namespace "$NAMESPACE" delete secret "$SECRET" >/dev/null
        secret_yaml | "$KUBECTL" create -f - >/dev/null
        echo "secret $NAMESPACE/$SECRET had type ${existing:-Opaque}; recreated as $TYPE"
    fi
    echo "secret $NAMESPACE/$SECRET replaced with new passwords; restart Redis, the agents" \
         "and the scheduler: $RESTART"
    exit 0
fi
secret_yaml | "$KUBECTL" create -f - >/dev/null
echo "created secret $NAMESPACE/$SECRET with random passwords for admin, the credential" \
     "issuer, scheduler and viewer"
