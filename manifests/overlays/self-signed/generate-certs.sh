#!/usr/bin/env bash
# A CA and a serving certificate for koord-recommender.koord-recommender.svc, valid for a year, and the caBundle
# patch for the webhook. Re-run before they expire. Needs openssl.
set -euo pipefail
cd "$(dirname "$0")"
service=koord-recommender.koord-recommender.svc
openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=koord-recommender-ca" -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=$service" -keyout tls.key -out tls.csr 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.cluster.local\nextendedKeyUsage=serverAuth\n' "$service" "$service" > san.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile san.ext -out tls.crt 2>/dev/null
rm -f tls.csr san.ext ca.srl
cat > ca-bundle.yaml <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: koord-recommender
webhooks:
  - name: pods.koord-recommender.io
    clientConfig:
      caBundle: $(base64 -w0 < ca.crt)
YAML
echo "wrote tls.crt, tls.key, ca.crt and ca-bundle.yaml; now: kubectl apply -k $(pwd)"
