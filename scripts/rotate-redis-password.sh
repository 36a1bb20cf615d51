#!/bin/sh
# Rotates one Redis user's password with no restart of Redis or of the component, using
# that Redis accepts several passwords per ACL user (docs/operations.md, "Rotating a Redis
# password"):
#   1. add     a new random password to the user in the running Redis (ACL SETUSER #sha256),
#              so the old and the new one both work;
#   2. switch  put it in the user's Secret (redis-USER) and wait until every pod of the
#              component has the new file (the kubelet updates mounted Secrets in place, in
#              about a minute; the programs read the file at every login), or with --roll
#              restart the component and wait for the rollout;
#   3. remove  every other password of the user (ACL SETUSER resetpass #sha256-of-new).
# Connections already logged in stay open (Redis does not close them when a password goes),
# so nothing fails on the way. A Redis that restarts meanwhile reads the Secret, so it knows
# the new password once step 2 began.
#
#   scripts/rotate-redis-password.sh USER [--roll] [--keep-old]
#   scripts/rotate-redis-password.sh USER --finish   step 3 alone (after --keep-old)
# USER: admin, issuer (the credential issuer), scheduler or viewer. The viewer has no pods:
# step 2 only updates its Secret; use --keep-old, let the CLI users fetch the new password,
# then --finish.
# Environment: NAMESPACE (default interference-system), KUBECTL (default kubectl), WAIT_S
# (how long step 2 may take, default 300). The new password is never printed and never on a
# command line (Redis is given its SHA-256; the Secret gets it through stdin).
set -eu

NAMESPACE=${NAMESPACE:-interference-system}
KUBECTL=${KUBECTL:-kubectl}
WAIT_S=${WAIT_S:-300}
usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; }
fail() { echo "rotate-redis-password.sh: $*" >&2; exit 1; }

USER_NAME=
ROLL=
KEEP_OLD=
FINISH=
for arg in "$@"; do
    case "$arg" in
        admin|issuer|scheduler|viewer) USER_NAME=$arg ;;
        --roll) ROLL=1 ;;
        --keep-old) KEEP_OLD=1 ;;
        --finish) FINISH=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "rotate-redis-password.sh: unknown argument $arg" >&2; usage >&2; exit 2 ;;
    esac
done
[ -n "$USER_NAME" ] || { usage >&2; exit 2; }

# The ACL user, and where its password file is mounted: deployment, container, file.
case "$USER_NAME" in
    admin) ACL_USER=admin
           WORKLOAD=redis CONTAINER=redis FILE=/var/run/secrets/redis/passwords/admin ;;
    issuer) ACL_USER=interference-credentials
            WORKLOAD=interference-credentials CONTAINER=issuer FILE=/var/run/secrets/redis/password ;;
    scheduler) ACL_USER=interference-scheduler
               WORKLOAD=interference-scheduler CONTAINER=scheduler FILE=/var/run/secrets/redis/password ;;
    viewer) ACL_USER=interference-viewer WORKLOAD= CONTAINER= FILE= ;;
esac
SECRET=redis-$USER_NAME

kube() { "$KUBECTL" --namespace "$NAMESPACE" "$@"; }
redis_cli() {  # the admin's redis-cli wrapper in the Redis container (TLS, admin's file)
    kube exec deploy/redis -c redis -- redis-cli "$@"
}
sha256() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
passwords_of() {  # the SHA-256 of every password the running Redis accepts for ACL_USER
    redis_cli ACL GETUSER "$ACL_USER" > "$WORK/user" 2>&1 \
        || fail "cannot run redis-cli in deploy/redis (namespace $NAMESPACE):" \
                "$(head -c 300 "$WORK/user")"
    awk '/^passwords$/ { inside = 1; next }
         inside && /^[0-9a-f]+$/ && length($0) == 64 { print; next }
         inside { exit }' "$WORK/user"
}
secret_password() {
    kube get secret "$SECRET" -o 'jsonpath={.data.password}' | base64 -d
}
acl_setuser() {  # ARGS...: ACL SETUSER ACL_USER ARGS, which must answer OK
    # stderr apart: kubectl exec may log a stream warning there while Redis answers OK
    answer=$(redis_cli ACL SETUSER "$ACL_USER" "$@" 2>"$WORK/setuser.err") || true
    [ "$answer" = OK ] \
        || fail "ACL SETUSER $ACL_USER failed: $answer $(head -c 300 "$WORK/setuser.err")"
}

remove_old() {  # step 3: keep only the Secret's password
    current=$(secret_password) || fail "cannot read secret $NAMESPACE/$SECRET"
    [ -n "$current" ] || fail "secret $NAMESPACE/$SECRET has no password"
    hash=$(sha256 "$current")
    passwords_of > "$WORK/accepted"
    grep -qx "$hash" "$WORK/accepted" \
        || fail "Redis does not accept the password in $SECRET for $ACL_USER (did it restart" \
                "before the Secret changed?): run scripts/rotate-redis-password.sh $USER_NAME" \
                "again"
    acl_setuser resetpass "#$hash"
    [ "$(passwords_of)" = "$hash" ] || fail "Redis still accepts other passwords of $ACL_USER"
    echo "redis user $ACL_USER: only the password in secret $NAMESPACE/$SECRET is accepted now"
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/redis-rotate.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
umask 077

if [ -n "$FINISH" ]; then
    remove_old
    exit 0
fi

kube get secret "$SECRET" >/dev/null 2>&1 \
    || fail "secret $NAMESPACE/$SECRET does not exist: create it with scripts/create-redis-secret.sh"
NEW=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
NEW_HASH=$(sha256 "$NEW")

# 1. add
acl_setuser "#$NEW_HASH"
echo "redis user $ACL_USER: new password added (the old one still works)"

# 2. switch
printf '{"data": {"password": "%s"}}' "$(printf '%s' "$NEW" | base64 | tr -d '\n')" \
    > "$WORK/patch.json"
kube patch secret "$SECRET" --type merge --patch-file "$WORK/patch.json" >/dev/null
rm -f "$WORK/patch.json"
echo "secret $NAMESPACE/$SECRET holds the new password"
if [ -n "$WORKLOAD" ]; then
    if [ -n "$ROLL" ]; then
        kube rollout restart "deploy/$WORKLOAD" >/dev/null
        kube rollout status "deploy/$WORKLOAD" --timeout "${WAIT_S}s" >/dev/null \
            || fail "deploy/$WORKLOAD did not roll out within $WAIT_S s; the old password" \
                    "still works; finish with: scripts/rotate-redis-password.sh $USER_NAME --finish"
        echo "deploy/$WORKLOAD restarted with the new password"
    else
        deadline=$(( $(date +%s) + WAIT_S ))
        while :; do
            stale=
            pods=$(kube get pods -l "app.kubernetes.io/name=$WORKLOAD" \
                -o 'jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}')
            for pod in $pods; do
                seen=$(kube exec "$pod" -c "$CONTAINER" -- sha256sum "$FILE" 2>/dev/null \
                    | cut -d' ' -f1) || seen=
                [ "$seen" = "$NEW_HASH" ] || stale="$stale $pod"
            done
            [ -n "$pods" ] && [ -z "$stale" ] && break
            [ "$(date +%s)" -lt "$deadline" ] \
                || fail "pods${stale:- of deploy/$WORKLOAD} do not have the new password after" \
                        "$WAIT_S s; the old one still works; finish with:" \
                        "scripts/rotate-redis-password.sh $USER_NAME --finish"
            sleep 2
        done
        echo "every pod of deploy/$WORKLOAD reads the new password ($(echo $pods | wc -w) pods)"
    fi
fi
[ "$(passwords_of | grep -cx "$NEW_HASH")" = 1 ] \
    || fail "Redis lost the new password of $ACL_USER (it restarted before the Secret" \
            "changed?): run scripts/rotate-redis-password.sh $USER_NAME again"

# 3. remove
if [ -n "$KEEP_OLD" ]; then
    echo "the old password still works; remove it with:" \
         "scripts/rotate-redis-password.sh $USER_NAME --finish"
    exit 0
fi
remove_old
