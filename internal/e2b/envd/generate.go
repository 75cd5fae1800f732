// Package envd holds the Go code generated from E2B's envd protobufs (proto/, Apache-2.0): the
// process.Process and filesystem.Filesystem services the E2B SDKs call inside a sandbox. The
// generated packages are checked in; go generate ./internal/e2b/envd regenerates them with buf
// (from the Go module proxy) and the protoc-gen-go and protoc-gen-connect-go versions go.mod pins.
package envd

//go:generate go run github.com/bufbuild/buf/cmd/buf@v1.75.0 generate
