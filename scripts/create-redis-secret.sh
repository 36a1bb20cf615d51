#!/bin/sh
# Creates what Redis and its users need before `kubectl apply -k deploy/` (docs/operations.md,
# Install), once per cluster:
#   Secrets redis-admin, redis-issuer, redis-scheduler, redis-viewer (namespace
#     interference-system, type kubernetes.io/basic-auth): one per Redis user, each with
#     username, a random password and ca.crt; each is mounted only by its own component,
#     so whoever may read one (the viewer's, for the CLI) gets no other password;
#   Secret redis-tls (type kubernetes.io/tls): a certificate for Redis' Service names
#     (redis, redis.NAMESPACE.svc, ... and localhost/127.0.0.1 for kubectl port-forward), its
#     key, and ca.crt: a CA made for it alone, whose key is discarded once it signed;
#   ConfigMap redis-ca (in NAMESPACE and in AGENT_NAMESPACE): that CA, for the agents;
#   Secret interference-credentials-tls (type kubernetes.io/tls): the credential issuer's
#     certificate for its Service names, its key and ca.crt: another CA made for it alone,
#     whose key is discarded once it signed;
#   ConfigMap interference-credentials-ca (in AGENT_NAMESPACE): that CA, with which the
#     agents verify the issuer before they show it their token.
# deploy/ holds data-less stubs of the Secrets, which the API server refuses to create on
# their own: without this script the apply fails with `Secret "redis-admin" is invalid`.
#
#   scripts/create-redis-secret.sh          create them (an existing Secret is kept; a
#                                           missing one is added; passwords of a Secret
#                                           redis-credentials from an older release are
#                                           reused)
#   scripts/create-redis-secret.sh --print  print them as YAML, touch no cluster
#
# Rotate a password without a restart: scripts/rotate-redis-password.sh USER.
# Environment: NAMESPACE (default interference-system), AGENT_NAMESPACE (default
# interference-agent), CLUSTER_DOMAIN (default cluster.local), KUBECTL (default kubectl),
# TLS_DAYS (certificate lifetime, default 1095), OPENSSL (default openssl), and
# ADMIN_PASSWORD / ISSUER_PASSWORD / SCHEDULER_PASSWORD / VIEWER_PASSWORD to use given
# passwords instead of random ones, REDIS_CA_FILE to use the CA of a Redis you run
# (deploy/overlays/external-redis: no redis-tls is made then).
# Passwords are never printed except with --print, and never on a command line.
set -eu

NAMESPACE=${NAMESPACE:-interference-system}
AGENT_NAMESPACE=${AGENT_NAMESPACE:-interference-agent}
CLUSTER_DOMAIN=${CLUSTER_DOMAIN:-cluster.local}
KUBECTL=${KUBECTL:-kubectl}
OPENSSL=${OPENSSL:-openssl}
TLS_DAYS=${TLS_DAYS:-1095}
USERS="admin issuer scheduler viewer"
MIN_LENGTH=16
MODE=create
case "${1:-}" in
    "") ;;
    --print) MODE=print ;;
    --rotate)
        echo "create-redis-secret.sh: --rotate is gone: rotate one user's password with no" \
             "restart by scripts/rotate-redis-password.sh USER (docs/operations.md," \
             "\"Rotating a Redis password\")" >&2
        exit 2 ;;
    -h|--help) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "create-redis-secret.sh: unknown option $1 (use --print or --help)" >&2
       exit 2 ;;
esac

acl_user() {  # the Redis ACL user of each Secret
    case "$1" in
        admin) echo admin ;;
        issuer) echo interference-credentials ;;
        scheduler) echo interference-scheduler ;;
        viewer) echo interference-viewer ;;
    esac
}
given_password() {  # the password given in the environment for USER, if any
    case "$1" in
        admin) echo "${ADMIN_PASSWORD:-}" ;;
        issuer) echo "${ISSUER_PASSWORD:-${CREDENTIALS_PASSWORD:-}}" ;;
        scheduler) echo "${SCHEDULER_PASSWORD:-}" ;;
        viewer) echo "${VIEWER_PASSWORD:-}" ;;
    esac
}
legacy_key() {  # its key in redis-credentials, the one Secret of older releases
    case "$1" in
        admin) echo password ;;
        issuer) echo credentials-password ;;
        *) echo "$1-password" ;;
    esac
}
random_password() {  # 48 hex characters (192 bits) from the kernel's CSPRNG
    od -An -N24 -tx1 /dev/urandom | tr -d ' \n'
}
kube() { "$KUBECTL" --namespace "$NAMESPACE" "$@"; }
exists() { kube get "$1" "$2" >/dev/null 2>&1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/redis-secrets.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
umask 077

make_tls() {  # a CA and Redis' certificate signed by it, in $WORK; the CA key is deleted
    command -v "$OPENSSL" >/dev/null 2>&1 \
        || { echo "create-redis-secret.sh: openssl is needed to make Redis' certificate" >&2; exit 1; }
    sans="DNS:redis,DNS:redis.$NAMESPACE,DNS:redis.$NAMESPACE.svc"
    sans="$sans,DNS:redis.$NAMESPACE.svc.$CLUSTER_DOMAIN,DNS:localhost,IP:127.0.0.1,IP:::1"
    "$OPENSSL" req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -days "$TLS_DAYS" -subj "/CN=interference-scheduler Redis CA $(date -u +%Y%m%dT%H%M%SZ)" \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$WORK/ca.key" -out "$WORK/ca.crt" 2>"$WORK/openssl.log" \
    && "$OPENSSL" req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "/CN=redis.$NAMESPACE.svc" -keyout "$WORK/tls.key" -out "$WORK/tls.csr" \
        2>>"$WORK/openssl.log" \
    && printf '%s\n' "subjectAltName=$sans" "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" \
        > "$WORK/tls.ext" \
    && "$OPENSSL" x509 -req -in "$WORK/tls.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" \
        -CAcreateserial -CAserial "$WORK/ca.srl" -days "$TLS_DAYS" -extfile "$WORK/tls.ext" \
        -out "$WORK/tls.crt" 2>>"$WORK/openssl.log" \
    || { echo "create-redis-secret.sh: openssl failed:" >&2; cat "$WORK/openssl.log" >&2; exit 1; }
    rm -f "$WORK/ca.key" "$WORK/ca.srl" "$WORK/tls.csr"
}

make_issuer_tls() {  # the issuer's own CA and certificate, in $WORK/issuer; the CA key deleted
    mkdir -p "$WORK/issuer"
    dir="$WORK/issuer"
    name=interference-credentials
    sans="DNS:$name,DNS:$name.$NAMESPACE,DNS:$name.$NAMESPACE.svc"
    sans="$sans,DNS:$name.$NAMESPACE.svc.$CLUSTER_DOMAIN"
    "$OPENSSL" req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -days "$TLS_DAYS" -subj "/CN=interference-credentials CA $(date -u +%Y%m%dT%H%M%SZ)" \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>"$WORK/openssl.log" \
    && "$OPENSSL" req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "/CN=$name.$NAMESPACE.svc" -keyout "$dir/tls.key" -out "$dir/tls.csr" \
        2>>"$WORK/openssl.log" \
    && printf '%s\n' "subjectAltName=$sans" "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" \
        > "$dir/tls.ext" \
    && "$OPENSSL" x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
        -CAcreateserial -CAserial "$dir/ca.srl" -days "$TLS_DAYS" -extfile "$dir/tls.ext" \
        -out "$dir/tls.crt" 2>>"$WORK/openssl.log" \
    || { echo "create-redis-secret.sh: openssl failed:" >&2; cat "$WORK/openssl.log" >&2; exit 1; }
    rm -f "$dir/ca.key" "$dir/ca.srl" "$dir/tls.csr"
}
issuer_tls_secret_yaml() {
    "$KUBECTL" create secret generic interference-credentials-tls --namespace "$NAMESPACE" \
        --type kubernetes.io/tls --from-file=tls.crt="$WORK/issuer/tls.crt" \
        --from-file=tls.key="$WORK/issuer/tls.key" --from-file=ca.crt="$WORK/issuer/ca.crt" \
        --dry-run=client -o yaml
}
issuer_ca_configmap_yaml() {
    "$KUBECTL" create configmap interference-credentials-ca --namespace "$AGENT_NAMESPACE" \
        --from-file=ca.crt="$WORK/issuer/ca.crt" --dry-run=client -o yaml
}

user_secret_yaml() {  # USER: its Secret, from files in $WORK (no value on a command line)
    printf '%s' "$(acl_user "$1")" > "$WORK/$1.username"
    "$KUBECTL" create secret generic "redis-$1" --namespace "$NAMESPACE" \
        --type kubernetes.io/basic-auth --from-file=username="$WORK/$1.username" \
        --from-file=password="$WORK/$1.password" --from-file=ca.crt="$WORK/ca.crt" \
        --dry-run=client -o yaml
}
tls_secret_yaml() {
    "$KUBECTL" create secret generic redis-tls --namespace "$NAMESPACE" \
        --type kubernetes.io/tls --from-file=tls.crt="$WORK/tls.crt" \
        --from-file=tls.key="$WORK/tls.key" --from-file=ca.crt="$WORK/ca.crt" \
        --dry-run=client -o yaml
}
ca_configmap_yaml() {  # NAMESPACE
    "$KUBECTL" create configmap redis-ca --namespace "$1" --from-file=ca.crt="$WORK/ca.crt" \
        --dry-run=client -o yaml
}
set_password() {  # USER: $WORK/USER.password from the environment, an older Secret or random
    value=$(given_password "$1")
    if [ -z "$value" ] && [ "$MODE" = create ] && [ -n "${LEGACY:-}" ]; then
        value=$(kube get secret redis-credentials \
            -o "jsonpath={.data.$(legacy_key "$1")}" 2>/dev/null | base64 -d 2>/dev/null || true)
        [ -n "$value" ] && REUSED="$REUSED $1"
    fi
    [ -n "$value" ] || value=$(random_password)
    if [ "${#value}" -lt "$MIN_LENGTH" ]; then
        echo "create-redis-secret.sh: the password given for $1 is shorter than" \
             "$MIN_LENGTH characters" >&2
        exit 2
    fi
    printf '%s' "$value" > "$WORK/$1.password"
}

if [ "$MODE" = print ]; then
    if [ -n "${REDIS_CA_FILE:-}" ]; then cp "$REDIS_CA_FILE" "$WORK/ca.crt"; else make_tls; fi
    for user in $USERS; do
        set_password "$user"
        echo "---"
        user_secret_yaml "$user"
    done
    if [ -z "${REDIS_CA_FILE:-}" ]; then echo "---"; tls_secret_yaml; fi
    for namespace in $(printf '%s\n' "$NAMESPACE" "$AGENT_NAMESPACE" | uniq); do
        echo "---"
        ca_configmap_yaml "$namespace"
    done
    make_issuer_tls
    echo "---"
    issuer_tls_secret_yaml
    echo "---"
    issuer_ca_configmap_yaml
    exit 0
fi

for namespace in $(printf '%s\n' "$NAMESPACE" "$AGENT_NAMESPACE" | uniq); do
    if ! "$KUBECTL" get namespace "$namespace" >/dev/null 2>&1; then
        "$KUBECTL" create namespace "$namespace" >/dev/null
        echo "created namespace $namespace"
    fi
done

# The CA every Secret and the ConfigMap carry: the given one, the one of an existing
# redis-tls (whose certificate stays), or a new one with a new certificate.
if [ -n "${REDIS_CA_FILE:-}" ]; then
    cp "$REDIS_CA_FILE" "$WORK/ca.crt"
elif exists secret redis-tls; then
    kube get secret redis-tls -o 'jsonpath={.data.ca\.crt}' | base64 -d > "$WORK/ca.crt"
    [ -s "$WORK/ca.crt" ] || { echo "create-redis-secret.sh: secret $NAMESPACE/redis-tls" \
        "has no ca.crt: delete it and run this script again (Redis then needs a restart)" >&2
        exit 1; }
    echo "secret $NAMESPACE/redis-tls exists; kept"
else
    make_tls
    tls_secret_yaml | "$KUBECTL" create -f - >/dev/null
    echo "created secret $NAMESPACE/redis-tls (Redis' certificate, valid $TLS_DAYS days)"
fi

LEGACY=
REUSED=
exists secret redis-credentials && LEGACY=1
CREATED=
for user in $USERS; do
    # A Redis of your own (REDIS_CA_FILE): its admin is yours, not a Secret here.
    [ "$user" = admin ] && [ -n "${REDIS_CA_FILE:-}" ] && continue
    if exists secret "redis-$user"; then
        echo "secret $NAMESPACE/redis-$user exists; kept"
        continue
    fi
    set_password "$user"
    user_secret_yaml "$user" | "$KUBECTL" create -f - >/dev/null
    CREATED="$CREATED redis-$user"
done
[ -n "$CREATED" ] && echo "created secrets:$CREATED (random passwords unless given)"
if [ -n "$REUSED" ]; then
    echo "reused the passwords of$REUSED from secret $NAMESPACE/redis-credentials (an older" \
         "release's); once Redis runs with the new Secrets: kubectl -n $NAMESPACE delete" \
         "secret redis-credentials"
fi
for namespace in $(printf '%s\n' "$NAMESPACE" "$AGENT_NAMESPACE" | uniq); do
    if "$KUBECTL" --namespace "$namespace" get configmap redis-ca >/dev/null 2>&1; then
        ca_configmap_yaml "$namespace" | "$KUBECTL" replace -f - >/dev/null
    else
        ca_configmap_yaml "$namespace" | "$KUBECTL" create -f - >/dev/null
    fi
done
echo "configmap redis-ca (Redis' CA) in $(printf '%s\n' "$NAMESPACE" "$AGENT_NAMESPACE" | uniq | tr '\n' ' ')"

# The issuer's certificate: kept when its Secret exists (the agents' ConfigMap follows it).
if exists secret interference-credentials-tls; then
    mkdir -p "$WORK/issuer"
    kube get secret interference-credentials-tls -o 'jsonpath={.data.ca\.crt}' | base64 -d \
        > "$WORK/issuer/ca.crt"
    echo "secret $NAMESPACE/interference-credentials-tls exists; kept"
else
    make_issuer_tls
    issuer_tls_secret_yaml | "$KUBECTL" create -f - >/dev/null
    echo "created secret $NAMESPACE/interference-credentials-tls (the credential issuer's" \
         "certificate, valid $TLS_DAYS days)"
fi
if "$KUBECTL" --namespace "$AGENT_NAMESPACE" get configmap interference-credentials-ca >/dev/null 2>&1; then
    issuer_ca_configmap_yaml | "$KUBECTL" replace -f - >/dev/null
else
    issuer_ca_configmap_yaml | "$KUBECTL" create -f - >/dev/null
fi
echo "configmap interference-credentials-ca (the issuer's CA) in $AGENT_NAMESPACE"
