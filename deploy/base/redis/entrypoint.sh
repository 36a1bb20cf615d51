#!/bin/sh
# Writes the ACL file from users.acl.template with SHA-256 hashes of the passwords in the
# redis-credentials Secret (no plaintext password touches the disk), then starts Redis.
# Paths can be overridden (ACL_TEMPLATE, ACL_FILE, REDIS_CONF) so tests run this very script.
set -eu
: "${REDIS_ADMIN_PASSWORD:?is empty: set admin-password in the redis-credentials Secret}"
: "${REDIS_AGENT_PASSWORD:?is empty: set agent-password in the redis-credentials Secret}"
: "${REDIS_SCHEDULER_PASSWORD:?is empty: set scheduler-password in the redis-credentials Secret}"
ACL_TEMPLATE=${ACL_TEMPLATE:-/etc/redis/users.acl.template}
ACL_FILE=${ACL_FILE:-/run/redis/users.acl}
REDIS_CONF=${REDIS_CONF:-/etc/redis/redis.conf}

sha256() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }

for password in "$REDIS_ADMIN_PASSWORD" "$REDIS_AGENT_PASSWORD" "$REDIS_SCHEDULER_PASSWORD"; do
    case "$password" in
        REPLACE-ME*)
            echo "redis: WARNING: redis-credentials still holds the example passwords;" \
                 "replace them (docs/operations.md, Credentials)" >&2
            break ;;
    esac
done

umask 077
sed -e "s/@ADMIN_SHA256@/$(sha256 "$REDIS_ADMIN_PASSWORD")/" \
    -e "s/@AGENT_SHA256@/$(sha256 "$REDIS_AGENT_PASSWORD")/" \
    -e "s/@SCHEDULER_SHA256@/$(sha256 "$REDIS_SCHEDULER_PASSWORD")/" \
    "$ACL_TEMPLATE" > "$ACL_FILE"
exec redis-server "$REDIS_CONF" --aclfile "$ACL_FILE" "$@"
