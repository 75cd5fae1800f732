//go:build tools

// Package tools pins the Kubernetes commands this tool module builds (hack/k8s/build.sh), so
// `go mod tidy` keeps every staging module they need at v0.37.2.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
