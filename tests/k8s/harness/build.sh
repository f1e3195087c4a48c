#!/usr/bin/env bash
# Builds the Kubernetes test binaries (kube-apiserver, kube-scheduler, kube-controller-manager,
# kubectl, etcd) from Go modules with
# this machine's Go toolchain, into a cache directory outside the repository keyed by the
# Kubernetes and etcd versions:
#
#   ${GPUFENCE_K8S_CACHE:-$HOME/.cache/gpufence}/k8s-<k8s version>-etcd-<etcd version>/
#
# A second run with the binaries already there costs nothing (no go invocation at all; go need not
# even be installed). The stamp file .inputs.sha256 in that directory records a hash of the harness
# sources (go.mod/go.sum/main.go files and this script), so an edit to them rebuilds.
#
# The last line on stdout is the directory holding the binaries; progress goes to stderr.
#
# Needs only the Go module proxy (go.sum is committed, -mod=readonly). A cold build of
# kube-apiserver takes a long while on few cores (see tests/k8s/README.md).
# Environment: GPUFENCE_K8S_CACHE (cache root), GPUFENCE_K8S_BUILD_JOBS (go build -p, default
# nproc), GO (the go command, default: go on PATH, else /usr/local/go/bin/go).
set -euo pipefail

HARNESS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HARNESS"

# the versions come from the committed go.mod files: one source of truth
# the version required of module $1 in go.mod file $2 (a "require x v" line or one in a block)
required_version() {
  awk -v m="$1" '$1 == "require" && $2 == m {print $3; exit} $1 == m && $2 ~ /^v/ {print $2; exit}' "$2"
}
K8S_VERSION="$(required_version k8s.io/kubernetes go.mod)"
ETCD_VERSION="$(required_version go.etcd.io/etcd/server/v3 etcd/go.mod)"
if [ -z "$K8S_VERSION" ] || [ -z "$ETCD_VERSION" ]; then
  echo "build.sh: cannot read the k8s.io/kubernetes / etcd server versions from go.mod" >&2
  exit 2
fi

CACHE_ROOT="${GPUFENCE_K8S_CACHE:-$HOME/.cache/gpufence}"
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd)

inputs_hash() {
  # sorted, NUL-safe: the module files, every .go file of the harness, this script
  find . -type f \( -name go.mod -o -name go.sum -o -name '*.go' -o -name build.sh \) -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
}
HASH="$(inputs_hash)"
# keyed by the versions and by the harness sources' hash: two checkouts with different harnesses
# (another branch, a worktree) keep their own binaries instead of rebuilding each other's
OUT="$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-${HASH:0:12}"

up_to_date() {
  [ -f "$OUT/.inputs.sha256" ] && [ "$(cat "$OUT/.inputs.sha256")" = "$HASH" ] || return 1
  for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}

if up_to_date; then
  echo "build.sh: up to date: $OUT" >&2
  echo "$OUT"
  exit 0
fi

mkdir -p "$OUT"
# one builder at a time per cache directory (parallel test runs, two CI jobs on one runner)
exec 9>"$OUT/.lock"
flock 9
if up_to_date; then  # another process finished the build while this one waited
  echo "$OUT"
  exit 0
fi

if [ -z "${GO:-}" ]; then
  GO="$(command -v go || true)"
  [ -n "$GO" ] || { [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go; }
fi
if [ -z "${GO:-}" ]; then
  echo "build.sh: no go toolchain found (PATH, /usr/local/go/bin/go); set GO=/path/to/go" >&2
  exit 3
fi

# static binaries as upstream builds them; go.sum is committed, so no go.mod/go.sum rewriting
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=readonly -buildvcs=false"
JOBS="${GPUFENCE_K8S_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
# the version stamps upstream's release build sets (hack/lib/version.sh), so that --version and
# GET /version say v1.x.y instead of v0.0.0-master
K8S_MINOR="${K8S_VERSION#v*.}"; K8S_MINOR="${K8S_MINOR%%.*}"
K8S_MAJOR="${K8S_VERSION#v}"; K8S_MAJOR="${K8S_MAJOR%%.*}"
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$K8S_MAJOR"
  K8S_LDFLAGS+=" -X $pkg.gitMinor=$K8S_MINOR -X $pkg.gitTreeState=clean"
done
BUILD=("$GO" build -p "$JOBS" -trimpath)

echo "build.sh: $("$GO" version); k8s.io/kubernetes $K8S_VERSION, etcd $ETCD_VERSION -> $OUT" >&2
rm -f "$OUT/.inputs.sha256"
TMP="$(mktemp -d "$OUT/.build.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

start=$SECONDS
echo "build.sh: building etcd" >&2
(cd etcd && "${BUILD[@]}" -ldflags='-s -w' -o "$TMP/etcd" ./cmd/etcd)
echo "build.sh: building kube-scheduler" >&2
"${BUILD[@]}" -ldflags="$K8S_LDFLAGS" -o "$TMP/kube-scheduler" ./cmd/kube-scheduler
echo "build.sh: building kube-apiserver (the long one)" >&2
"${BUILD[@]}" -ldflags="$K8S_LDFLAGS" -o "$TMP/kube-apiserver" ./cmd/kube-apiserver
# the controllers (Deployments, Jobs, garbage collection) and kubectl: the README's walk-through
# on the harness, as a user of a real cluster would see it
echo "build.sh: building kube-controller-manager and kubectl" >&2
"${BUILD[@]}" -ldflags="$K8S_LDFLAGS" -o "$TMP/kube-controller-manager" ./cmd/kube-controller-manager
"${BUILD[@]}" -ldflags="$K8S_LDFLAGS" -o "$TMP/kubectl" ./cmd/kubectl

for b in "${BINARIES[@]}"; do mv -f "$TMP/$b" "$OUT/$b"; done
printf 'k8s.io/kubernetes %s\ngo.etcd.io/etcd/server/v3 %s\n%s\n' \
  "$K8S_VERSION" "$ETCD_VERSION" "$("$GO" version)" > "$OUT/VERSIONS"
echo "$HASH" > "$OUT/.inputs.sha256"
echo "build.sh: built in $((SECONDS - start))s" >&2
echo "$OUT"
