#!/bin/sh
# Writes the ACL file from users.acl.template with SHA-256 hashes of the passwords in the
# redis-credentials Secret (no plaintext password touches the disk), then starts Redis.
# The agents' users (agent:<node>) are not in it: the credential issuer creates them at run
# time (ACL SETUSER), and after a restart of Redis each agent enrols again.
# There is no default password: without the Secret the kubelet does not start this
# container (secret "redis-credentials" not found), and a missing, short or placeholder
# password stops it here, naming the Secret key. Create the Secret with
# scripts/create-redis-secret.sh (docs/operations.md, Install).
# Paths can be overridden (ACL_TEMPLATE, ACL_FILE, REDIS_CONF) so tests run this very script.
set -eu
SECRET="the redis-credentials Secret (namespace interference-system; create it with scripts/create-redis-secret.sh)"
MIN_LENGTH=16

check() {  # check VALUE KEY
    case "$1" in
        "") echo "redis: $2 is empty or missing in $SECRET" >&2; exit 1 ;;
        REPLACE-ME*|CHANGE-ME*|changeme*|password*)
            echo "redis: $2 in $SECRET is a placeholder, not a password" >&2; exit 1 ;;
    esac
    if [ "${#1}" -lt "$MIN_LENGTH" ]; then
        echo "redis: $2 in $SECRET is shorter than $MIN_LENGTH characters" >&2
        exit 1
    fi
}
check "${REDIS_ADMIN_PASSWORD:-}" password
check "${REDIS_CREDENTIALS_PASSWORD:-}" credentials-password
check "${REDIS_SCHEDULER_PASSWORD:-}" scheduler-password
check "${REDIS_VIEWER_PASSWORD:-}" viewer-password

ACL_TEMPLATE=${ACL_TEMPLATE:-/etc/redis/users.acl.template}
ACL_FILE=${ACL_FILE:-/run/redis/users.acl}
REDIS_CONF=${REDIS_CONF:-/etc/redis/redis.conf}

sha256() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }

umask 077
sed -e "s/@ADMIN_SHA256@/$(sha256 "$REDIS_ADMIN_PASSWORD")/" \
    -e "s/@CREDENTIALS_SHA256@/$(sha256 "$REDIS_CREDENTIALS_PASSWORD")/" \
    -e "s/@SCHEDULER_SHA256@/$(sha256 "$REDIS_SCHEDULER_PASSWORD")/" \
    -e "s/@VIEWER_SHA256@/$(sha256 "$REDIS_VIEWER_PASSWORD")/" \
    "$ACL_TEMPLATE" > "$ACL_FILE"
exec redis-server "$REDIS_CONF" --aclfile "$ACL_FILE" "$@"
