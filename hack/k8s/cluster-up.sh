#!/bin/bash
# cluster-up.sh starts a real single-node Kubernetes cluster on loopback from the binaries
# build.sh made: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, containerd 2.x with
# runc and gVisor (runsc + its shim), kubelet, a bridge CNI without a gateway (pods get an address
# on sbxbr0 and reach nothing beyond it), RuntimeClasses runc, gvisor and gvisor-hostnet, and the
# images localhost/busybox:local and localhost/pause:local imported into the node (no registry).
#
#   hack/k8s/cluster-up.sh [BIN]     BIN defaults to `build.sh -print` (the cached build)
#   hack/k8s/cluster-up.sh -running  prints the kubeconfig of the cluster running in the state dir
#                                    and exits 0 when its API server answers; exits 1 otherwise
#
# It is all or nothing: when it fails (a process dies, a wait times out, Ctrl-C) it removes what it
# started with teardown.sh, keeping the logs in a /tmp/agentbox-k8s-failed.* dir it names.
# State (logs, pki, etcd, containerd, kubelet, the kubeconfig) lives in $AGENTBOX_K8S_STATE
# (default /var/lib/agentbox-k8s). The kubeconfig ($STATE/kubeconfig) holds a bearer token in group
# system:masters and the cluster CA. $STATE/env has KUBECONFIG, CONTAINERD_ADDRESS and BIN in
# shell syntax. Only one cluster can run per machine: kubelet and containerd use a few fixed host
# paths (/var/lib/kubelet/device-plugins, /run/containerd/s, /var/lib/cni) and the bridge sbxbr0.
# teardown.sh removes all of it. Needs root and the Debian packages runc,
# containernetworking-plugins and busybox-static (the Makefile's HOST_PKGS).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
R=${AGENTBOX_K8S_STATE:-/var/lib/agentbox-k8s}
if [ "${1:-}" = -running ]; then
	[ -f "$R/env" ] && [ -f "$R/bin" ] || exit 1
	"$(cat "$R/bin")/kubectl" --kubeconfig "$R/kubeconfig" --request-timeout=5s get --raw /readyz >/dev/null 2>&1 || exit 1
	echo "$R/kubeconfig"
	exit 0
fi
BIN=${1:-$("$HERE/build.sh" -print)}
BRIDGE=sbxbr0
POD_CIDR=10.250.0.0/24
API_PORT=16443
T0=$(date +%s.%N)
el() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "hack/k8s/cluster-up.sh: [$(el)s] $*" >&2; }
die() { echo "hack/k8s/cluster-up.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (kubelet and containerd manage cgroups, mounts and network namespaces)"
for b in etcd kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl containerd containerd-shim-runc-v2 ctr runsc containerd-shim-runsc-v1 mkimage pause; do
	[ -x "$BIN/$b" ] || die "$BIN/$b is missing: run hack/k8s/build.sh (make k8s)"
done
RUNC=$(command -v runc) || die "runc is not installed (apt-get install runc)"
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || die "CNI plugins missing in /usr/lib/cni (apt-get install containernetworking-plugins)"
BUSYBOX=/bin/busybox
[ -x "$BUSYBOX" ] && ! ldd "$BUSYBOX" >/dev/null 2>&1 || die "a static $BUSYBOX is needed for the busybox image (apt-get install busybox-static)"

# Refuse to start beside another cluster; clear the leftovers of a dead one.
if [ -d "$R" ]; then
	for f in "$R"/pids/*; do
		[ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && die "a cluster is already running in $R (pid $(cat "$f") from $f): use it, or stop it with hack/k8s/teardown.sh"
	done
	say "clearing the state of a stopped cluster in $R"
	AGENTBOX_K8S_STATE=$R "$HERE/teardown.sh" >&2 || die "teardown of the stopped cluster in $R left something behind"
fi
ip link show "$BRIDGE" >/dev/null 2>&1 && die "bridge $BRIDGE exists: another cluster runs on this machine (stop it with its teardown.sh)"
for port in 12379 12380 $API_PORT 10250 10248 10257 10259; do # (any address)
	ss -Hltn "sport = :$port" | grep -q . && die "127.0.0.1:$port is in use (needed by the cluster)"
done

# The API server reaches the kubelet through the node's name (--kubelet-preferred-address-types=
# Hostname), so the kubelet listens on the one address that name resolves to. The node is named
# $AGENTBOX_K8S_NODE, else the host name, when that resolves to a single loopback address (Debian's
# 127.0.1.1 too); otherwise it is "localhost" on 127.0.0.1.
NODE=${AGENTBOX_K8S_NODE:-$(hostname | tr 'A-Z' 'a-z')}
NODE_ADDR=$(getent ahosts "$NODE" 2>/dev/null | awk '{print $1}' | sort -u)
if [ "$(echo "$NODE_ADDR" | wc -l)" != 1 ] || [ "${NODE_ADDR#127.}" = "$NODE_ADDR" ]; then
	NODE=localhost NODE_ADDR=127.0.0.1
fi

# From here on, a failure removes everything started so far (all or nothing).
up=
on_exit() {
	[ -n "$up" ] && return
	local keep
	keep=$(mktemp -d /tmp/agentbox-k8s-failed.XXXXXX) && cp -r "$R/logs" "$keep/" 2>/dev/null
	echo "hack/k8s/cluster-up.sh: failed; removing what was started (logs kept in $keep/logs)" >&2
	AGENTBOX_K8S_STATE=$R "$HERE/teardown.sh" >&2
}
trap on_exit EXIT
trap 'exit 130' INT TERM
mkdir -p "$R"/{pids,logs,pki,etcd,ctrd,runsc,kubelet,cni/net.d,cni/ipam,images,pods-logs}
chmod 700 "$R"
echo "$BIN" >"$R/bin" # teardown.sh stops every process running a binary from here
# Host paths outside $R that kubelet/containerd/CNI create; teardown removes the ones made here.
: >"$R/host-dirs"
for d in /var/lib/kubelet /run/containerd /var/lib/cni /var/log/pods /var/log/containers; do
	[ -e "$d" ] || echo "$d" >>"$R/host-dirs"
done

# PKI: a cluster CA, the API server's serving cert, the API server's client cert for the kubelet
# (group system:masters), the service-account key pair and a random admin token.
P=$R/pki
ec() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$P/$1.key" -subj "$2" 2>/dev/null; }
sign() { openssl x509 -req -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 30 -out "$P/$1.crt" -extfile <(printf '%s\n' "$2") 2>/dev/null; }
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$P/ca.key" -out "$P/ca.crt" -days 30 \
	-subj /CN=agentbox-k8s-ca -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
ec apiserver /CN=kube-apiserver | sign apiserver "extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
ec kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" | sign kubelet-client "extendedKeyUsage=clientAuth"
openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$TOKEN,admin,admin-uid,\"system:masters\"" >"$P/tokens.csv"
chmod 600 "$P"/*.key "$P/tokens.csv"
KC=$R/kubeconfig
cat >"$KC" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: agentbox-k8s
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 "$P/ca.crt")
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: agentbox-k8s
  context: {cluster: agentbox-k8s, user: admin}
current-context: agentbox-k8s
EOF
chmod 600 "$KC"
say "pki and kubeconfig written"

# start NAME CMD...: runs CMD in its own session (so a caller's Ctrl-C or process-group kill does not
# reach it), logs to $R/logs/NAME.log, records its pid in $R/pids/NAME.
start() {
	local n=$1
	shift
	setsid bash -c 'echo $$ >"$0"; exec "$@"' "$R/pids/$n" "$@" >"$R/logs/$n.log" 2>&1 </dev/null &
}

# wait_for WHAT SECONDS CMD...: polls CMD every 0.2 s; fails at once when a started process has
# exited, and after SECONDS, showing the logs' tails.
wait_for() {
	local what=$1 secs=$2 i f dead=
	shift 2
	for ((i = 0; i < secs * 5; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		for f in "$R"/pids/*; do
			[ -s "$f" ] && ! kill -0 "$(cat "$f")" 2>/dev/null && dead="${f##*/} exited"
		done
		[ -n "$dead" ] && break
		sleep 0.2
	done
	for f in "$R"/logs/*.log; do echo "--- tail of $f" >&2; tail -n 15 "$f" >&2; done
	die "$what not reached: ${dead:-timed out after ${secs}s}"
}

start etcd "$BIN/etcd" --name default --data-dir "$R/etcd" \
	--listen-client-urls http://127.0.0.1:12379 --advertise-client-urls http://127.0.0.1:12379 \
	--listen-peer-urls http://127.0.0.1:12380 --initial-advertise-peer-urls http://127.0.0.1:12380 \
	--initial-cluster default=http://127.0.0.1:12380 --unsafe-no-fsync --log-level warn

start kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:12379 \
	--bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=$API_PORT \
	--tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
	--service-cluster-ip-range=10.96.0.0/16 --service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
	--token-auth-file="$P/tokens.csv" --authorization-mode=Node,RBAC --endpoint-reconciler-type=none \
	--kubelet-preferred-address-types=Hostname --kubelet-client-certificate="$P/kubelet-client.crt" \
	--kubelet-client-key="$P/kubelet-client.key" --profiling=false

# The bridge CNI enforces no NetworkPolicy (agentbox creates a deny-all one for its sandbox pods;
# a real cluster's CNI enforces it): cni-isolate, chained after it, makes every pod's bridge port
# isolated, so a pod reaches no other pod, and with no address on the bridge and no gateway,
# nothing at all. exec and port-forward go through the kubelet, not the pod network.
mkdir -p "$R/cni/bin"
ln -sf /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback "$R/cni/bin/"
cp "$HERE/cni-isolate" "$R/cni/bin/cni-isolate"
cat >"$R/cni/net.d/10-agentbox.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "agentbox-k8s", "plugins": [{"type": "bridge", "bridge": "$BRIDGE",
 "isGateway": false, "ipMasq": false,
 "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "dataDir": "$R/cni/ipam"}},
 {"type": "cni-isolate"}]}
EOF
# containerd: runtimes runc (handler runc, the default), runsc (gVisor, its own netstack) and
# runsc-hostnet (gVisor with network=host: sockets live in the pod's Linux netns, which
# pods/portforward needs). restrict_oom_score_adj: no CAP_SYS_RESOURCE on these machines.
printf 'binary_name = "%s/runsc"\nroot = "%s/runsc"\n' "$BIN" "$R" >"$R/runsc.toml"
printf 'binary_name = "%s/runsc"\nroot = "%s/runsc"\n[runsc_config]\n  network = "host"\n' "$BIN" "$R" >"$R/runsc-hostnet.toml"
RT="plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes"
cat >"$R/containerd.toml" <<EOF
version = 3
root = "$R/ctrd/root"
state = "$R/ctrd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.nri.v1.nri"]
[grpc]
  address = "$R/containerd.sock"
[ttrpc]
  address = "$R/containerd.sock.ttrpc"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_tcp_service = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "localhost/pause:local"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
  [$RT.runc]
    runtime_type = "io.containerd.runc.v2"
    runtime_path = "$BIN/containerd-shim-runc-v2"
    [$RT.runc.options]
      BinaryName = "$RUNC"
      Root = "$R/ctrd/runc"
      SystemdCgroup = false
  [$RT.runsc]
    runtime_type = "io.containerd.runsc.v1"
    runtime_path = "$BIN/containerd-shim-runsc-v1"
    [$RT.runsc.options]
      TypeUrl = "io.containerd.runsc.v1.options"
      ConfigPath = "$R/runsc.toml"
  [$RT.runsc-hostnet]
    runtime_type = "io.containerd.runsc.v1"
    runtime_path = "$BIN/containerd-shim-runsc-v1"
    [$RT.runsc-hostnet.options]
      TypeUrl = "io.containerd.runsc.v1.options"
      ConfigPath = "$R/runsc-hostnet.toml"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$R/cni/bin"]
    conf_dir = "$R/cni/net.d"
EOF
start containerd "$BIN/containerd" --config "$R/containerd.toml"

# Images without a registry: pause (our static binary) and busybox (Debian's static busybox).
I=$R/images
mkdir -p "$I/pause" "$I/busybox"/{bin,etc,tmp,root}
cp "$BIN/pause" "$I/pause/pause"
cp "$BUSYBOX" "$I/busybox/bin/busybox"
for a in $("$BUSYBOX" --list); do [ "$a" = busybox ] || ln -sf busybox "$I/busybox/bin/$a"; done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$I/busybox/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$I/busybox/etc/group"
chmod 1777 "$I/busybox/tmp"
"$BIN/mkimage" -rootfs "$I/pause" -tag localhost/pause:local -entrypoint /pause -o "$I/pause.tar"
"$BIN/mkimage" -rootfs "$I/busybox" -tag localhost/busybox:local -cmd sh -o "$I/busybox.tar"
wait_for "containerd's socket" 30 test -S "$R/containerd.sock"
for t in pause busybox; do # (ctr warns that cgroup v1 is deprecated on every call; that is known)
	"$BIN/ctr" -a "$R/containerd.sock" -n k8s.io images import "$I/$t.tar" 2> >(grep -v 'DEPRECATION: The support for cgroup v1' >&2) >/dev/null
done
say "containerd up, images localhost/pause:local and localhost/busybox:local imported"

kc() { "$BIN/kubectl" --kubeconfig "$KC" "$@"; }
wait_for "kube-apiserver /readyz" 120 kc get --raw /readyz
say "kube-apiserver ready"

cat >"$R/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_ADDR
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$P/ca.crt"}
authorization: {mode: Webhook}
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$R/containerd.sock
podLogsDir: $R/pods-logs
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: ""
EOF
start kubelet "$BIN/kubelet" --config="$R/kubelet.yaml" --kubeconfig="$KC" --root-dir="$R/kubelet" \
	--cert-dir="$R/kubelet/pki" --hostname-override="$NODE"
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$KC" --authentication-kubeconfig="$KC" \
	--authorization-kubeconfig="$KC" --leader-elect=false --bind-address=127.0.0.1
start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$KC" \
	--authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" --leader-elect=false \
	--bind-address=127.0.0.1 --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
	--use-service-account-credentials=false

# RuntimeClasses: runc (runc), gvisor (runsc, gVisor's netstack) and gvisor-hostnet (runsc with
# network=host).
kc apply -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: runc}
handler: runc
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: gvisor}
handler: runsc
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: gvisor-hostnet}
handler: runsc-hostnet
EOF

node_ready() {
	[ "$(kc get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ] &&
		[ -z "$(kc get node "$NODE" -o 'jsonpath={.spec.taints}')" ]
}
wait_for "node $NODE Ready and untainted" 120 node_ready
wait_for "service account default/default" 60 kc -n default get serviceaccount default
wait_for "configmap default/kube-root-ca.crt" 60 kc -n default get configmap kube-root-ca.crt

cat >"$R/env" <<EOF
KUBECONFIG=$KC
CONTAINERD_ADDRESS=$R/containerd.sock
BIN=$BIN
NODE=$NODE
EOF
up=1
say "node $NODE Ready; kubeconfig $KC"
echo "$KC"
