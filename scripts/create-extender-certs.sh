#!/bin/sh
# Creates the certificates of extender mode (deploy/overlays/extender) and their Secrets in
# namespace interference-system: a CA made here, then
#   interference-extender-serving  the extender's serving certificate, for the Service
#                                  interference-scheduler-extender (its DNS names), and the
#                                  CA that client certificates must chain to (ca.crt)
#   interference-extender-client   kube-scheduler's client certificate and the CA that
#                                  signed the extender's (ca.crt)
# both of type kubernetes.io/tls (tls.crt, tls.key, ca.crt). The CA's private key exists
# only in a private temporary directory while this runs and is then deleted: nothing can
# sign another client later. Run it once per cluster, before
# `kubectl apply -k deploy/overlays/extender` (docs/operations.md, "Extender mode"); with
# cert-manager installed, deploy/components/extender/cert-manager.yaml makes the same Secrets.
#
#   scripts/create-extender-certs.sh            create them (existing Secrets are kept)
#   scripts/create-extender-certs.sh --rotate   replace both with a new CA and certificates
#   scripts/create-extender-certs.sh --out DIR  write ca.crt, serving.crt, serving.key,
#                                               client.crt, client.key to DIR and touch no
#                                               cluster (your own secret store; tests)
#
# Environment: NAMESPACE (default interference-system), KUBECTL (default kubectl), DAYS
# (validity, default 365), SERVICE (default interference-scheduler-extender). Needs openssl.
set -eu

NAMESPACE=${NAMESPACE:-interference-system}
KUBECTL=${KUBECTL:-kubectl}
DAYS=${DAYS:-365}
SERVICE=${SERVICE:-interference-scheduler-extender}
SERVING=interference-extender-serving
CLIENT=interference-extender-client
CLIENT_NAME=interference-kube-scheduler
MODE=create
OUT=
case "${1:-}" in
    "") ;;
    --rotate) MODE=rotate ;;
    --out)
        MODE=out
        OUT=${2:?create-extender-certs.sh: --out needs a directory}
        ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "create-extender-certs.sh: unknown option $1 (use --rotate, --out DIR or --help)" >&2
       exit 2 ;;
esac
case "$DAYS" in
    ''|*[!0-9]*) echo "create-extender-certs.sh: DAYS must be a whole number, got '$DAYS'" >&2
                 exit 2 ;;
esac
command -v openssl >/dev/null || {
    echo "create-extender-certs.sh: openssl is not installed" >&2; exit 1; }

if [ "$MODE" = create ]; then
    found=
    for secret in "$SERVING" "$CLIENT"; do
        if "$KUBECTL" --namespace "$NAMESPACE" get secret "$secret" >/dev/null 2>&1; then
            found="$found $secret"
        fi
    done
    if [ -n "$found" ]; then
        if [ "$found" = " $SERVING $CLIENT" ]; then
            echo "secrets $NAMESPACE/$SERVING and $NAMESPACE/$CLIENT exist; kept (use --rotate" \
                 "for a new CA and certificates)"
            exit 0
        fi
        # One without the other cannot work: its CA would not match a new one.
        echo "create-extender-certs.sh: only$found exists in $NAMESPACE; run with --rotate" \
             "to make both from one new CA" >&2
        exit 1
    fi
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT INT TERM
umask 077

serial() {  # 128 random bits: a fresh serial per certificate
    echo "0x$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
}

new_key() {  # ECDSA P-256: small, fast handshakes, accepted by Go and OpenSSL alike
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
}

new_key "$WORK/ca.key"
openssl req -x509 -new -key "$WORK/ca.key" -out "$WORK/ca.crt" -days "$DAYS" \
    -set_serial "$(serial)" -subj "/CN=interference-extender-ca" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign"

sign() {  # sign NAME CN EXTENSIONS: NAME.key and NAME.crt signed by the CA
    new_key "$WORK/$1.key"
    openssl req -new -key "$WORK/$1.key" -out "$WORK/$1.csr" -subj "/CN=$2"
    printf '%s\n' "$3" >"$WORK/$1.ext"
    openssl x509 -req -in "$WORK/$1.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" \
        -set_serial "$(serial)" -days "$DAYS" -extfile "$WORK/$1.ext" \
        -out "$WORK/$1.crt" 2>/dev/null
}

HOST="$SERVICE.$NAMESPACE.svc"
sign serving "$HOST" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:$SERVICE,DNS:$SERVICE.$NAMESPACE,DNS:$HOST,DNS:$HOST.cluster.local"
sign client "$CLIENT_NAME" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
rm -f "$WORK/ca.key"

if [ "$MODE" = out ]; then
    mkdir -p "$OUT"
    for file in ca.crt serving.crt serving.key client.crt client.key; do
        cp "$WORK/$file" "$OUT/$file"
    done
    echo "wrote ca.crt, serving.crt, serving.key, client.crt, client.key to $OUT" \
         "(valid $DAYS days; serving certificate for $HOST)"
    exit 0
fi

if ! "$KUBECTL" get namespace "$NAMESPACE" >/dev/null 2>&1; then
    "$KUBECTL" create namespace "$NAMESPACE" >/dev/null
    echo "created namespace $NAMESPACE"
fi
secret_yaml() {  # secret_yaml NAME FILE-PREFIX: a kubernetes.io/tls Secret with ca.crt
    "$KUBECTL" create secret generic "$1" --namespace "$NAMESPACE" --type kubernetes.io/tls \
        --from-file=tls.crt="$WORK/$2.crt" --from-file=tls.key="$WORK/$2.key" \
        --from-file=ca.crt="$WORK/ca.crt" --dry-run=client -o yaml
}
if [ "$MODE" = rotate ]; then
    for secret in "$SERVING" "$CLIENT"; do
        "$KUBECTL" --namespace "$NAMESPACE" delete secret "$secret" --ignore-not-found >/dev/null
    done
fi
secret_yaml "$SERVING" serving | "$KUBECTL" create -f - >/dev/null
secret_yaml "$CLIENT" client | "$KUBECTL" create -f - >/dev/null
if [ "$MODE" = rotate ]; then
    echo "secrets $NAMESPACE/$SERVING and $NAMESPACE/$CLIENT replaced (new CA, valid $DAYS" \
         "days); the extender reloads its files by itself, kube-scheduler reads its" \
         "certificate once: kubectl -n $NAMESPACE rollout restart deploy/interference-kube-scheduler"
else
    echo "created secrets $NAMESPACE/$SERVING and $NAMESPACE/$CLIENT (one CA, valid $DAYS days;" \
         "serving certificate for $HOST)"
fi
