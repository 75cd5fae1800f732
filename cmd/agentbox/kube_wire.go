//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/version"
)

// newKubeRuntimes connects to the cluster of cfg: runtime kubernetes (the process
// RuntimeClass) and, when a kernel RuntimeClass is configured, kubernetes-gvisor. A runtime the
// cluster cannot give (no such RuntimeClass, the API server unreachable) is registered
// unavailable with its reason, like a local runtime whose binary is missing.
func newKubeRuntimes(ctx context.Context, cfg config.Config, guestBin string, log *slog.Logger) ([]runtime.Runtime, error) {
	// client-go reports through klog what it also returns as errors (an exec that ended is
	// "UnhandledError" noise on stderr): the runtime logs what matters through slog.
	klog.SetLogger(logr.Discard())
	guestImage := cfg.KubeGuestImage
	if guestImage == "" {
		var err error
		if guestImage, err = kubernetes.GuestImageTag(version.Version, guestBin); err != nil {
			return nil, fmt.Errorf("the guest image's tag: %w", err)
		}
	}
	base := kubernetes.Config{Kubeconfig: cfg.KubeConfig, Context: cfg.KubeContext, Namespace: cfg.KubeNamespace,
		GuestImage: guestImage, HostImage: cfg.KubeHostImage, NodeName: cfg.KubeNodeName, Delivery: cfg.KubeGuestDelivery, Version: version.Version, Logger: log}
	var rts []runtime.Runtime
	for _, iso := range []struct {
		isolation runtime.Isolation
		class     string
	}{{runtime.IsolationProcess, cfg.KubeRuntimeClassProcess}, {runtime.IsolationKernel, cfg.KubeRuntimeClassKernel}} {
		if iso.isolation == runtime.IsolationKernel && iso.class == "" {
			continue
		}
		c := base
		c.Isolation, c.RuntimeClass = iso.isolation, iso.class
		rt, err := kubernetes.New(ctx, c)
		if err != nil {
			return nil, err
		}
		if caps := rt.Capabilities(); !caps.Available {
			log.Warn("runtime unavailable; run `agentbox doctor`", "runtime", rt.Name(), "reason", caps.Reason)
		} else {
			log.Info("kubernetes runtime", "runtime", rt.Name(), "namespace", rt.Namespace(), "cluster", caps.Version, "guest_image", guestImage)
		}
		rts = append(rts, rt)
	}
	return rts, nil
}

// kubeChecks is what `agentbox doctor` reports of the cluster the kubernetes runtime would use
// (--kube-config, or the in-cluster config inside a pod; nothing when neither is there): the
// API server and its version, the namespace, the RuntimeClasses (the configured ones present?)
// and the deny-all NetworkPolicy, and the guest image this binary's pods would take. Failures
// are warnings: the local runtimes do not need a cluster.
func kubeChecks(cfg config.Config) []check {
	if cfg.KubeConfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	where := cfg.KubeConfig
	if where == "" {
		where = "in-cluster config"
	}
	cluster := check{Name: "kubernetes", Warn: true}
	rt, err := kubernetes.New(ctx, kubernetes.Config{Kubeconfig: cfg.KubeConfig, Context: cfg.KubeContext, Namespace: cfg.KubeNamespace,
		RuntimeClass: cfg.KubeRuntimeClassProcess, GuestImage: "doctor", ProbeOnly: true, Version: version.Version, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		cluster.Detail = err.Error()
		return []check{cluster}
	}
	info, err := rt.Probe(ctx)
	if info.ServerVersion == "" {
		cluster.Detail = fmt.Sprintf("%s: %v", where, err)
		cluster.Fix = "check --kube-config (and --kube-context), or that the API server is up"
		return []check{cluster}
	}
	cluster.OK, cluster.Detail = true, fmt.Sprintf("API server %s reachable (%s)", info.ServerVersion, where)
	ns := check{Name: "kube namespace", OK: info.Namespace, Warn: true, Detail: cfg.KubeNamespace}
	if !info.Namespace {
		ns.Detail += ": " + fmt.Sprint(err)
		ns.Fix = "kubectl create namespace " + cfg.KubeNamespace + " (or pass --kube-namespace)"
	}
	classes := check{Name: "kube classes", OK: true, Warn: true, Detail: "RuntimeClasses: " + strings.Join(info.RuntimeClasses, ", ")}
	for _, want := range []struct{ flag, class, runtime string }{
		{"--kube-runtime-class-process", cfg.KubeRuntimeClassProcess, kubernetes.NameProcess},
		{"--kube-runtime-class-kernel", cfg.KubeRuntimeClassKernel, kubernetes.NameKernel},
	} {
		if want.class == "" {
			continue
		}
		if slices.Contains(info.RuntimeClasses, want.class) {
			classes.Detail += fmt.Sprintf("; %s uses %s", want.runtime, want.class)
		} else {
			classes.OK = false
			classes.Detail += fmt.Sprintf("; %s (%s) is missing: runtime %s is unavailable", want.class, want.flag, want.runtime)
			classes.Fix = "create the RuntimeClass, or name an existing one with " + want.flag
		}
	}
	out := []check{cluster, ns, classes, kubeRoom(ctx, rt)}
	if info.Namespace {
		pol := check{Name: "kube policy", OK: true, Warn: true, Detail: "NetworkPolicy " + kubernetes.NetworkPolicyName + " denies sandbox pods all ingress and egress (enforced where the cluster's network plugin enforces NetworkPolicies)"}
		if !info.NetworkPolicy {
			pol.Detail = "NetworkPolicy " + kubernetes.NetworkPolicyName + " is not in " + cfg.KubeNamespace + " yet: serve --runtime kubernetes creates it (it needs create on networkpolicies there)"
		}
		out = append(out, pol)
	}
	img := check{Name: "kube guest image", Warn: true}
	if bin, _, err := guestBinary(cfg.GuestBinary); err != nil {
		img.Detail = err.Error()
	} else if tag, err := kubernetes.GuestImageTag(version.Version, bin); err != nil {
		img.Detail = err.Error()
	} else {
		img.OK = true
		img.Detail = "pods take their agent from " + tag + " (agentbox kube-guest-image -o guest.tar writes it: import it on each node, ctr -n k8s.io images import guest.tar, or push it to a registry the nodes pull from)"
	}
	return append(out, img)
}

// kubeRoom is doctor's word on how much of a sandbox's shape the cluster can still place: how
// many default sandboxes fit, and the roomiest node's free cpu and memory.
func kubeRoom(ctx context.Context, rt *kubernetes.Runtime) check {
	c := check{Name: "kube room", Warn: true}
	r, err := rt.Room(ctx, sandbox.DefaultCPU, sandbox.DefaultMemoryMB)
	switch {
	case err != nil:
		c.Detail = "cannot count the cluster's free room: " + err.Error()
		c.Fix = "give the kubeconfig's user list on nodes and pods (cluster-wide), or check with kubectl describe nodes"
	case r.Nodes == 0:
		c.Detail = "no node is Ready and schedulable: every sandbox pod would stay Pending"
		c.Fix = "kubectl get nodes: uncordon a node or make one Ready"
	default:
		c.OK = r.Fit > 0
		c.Detail = fmt.Sprintf("%d more sandboxes of the default shape (%g cpu, %d MiB) fit on %d node(s); the roomiest node has %.2f cpu and %d MiB free",
			r.Fit, sandbox.DefaultCPU, sandbox.DefaultMemoryMB, r.Nodes, float64(r.FreeMilliCPU)/1000, r.FreeMemoryMB)
		if !c.OK {
			c.Fix = "destroy sandboxes or other pods, ask for less cpu or memory per sandbox (--cpu, --memory-mb), or add nodes: a create would fail with CAPACITY_UNAVAILABLE"
		}
	}
	return c
}
