#!/bin/bash
# teardown.sh stops the cluster cluster-up.sh started in $AGENTBOX_K8S_STATE (default
# /var/lib/agentbox-k8s) and removes everything it made, pods still running or not: the recorded
# processes, every process in the kubelet's kubepods cgroups (pod containers, gVisor sandboxes),
# every process running one of the cluster's binaries (shims, runsc sandboxes and gofers), the mounts under the
# state dir, the bridge sbxbr0, the kubepods cgroups, the host dirs the cluster created and the
# state dir itself. It then checks that nothing is left and exits 1 (naming it) if something is.
# Without a state dir it changes nothing and only checks.
# It kills only what belongs to this cluster: recorded pids, pids in the kubepods cgroups, pids
# running a binary from the cluster's build dir, runc calls naming the state dir.
set -uo pipefail
R=${AGENTBOX_K8S_STATE:-/var/lib/agentbox-k8s}
BRIDGE=sbxbr0
say() { echo "hack/k8s/teardown.sh: $*" >&2; }
[ "$(id -u)" = 0 ] || { say "needs root"; exit 1; }

pid_of() { [ -f "$R/pids/$1" ] && cat "$R/pids/$1"; }
# stop SIG NAME...: signals the recorded processes.
stop() {
	local sig=$1 n p
	shift
	for n in "$@"; do p=$(pid_of "$n") && kill "-$sig" "$p" 2>/dev/null; done
}
# wait_gone SECONDS NAME...: waits until the recorded processes have exited.
wait_gone() {
	local secs=$1 i n p alive
	shift
	for ((i = 0; i < secs * 10; i++)); do
		alive=
		for n in "$@"; do p=$(pid_of "$n") && kill -0 "$p" 2>/dev/null && alive=1; done
		[ -z "$alive" ] && return 0
		sleep 0.1
	done
	return 1
}
# The kubelet's pod cgroups: /sys/fs/cgroup/<controller>/kubepods on cgroup v1, /sys/fs/cgroup/kubepods on v2.
kubepods() {
	local c
	for c in /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods; do [ -d "$c" ] && echo "$c"; done
	return 0
}
pod_pids() {
	local c
	for c in $(kubepods); do find "$c" -name cgroup.procs -exec cat {} +; done 2>/dev/null | sort -u
}
# The cluster's other processes: those running a binary from the build dir the cluster was started
# from (containerd, shims, runsc sandboxes and gofers, the control plane), and runc calls naming $R.
BIN=$(cat "$R/bin" 2>/dev/null)
state_pids() {
	local d exe
	for d in /proc/[0-9]*; do
		exe=$(readlink "$d/exe" 2>/dev/null) || continue
		if [ -n "$BIN" ] && [ "${exe#"$BIN"/}" != "$exe" ]; then
			echo "${d#/proc/}"
		elif [ "${exe##*/}" = runc ] && grep -qaF -e "$R/" "$d/cmdline" 2>/dev/null; then
			echo "${d#/proc/}"
		fi
	done
}
kill_all() { # kill_all PIDS-FUNC: SIGKILL until none are left (bounded)
	local i p
	for ((i = 0; i < 50; i++)); do
		p=$($1)
		[ -z "$p" ] && return 0
		kill -9 $p 2>/dev/null
		sleep 0.1
	done
	return 1
}

if [ ! -d "$R" ]; then
	# No cluster was started from $R: touch nothing (the bridge, cgroups and host paths could be
	# another cluster's), only report what a cluster left on this machine.
	say "no cluster state in $R; checking only"
else
	# The node agents first, so nothing restarts what is being removed.
	stop TERM kubelet kube-scheduler kube-controller-manager
	wait_gone 5 kubelet kube-scheduler kube-controller-manager || stop KILL kubelet kube-scheduler kube-controller-manager
	# Pods (runc containers, gVisor sandboxes and gofers), then the rest; shims and stragglers last.
	kill_all pod_pids
	stop TERM containerd kube-apiserver etcd
	wait_gone 10 containerd kube-apiserver etcd || stop KILL containerd kube-apiserver etcd
	kill_all state_pids
	kill_all pod_pids

	# Mounts: the state dir's (overlay rootfs, shm, netns, pod volumes) and the hard-coded host paths.
	for i in 1 2 3; do
		findmnt -rn -o TARGET | grep -E "^($R|/var/lib/kubelet|/run/containerd)(/|$)" | sort -r | xargs -r -n1 umount -l 2>/dev/null
	done
	ip link delete "$BRIDGE" 2>/dev/null
	for c in $(kubepods); do find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null; done
	if [ -f "$R/host-dirs" ]; then
		while read -r d; do case $d in /var/lib/kubelet | /run/containerd | /var/lib/cni | /var/log/pods | /var/log/containers) rm -rf "$d" ;; esac; done <"$R/host-dirs"
	fi
	rm -rf /var/lib/cni/results/agentbox-k8s-* /var/lib/cni/networks/agentbox-k8s 2>/dev/null
	rm -rf "$R"
fi

# Check.
left=
p=$(state_pids) && [ -n "$p" ] && left="$left processes of the cluster: $p;"
p=$(pod_pids) && [ -n "$p" ] && left="$left processes in kubepods cgroups: $p;"
m=$(findmnt -rn -o TARGET | grep -E "^($R|/var/lib/kubelet|/run/containerd)(/|$)") && left="$left mounts: $m;"
ip link show "$BRIDGE" >/dev/null 2>&1 && left="$left bridge $BRIDGE;"
c=$(kubepods) && [ -n "$c" ] && left="$left cgroups $(echo $c);"
[ -e "$R" ] && left="$left $R;"
if [ -n "$left" ]; then say "left behind:$left"; exit 1; fi
say "stopped; nothing left"
