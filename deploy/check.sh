#!/usr/bin/env bash
# Checks everything under deploy/ with real tools (run by .ci/run):
#   hadolint on the Dockerfile; both kustomize overlays (and the base) rendered with
#   `kubectl kustomize` and validated against the Kubernetes schemas of the oldest supported
#   (1.30: native sidecars and the preStop sleep action) and the newest known version;
#   `promtool check rules`; deploy/check.py (PrometheusRule in sync, dashboard well-formed).
# The live /metrics checks and a real Prometheus scrape are tests/deploy.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
if ! command -v kubectl >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubectl >/dev/null \
    || { echo "deploy/check.sh: kubectl (with kustomize) is needed and could not be installed" >&2; exit 1; }
fi
if [ ! -x .venv/bin/hadolint ] || [ ! -x .venv/bin/kubernetes-validate ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r deploy/requirements.txt
fi

echo "hadolint deploy/Dockerfile"
.venv/bin/hadolint deploy/Dockerfile

rendered=$(mktemp -d)
trap 'rm -rf "$rendered"' EXIT
for kustomization in base overlays/sidecar overlays/shared; do
  out="$rendered/$(basename "$kustomization").yaml"
  echo "kubectl kustomize deploy/kubernetes/$kustomization"
  kubectl kustomize "deploy/kubernetes/$kustomization" >"$out"
  for version in 1.30.0 1.37.0; do
    # --strict rejects unknown fields. The Prometheus Operator's kinds have no schema here and
    # are reported as warnings; check.py checks the PrometheusRule's content.
    .venv/bin/kubernetes-validate --strict --quiet --kubernetes-version "$version" "$out"
  done
done

echo "promtool check rules deploy/prometheus/*.yml"
promtool check rules deploy/prometheus/*.yml

echo "deploy/check.py"
.venv/bin/python deploy/check.py
echo "deploy: all checks passed"
