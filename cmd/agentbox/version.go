package main

import (
	"fmt"
	goruntime "runtime"

	"github.com/agentbox/agentbox/internal/version"
)

func cmdVersion(args []string) int {
	fmt.Printf("agentbox %s (%s, %s/%s)\n", version.Version, goruntime.Version(), goruntime.GOOS, goruntime.GOARCH)
	return 0
}
