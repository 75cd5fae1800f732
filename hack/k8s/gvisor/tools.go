//go:build tools

// Package tools pins the gVisor commands this tool module builds (hack/k8s/build.sh): runsc and
// its containerd shim.
package tools

import (
	_ "gvisor.dev/gvisor/runsc"
	_ "gvisor.dev/gvisor/shim"
)
