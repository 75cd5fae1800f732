// Package vminit is the guest side of the vm runtime (internal/runtime/microvm): PID 1 of a
// microVM. From the initramfs it loads the kernel modules the VM's devices need, mounts the
// image's root (a read-only ext4 disk) under a writable overlay kept on the sandbox's own disk,
// switches to it and serves the guest protocol (internal/guest) to the host over a virtio-serial
// port, many streams multiplexed over the port's one byte stream with yamux after a handshake
// that drops whatever a previous host connection left in flight. The host side imports this
// package for Config, the handshake and the names both sides share.
package vminit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/yamux"
)

// PortName is the virtserialport's name the agent speaks on.
const PortName = "agentbox.agent"

// ConfigPath is where, on the sandbox's data disk, the host puts the VM's Config (JSON).
const ConfigPath = ".agentbox/vm.json"

// ModulesList is the initramfs file naming the modules /init loads, one file name a line, in order.
const ModulesList = "/modules/order"

// Command is the guest binary's verb that runs vminit.Main (the kernel passes it to /init).
const Command = "guest-vm"

// Config is what the host tells the VM's init.
type Config struct {
	// ID is the sandbox's id: the hostname.
	ID string `json:"id"`
	// Env is the base environment of every command.
	Env map[string]string `json:"env,omitempty"`
	// Workdir is the default working directory ("": /workspace).
	Workdir string `json:"workdir,omitempty"`
	// User runs commands naming none ("": agent).
	User string `json:"user,omitempty"`
	// Network is the sandbox's network mode: "none" or "egress" (loopback only either way;
	// egress adds /etc/resolv.conf naming 127.0.0.1 and the CA bundle, both read-only).
	Network string `json:"network,omitempty"`
	// PidsLimit bounds the tasks of the sandbox's commands, jobs and terminals (a cgroup of
	// their own, the agent outside it); 0: no bound but the VM's RAM.
	PidsLimit int64 `json:"pids_limit,omitempty"`

	caBundle []byte
}

// CABundleFile is where, on the sandbox's data disk, the host puts an egress sandbox's CA
// bundle; init shows it read-only at runtime.CABundlePath.
const CABundleFile = ".agentbox/ca-bundle.pem"

// caBundlePath is runtime.CABundlePath (vminit, linked into the lean agent, does not import the
// runtime contract).
const caBundlePath = "/etc/agentbox/ca-bundle.pem"

const (
	helloPrefix = "AGENTBOX-VM-HELLO "
	ackPrefix   = "AGENTBOX-VM-ACK "
	// maxNoise bounds what a handshake skips before its line (stale bytes of an earlier session).
	maxNoise = 4 << 20
)

// YamuxConfig is the multiplexer's configuration on both sides: no keepalive (a guest still
// booting does not answer pings; a dead VM closes the host's socket), logs discarded.
func YamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.LogOutput = io.Discard
	c.ConnectionWriteTimeout = 30 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	c.MaxStreamWindowSize = 1 << 20
	return c
}

// HostHandshake is the host's side: it sends a hello carrying nonce and reads until the
// guest's ack of that nonce, skipping anything before it. It returns a reader that holds what
// followed the ack (the caller's multiplexer reads from it).
func HostHandshake(rw io.ReadWriter, nonce string) (io.Reader, error) {
	if _, err := io.WriteString(rw, helloPrefix+nonce+"\n"); err != nil {
		return nil, fmt.Errorf("vm agent handshake: %w", err)
	}
	br := bufio.NewReader(rw)
	if err := skipTo(br, ackPrefix+nonce+"\n"); err != nil {
		return nil, fmt.Errorf("vm agent handshake: %w", err)
	}
	return br, nil
}

// guestHandshake is the guest's side: it reads until a hello, answers with the ack of its
// nonce and returns a reader holding what followed the hello.
func guestHandshake(rw io.ReadWriter) (io.Reader, error) {
	br := bufio.NewReader(rw)
	nonce, err := readHello(br)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(rw, ackPrefix+nonce+"\n"); err != nil {
		return nil, err
	}
	return br, nil
}

func readHello(br *bufio.Reader) (string, error) {
	skipped := 0
	for skipped < maxNoise {
		line, err := br.ReadString('\n')
		skipped += len(line)
		if i := strings.Index(line, helloPrefix); i >= 0 && strings.HasSuffix(line, "\n") {
			nonce := strings.TrimSuffix(line[i+len(helloPrefix):], "\n")
			if nonce != "" && len(nonce) <= 64 {
				return nonce, nil
			}
		}
		if err != nil {
			return "", err
		}
	}
	return "", errors.New("no hello within the first 4 MiB")
}

func skipTo(br *bufio.Reader, want string) error {
	skipped := 0
	for skipped < maxNoise {
		line, err := br.ReadString('\n')
		skipped += len(line)
		if strings.HasSuffix(line, want) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return errors.New("no ack within the first 4 MiB")
}

// ReadWriteCloser joins a reader (a handshake's rest) with the writer and closer of the conn.
type ReadWriteCloser struct {
	io.Reader
	io.WriteCloser
}
