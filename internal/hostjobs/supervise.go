package hostjobs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Supervise is the hidden subcommand `agentbox hostjob-supervise DIR`: it reads the job's argv,
// env and cwd from stdin, starts the job in its own process group with its output going to
// DIR/output.log, writes DIR/pid.json, reports one JSON line on stdout, then waits for the job
// and writes DIR/exit.json atomically. It runs in its own session (and, under systemd, its own
// scope), ignores the signals a terminal or a service stop would send, and on Linux is the child
// subreaper of the job's tree, so a cancel reaches the descendants that left the job's process
// group. It returns the process's exit code.
func Supervise(args []string) int {
	out := json.NewEncoder(os.Stdout)
	fail := func(code errcode.Code, f string, a ...any) int {
		out.Encode(supervisorReply{Code: string(code), Message: fmt.Sprintf(f, a...)})
		return 1
	}
	if len(args) != 1 {
		return fail(errcode.Internal, "usage: agentbox %s DIR", SupervisorCommand)
	}
	dir := args[0]
	var in supervisorInput
	if err := json.NewDecoder(io.LimitReader(os.Stdin, 4<<20)).Decode(&in); err != nil || len(in.Argv) == 0 {
		return fail(errcode.Internal, "bad supervisor input: %v", err)
	}
	ignoreSignals()
	becomeSubreaper()
	if in.Cwd != "" {
		if fi, err := os.Stat(in.Cwd); err != nil || !fi.IsDir() {
			return fail(errcode.InvalidArgument, "cwd %s is not a directory on this machine", in.Cwd)
		}
	}
	path, err := exec.LookPath(in.Argv[0])
	if err != nil {
		return fail(errcode.InvalidArgument, "the shell %s is not installed on this machine (or not on the agent's PATH): pick another shell", in.Argv[0])
	}
	log, err := os.OpenFile(filepath.Join(dir, logFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fail(errcode.Internal, "cannot create the job's log: %v", err)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return fail(errcode.Internal, "cannot open %s: %v", os.DevNull, err)
	}
	cmd := &exec.Cmd{Path: path, Args: in.Argv, Env: in.Env, Dir: in.Cwd, Stdin: devnull,
		Stdout: log, Stderr: log, SysProcAttr: jobAttr(in.CmdLine)}
	if err := cmd.Start(); err != nil {
		return fail(errcode.InvalidArgument, "cannot start the job: %v", err)
	}
	log.Close()
	devnull.Close()
	pid := cmd.Process.Pid
	ps, _ := procStart(pid)
	ss, _ := procStart(os.Getpid())
	if err := writeJSONAtomic(filepath.Join(dir, pidFile), pids{PID: pid, PIDStart: ps, Supervisor: os.Getpid(), SupervisorStart: ss}); err != nil {
		killTree(pids{PID: pid, Supervisor: os.Getpid()}, true)
		return fail(errcode.Internal, "cannot write the job's pid file: %v", err)
	}
	out.Encode(supervisorReply{PID: pid})
	os.Stdout.Close()
	os.Stdin.Close()

	code, sig := waitJob(cmd)
	_, cerr := os.Stat(filepath.Join(dir, cancelFile))
	rec := exitRecord{ExitCode: code, Signal: sig, Canceled: cerr == nil, FinishedAt: time.Now().UTC()}
	for i := 0; ; i++ { // a full disk may free up; the record is all the job's outcome is
		err := writeJSONAtomic(filepath.Join(dir, exitFile), rec)
		if err == nil || errors.Is(err, os.ErrNotExist) || i == 60 {
			break
		}
		time.Sleep(time.Second)
	}
	reapRest()
	return 0
}
