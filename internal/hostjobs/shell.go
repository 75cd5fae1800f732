package hostjobs

import (
	"runtime"

	"github.com/agentbox/agentbox/internal/shell"
)

// shellSpec returns the dialect and the process that run command on this platform ("" is the
// platform's default), or INVALID_ARGUMENT: the same dialects as remote_exec (internal/shell),
// including cmd's verbatim command line (Spec.CmdLine), which Args alone would re-quote.
func shellSpec(name, command string) (string, shell.Spec, error) {
	d, err := shell.Resolve(runtime.GOOS, name)
	if err != nil {
		return "", shell.Spec{}, err
	}
	return string(d), shell.Command(d, command), nil
}

// CheckShell resolves shell ("" is the platform's default) for a machine of platform (its
// GOOS), or says why it does not run there: the server checks before it records anything.
func CheckShell(platform, name string) (string, error) {
	d, err := shell.Resolve(platform, name)
	return string(d), err
}
