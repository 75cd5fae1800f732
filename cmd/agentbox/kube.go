package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes"
	"github.com/agentbox/agentbox/internal/version"
)

// cmdKubeGuestImage writes the guest image (what the kubernetes runtime's pods take the agent
// from: the lean agentbox-guest serve would use) as a tarball to import into the cluster's nodes or push to a registry
// they reach, and prints its reference (serve's --kube-guest-image default for this binary).
func cmdKubeGuestImage(args []string) int {
	fs := flag.NewFlagSet("kube-guest-image", flag.ContinueOnError)
	out := fs.String("o", "agentbox-guest.tar", "the tarball to write")
	tag := fs.String("tag", "", "the image reference (default: "+kubernetes.GuestImageRepo+":<version>-<binary hash>)")
	guestBin := fs.String("guest-binary", "", "the agent binary the image holds (default: agentbox-guest beside this binary, as serve takes it)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	bin, lean, err := guestBinary(*guestBin)
	if err == nil && !lean {
		fmt.Fprintln(os.Stderr, "agentbox kube-guest-image: warning:", fatGuestWarning)
	}
	if err == nil && *tag == "" {
		*tag, err = kubernetes.GuestImageTag(version.Version, bin)
	}
	if err == nil {
		err = kubernetes.WriteGuestImage(bin, *tag, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentbox kube-guest-image:", err)
		return 1
	}
	fmt.Println(*tag)
	return 0
}

// registerKubeFlags adds serve's kubernetes runtime flags.
func registerKubeFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.StringVar(&cfg.KubeConfig, "kube-config", "", "kubeconfig of the cluster for --runtime kubernetes (default: the in-cluster config of a server in a pod)")
	fs.StringVar(&cfg.KubeContext, "kube-context", "", "the kubeconfig's context (default: its current one)")
	fs.StringVar(&cfg.KubeNamespace, "kube-namespace", cfg.KubeNamespace, "namespace of the sandboxes' pods")
	fs.StringVar(&cfg.KubeRuntimeClassProcess, "kube-runtime-class-process", cfg.KubeRuntimeClassProcess, `RuntimeClass of runtime kubernetes (process isolation; "" = the cluster's default handler)`)
	fs.StringVar(&cfg.KubeRuntimeClassKernel, "kube-runtime-class-kernel", cfg.KubeRuntimeClassKernel, `RuntimeClass of runtime kubernetes-gvisor (kernel isolation; "" = not offered)`)
	fs.StringVar(&cfg.KubeGuestImage, "kube-guest-image", "", "image the pods take the agent binary from (default: "+kubernetes.GuestImageRepo+":<version>-<hash of the agent binary, agentbox-guest>, as agentbox kube-guest-image writes it)")
	fs.StringVar(&cfg.KubeHostImage, "kube-host-image", "", `image that sandboxes of image "host" run on the cluster (default: image "host" is not offered there)`)
	fs.StringVar(&cfg.KubeNodeName, "kube-node-name", "", "pin sandbox pods to this node (default: the scheduler places them)")
	fs.StringVar(&cfg.KubeGuestDelivery, "kube-guest-delivery", kubernetes.DeliveryImageVolume, "how the agent gets into pods: image-volume (the guest image mounted read-only; Kubernetes ≥ 1.35, containerd ≥ 2.1) or init-container (copied into an emptyDir; any cluster)")
}
