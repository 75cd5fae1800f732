//go:build !windows

package remoteexec

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/shell"
)

// TestElevate: as root the command is unchanged; otherwise it goes through `sudo -n --` when
// passwordless sudo works, and is refused saying why when there is no sudo or it wants a
// password (a stand-in sudo on PATH plays each part).
func TestElevate(t *testing.T) {
	spec := shell.Command(shell.Sh, "id -u")
	if got, err := elevateAs(context.Background(), spec, 0); err != nil || !slices.Equal(got.Args, spec.Args) {
		t.Fatalf("as root: %+v %v", got, err)
	}
	dir := t.TempDir()
	t.Setenv("PATH", dir)
	if _, err := elevateAs(context.Background(), spec, 1000); errcode.Of(err) != errcode.UnsupportedOp || !strings.Contains(errcode.Message(err), "no sudo") {
		t.Errorf("no sudo: %v", err)
	}
	sudo := filepath.Join(dir, "sudo")
	_ = os.WriteFile(sudo, []byte("#!/bin/sh\necho 'sudo: a password is required' >&2\nexit 1\n"), 0o755)
	if _, err := elevateAs(context.Background(), spec, 1000); errcode.Of(err) != errcode.UnsupportedOp || !strings.Contains(errcode.Message(err), "a password is required") {
		t.Errorf("sudo wants a password: %v", err)
	}
	_ = os.WriteFile(sudo, []byte("#!/bin/sh\nexit 0\n"), 0o755)
	got, err := elevateAs(context.Background(), spec, 1000)
	if err != nil || !slices.Equal(got.Args, []string{sudo, "-n", "--", "sh", "-c", "id -u"}) || got.Path != sudo {
		t.Errorf("passwordless sudo: %+v %v", got, err)
	}
}
