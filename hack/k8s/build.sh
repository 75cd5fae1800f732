#!/bin/bash
# build.sh builds every binary the test cluster runs, from the Go module proxy only, CGO_ENABLED=0,
# under nice: kube-apiserver, kubelet, kube-scheduler, kube-controller-manager, kubectl and etcd
# (tool module kube/), containerd + containerd-shim-runc-v2 + ctr (containerd/), runsc +
# containerd-shim-runsc-v1 (gvisor/, with the shim's oomScoreMax set to 0: these machines lack
# CAP_SYS_RESOURCE), mkimage and pause (own code).
#
# The binaries go to $AGENTBOX_K8S_CACHE/<key>/bin (default /var/cache/agentbox/k8s), where <key>
# hashes the tool modules (go.mod, go.sum, *.go), this script and the Go version: a second run with
# the same inputs reuses them and costs well under a second. The bin dir is the last line of stdout;
# progress goes to stderr. `build.sh -print` prints the bin dir without building (exit 1 when it is
# not built yet). Cold: about 8-9 minutes on 2 idle cores, ~1.5 GiB of module downloads unpacked,
# ~5 GiB of build cache, ~600 MB of binaries.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${AGENTBOX_K8S_CACHE:-/var/cache/agentbox/k8s}
MODULES="kube containerd gvisor mkimage pause"
BINARIES="kube-apiserver kubelet kube-scheduler kube-controller-manager kubectl etcd containerd containerd-shim-runc-v2 ctr runsc containerd-shim-runsc-v1 mkimage pause"
K8S_VERSION=v1.37.2
CONTAINERD_VERSION=v2.4.2

key() {
	cd "$HERE"
	{
		find $MODULES -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) | LC_ALL=C sort | xargs sha256sum
		sha256sum build.sh
		go version
	} | sha256sum | cut -c1-16
}
KEY=$(key)
OUT=$CACHE/$KEY
BIN=$OUT/bin

if [ -f "$BIN/.complete" ]; then echo "$BIN"; exit 0; fi
if [ "${1:-}" = -print ]; then echo "hack/k8s/build.sh: $BIN is not built yet" >&2; exit 1; fi

mkdir -p "$CACHE"
exec 9>"$CACHE/$KEY.lock"
flock 9 # one build per key at a time; a second caller waits, then reuses the first one's binaries
if [ -f "$BIN/.complete" ]; then echo "$BIN"; exit 0; fi

T0=$(date +%s)
stamp() { echo "hack/k8s/build.sh: [$(($(date +%s) - T0))s] $*" >&2; }
WORK=$OUT/work
TMP=$OUT/bin.tmp
rm -rf "$WORK" "$TMP"
mkdir -p "$WORK" "$TMP"
for m in $MODULES; do cp -r "$HERE/$m" "$WORK/$m"; done # builds never touch the checkout

export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
N="nice -n 19"
stamp "building into $OUT (key $KEY)"

KV="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
(cd "$WORK/kube" && $N go build -ldflags="$KV" -o "$TMP/" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl ./cmd/etcd)
stamp "kube-apiserver kubelet kube-scheduler kube-controller-manager kubectl etcd"

(cd "$WORK/containerd" && $N go build -tags 'no_btrfs no_devmapper no_zfs' \
	-ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" -o "$TMP/" \
	github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
	github.com/containerd/containerd/v2/cmd/ctr)
stamp "containerd containerd-shim-runc-v2 ctr"

# gVisor: the shim hard-codes oomScoreMax = -999, which needs CAP_SYS_RESOURCE (EACCES here), so
# build from a copy of the module with that constant at 0, through a replace in the work copy only.
(
	cd "$WORK/gvisor"
	GV=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
	go mod download gvisor.dev/gvisor
	SRC=$(go list -m -f '{{.Dir}}' gvisor.dev/gvisor)
	[ -d "$SRC" ] || { echo "hack/k8s/build.sh: gvisor.dev/gvisor@$GV not downloaded" >&2; exit 1; }
	cp -r "$SRC" gvsrc && chmod -R u+w gvsrc
	sed -i 's/oomScoreMax = -999/oomScoreMax = 0/' gvsrc/pkg/shim/v1/manager.go
	grep -q 'oomScoreMax = 0' gvsrc/pkg/shim/v1/manager.go ||
		{ echo "hack/k8s/build.sh: the oomScoreMax fix no longer applies to gvisor $GV (pkg/shim/v1/manager.go)" >&2; exit 1; }
	go mod edit -replace gvisor.dev/gvisor=./gvsrc
	$N go build -ldflags="-s -w -X gvisor.dev/gvisor/runsc/version.version=$GV" -o "$TMP/runsc" gvisor.dev/gvisor/runsc
	$N go build -ldflags="-s -w" -o "$TMP/containerd-shim-runsc-v1" gvisor.dev/gvisor/shim
)
stamp "runsc containerd-shim-runsc-v1"

(cd "$WORK/mkimage" && $N go build -ldflags="-s -w" -o "$TMP/mkimage" .)
(cd "$WORK/pause" && $N go build -ldflags="-s -w" -o "$TMP/pause" .)
stamp "mkimage pause"

for b in $BINARIES; do [ -x "$TMP/$b" ] || { echo "hack/k8s/build.sh: $b was not built" >&2; exit 1; }; done
rm -rf "$WORK" "$BIN"
touch "$TMP/.complete"
mv "$TMP" "$BIN"
stamp "done: $(du -sh "$BIN" | cut -f1) in $BIN"
echo "$BIN"
