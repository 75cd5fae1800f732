//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// machineUnit is the systemd unit `agentbox join --install` writes.
const machineUnit = "agentbox-machine.service"

// installService writes the systemd unit that runs argv (`agentbox join URL --state-dir D`)
// and, when systemctl is there, enables and starts it.
func installService(ctx context.Context, unitDir string, argv []string) error {
	for _, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\%$;") {
			return fmt.Errorf("--install: %q cannot go into a unit file's ExecStart as it is (no spaces, quotes, '%%', '$', ';' or '\\'); use other paths", a)
		}
	}
	unit := fmt.Sprintf(`# Written by agentbox join --install: keeps this machine joined to %s.
[Unit]
Description=agentbox joined machine
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=%s
Restart=always
RestartSec=5
# Exit status 3: the server removed this machine; restarting would not help.
RestartPreventExitStatus=3

[Install]
WantedBy=multi-user.target
`, argv[2], strings.Join(argv, " "))
	path := filepath.Join(unitDir, machineUnit)
	if err := os.WriteFile(path+".tmp", []byte(unit), 0o644); err != nil {
		return fmt.Errorf("--install: %w", err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return fmt.Errorf("--install: %w", err)
	}
	fmt.Fprintf(os.Stderr, "agentbox join: wrote %s\n", path)
	systemctl, err := exec.LookPath("systemctl")
	if err != nil || unitDir != "/etc/systemd/system" {
		fmt.Fprintf(os.Stderr, "agentbox join: start it with: systemctl daemon-reload && systemctl enable --now %s\n", machineUnit)
		return nil
	}
	for _, args := range [][]string{{"daemon-reload"}, {"enable", "--now", machineUnit}} {
		if out, err := exec.CommandContext(ctx, systemctl, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("systemctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	fmt.Fprintf(os.Stderr, "agentbox join: %s enabled and started (journalctl -u %s shows its log)\n", machineUnit, machineUnit)
	return nil
}
