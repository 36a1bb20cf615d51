#!/bin/sh
# Writes the ACL file from users.acl.template with SHA-256 hashes of the passwords mounted
# from the Secrets redis-admin, redis-issuer, redis-scheduler and redis-viewer (one file per
# user in PASSWORD_DIR; no plaintext password is written anywhere), then starts Redis, which
# serves only TLS (redis.conf; certificate from the Secret redis-tls).
# The agents' users (agent:<node>) are not in it: the credential issuer creates them at run
# time (ACL SETUSER), and after a restart of Redis each agent enrols again. A password
# rotated at run time (scripts/rotate-redis-password.sh) is in the Secret before the old
# one is removed, so a restart in between starts with the new one.
# There is no default password: without the Secrets the kubelet does not start this
# container (secret "redis-admin" not found), and a missing, short or placeholder password
# stops it here, naming the Secret. Create them with scripts/create-redis-secret.sh
# (docs/operations.md, Install).
# Paths can be overridden (PASSWORD_DIR, ACL_TEMPLATE, ACL_FILE, REDIS_CONF) so tests run
# this very script.
set -eu
MIN_LENGTH=16
PASSWORD_DIR=${PASSWORD_DIR:-/var/run/secrets/redis/passwords}
ACL_TEMPLATE=${ACL_TEMPLATE:-/etc/redis/users.acl.template}
ACL_FILE=${ACL_FILE:-/run/redis/users.acl}
REDIS_CONF=${REDIS_CONF:-/etc/redis/redis.conf}

password() {  # password USER: the mounted password of USER, checked
    secret="the Secret redis-$1 (key password; create it with scripts/create-redis-secret.sh)"
    if ! value=$(cat "$PASSWORD_DIR/$1" 2>/dev/null) || [ -z "$value" ]; then
        echo "redis: the password of $1 is empty or missing in $secret" >&2; exit 1
    fi
    case "$value" in
        REPLACE-ME*|CHANGE-ME*|changeme*|password*)
            echo "redis: the password of $1 in $secret is a placeholder, not a password" >&2
            exit 1 ;;
    esac
    if [ "${#value}" -lt "$MIN_LENGTH" ]; then
        echo "redis: the password of $1 in $secret is shorter than $MIN_LENGTH characters" >&2
        exit 1
    fi
    printf '%s' "$value" | sha256sum | cut -d' ' -f1
}
ADMIN=$(password admin)
ISSUER=$(password issuer)
SCHEDULER=$(password scheduler)
VIEWER=$(password viewer)

umask 077
sed -e "s/@ADMIN_SHA256@/$ADMIN/" \
    -e "s/@CREDENTIALS_SHA256@/$ISSUER/" \
    -e "s/@SCHEDULER_SHA256@/$SCHEDULER/" \
    -e "s/@VIEWER_SHA256@/$VIEWER/" \
    "$ACL_TEMPLATE" > "$ACL_FILE"
exec redis-server "$REDIS_CONF" --aclfile "$ACL_FILE" "$@"
