//go:build !unix

package main

import "os"

// notifyResize: Windows consoles send no resize signal; the shell keeps its first size.
func notifyResize(chan<- os.Signal) {}
