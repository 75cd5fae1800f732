//go:build linux

package guest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

func TestHealth(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	h, err := a.c.Health(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !h.OK || h.Version != guest.Version || h.PID != os.Getpid() {
		t.Fatalf("health = %+v", h)
	}
}

func TestExecExitCodes(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	if err := os.WriteFile(filepath.Join(a.workdir, "noexec.sh"), []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.workdir, "run.sh"), []byte("#!/bin/sh\necho script \"$1\"\nexit 4\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		argv       []string
		code       int
		signal     string
		stdout     string
		stderrPart string
	}{
		{"true", []string{"true"}, 0, "", "", ""},
		{"exit 3", []string{"sh", "-c", "exit 3"}, 3, "", "", ""},
		{"echo", []string{"echo", "a b", "c"}, 0, "", "a b c\n", ""},
		{"killed by SIGKILL", []string{"sh", "-c", "kill -9 $$"}, 137, "SIGKILL", "", ""},
		{"killed by SIGTERM", []string{"sh", "-c", "kill -TERM $$"}, 143, "SIGTERM", "", ""},
		{"not found", []string{"definitely-not-a-command-xyz"}, 127, "", "", "command not found"},
		{"missing path", []string{"/nonexistent/bin/tool"}, 127, "", "", "No such file or directory"},
		{"not executable", []string{"./noexec.sh"}, 126, "", "", "Permission denied"},
		{"a directory", []string{a.workdir}, 126, "", "", "Is a directory"},
		{"relative script", []string{"./run.sh", "x"}, 4, "", "script x\n", ""},
		{"stderr", []string{"sh", "-c", "echo oops >&2"}, 0, "", "", "oops"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := a.exec(t, guest.ExecRequest{Argv: tc.argv})
			if res.ExitCode != tc.code || res.Signal != tc.signal {
				t.Fatalf("exit %d signal %q, want %d %q (stderr %q)", res.ExitCode, res.Signal, tc.code, tc.signal, string(res.Stderr))
			}
			if string(res.Stdout) != tc.stdout {
				t.Fatalf("stdout %q, want %q", string(res.Stdout), tc.stdout)
			}
			if !strings.Contains(string(res.Stderr), tc.stderrPart) || res.StderrBytes != int64(len(string(res.Stderr))) {
				t.Fatalf("stderr %q (%d bytes), want it to contain %q", string(res.Stderr), res.StderrBytes, tc.stderrPart)
			}
			if res.TimedOut || res.Truncated {
				t.Fatalf("unexpected flags: %+v", res)
			}
		})
	}
}

func TestExecStdinEnvCwd(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	if err := os.Mkdir(filepath.Join(a.workdir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Run("stdin", func(t *testing.T) {
		t.Parallel()
		in := strings.Repeat("line of input\n", 300000) // 4.2 MB: more than a pipe buffer
		res := a.exec(t, guest.ExecRequest{Argv: []string{"cat"}, Stdin: []byte(in), MaxOutputBytes: guest.MaxMaxOutputBytes})
		if res.ExitCode != 0 || string(res.Stdout) != in || res.StdoutBytes != int64(len(in)) || res.Truncated {
			t.Fatalf("cat: exit %d, %d bytes, truncated %v", res.ExitCode, res.StdoutBytes, res.Truncated)
		}
	})
	t.Run("stdin not read", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		res := a.exec(t, guest.ExecRequest{Argv: []string{"true"}, Stdin: bytes.Repeat([]byte("x"), 1<<20)})
		if res.ExitCode != 0 || time.Since(start) > 5*time.Second {
			t.Fatalf("exit %d after %v", res.ExitCode, time.Since(start))
		}
	})
	t.Run("no stdin is /dev/null", func(t *testing.T) {
		t.Parallel()
		res := a.exec(t, guest.ExecRequest{Argv: []string{"cat"}})
		if res.ExitCode != 0 || string(res.Stdout) != "" {
			t.Fatalf("%+v", res)
		}
	})
	t.Run("env and cwd", func(t *testing.T) {
		t.Parallel()
		res := a.exec(t, guest.ExecRequest{
			Argv: []string{"sh", "-c", `printf '%s|%s|%s\n' "$FOO" "$HOME_SET" "$(pwd)"`},
			Env:  map[string]string{"FOO": "bar baz", "HOME_SET": "${HOME}"},
			Cwd:  "sub",
		})
		want := "bar baz|${HOME}|" + filepath.Join(a.workdir, "sub") + "\n"
		if string(res.Stdout) != want {
			t.Fatalf("stdout %q, want %q", string(res.Stdout), want)
		}
	})
	t.Run("inherits the agent environment", func(t *testing.T) {
		t.Parallel()
		res := a.exec(t, guest.ExecRequest{Argv: []string{"sh", "-c", `echo "$PATH"`}})
		if strings.TrimSpace(string(res.Stdout)) != os.Getenv("PATH") {
			t.Fatalf("PATH %q, want %q", string(res.Stdout), os.Getenv("PATH"))
		}
	})
	t.Run("default cwd is the workdir", func(t *testing.T) {
		t.Parallel()
		res := a.exec(t, guest.ExecRequest{Argv: []string{"pwd"}})
		if strings.TrimSpace(string(res.Stdout)) != a.workdir {
			t.Fatalf("pwd %q, want %q", string(res.Stdout), a.workdir)
		}
	})
	t.Run("PATH from env is searched", func(t *testing.T) {
		t.Parallel()
		bin := filepath.Join(a.workdir, "bin")
		_ = os.Mkdir(bin, 0o755)
		if err := os.WriteFile(filepath.Join(bin, "mytool"), []byte("#!/bin/sh\necho mytool ran\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		res := a.exec(t, guest.ExecRequest{Argv: []string{"mytool"}, Env: map[string]string{"PATH": bin + ":/usr/bin:/bin"}})
		if res.ExitCode != 0 || string(res.Stdout) != "mytool ran\n" {
			t.Fatalf("%+v", res)
		}
	})
	t.Run("user", func(t *testing.T) {
		t.Parallel()
		_, err := a.c.Exec(ctxT(t, 10*time.Second), guest.ExecRequest{Argv: []string{"id", "-u"}, User: "root"}, nil)
		if os.Geteuid() != 0 {
			wantCode(t, err, errcode.InvalidArgument, "root")
			return
		}
		if err != nil {
			t.Fatal(err)
		}
	})
}

func TestExecInvalid(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	if err := os.WriteFile(filepath.Join(a.workdir, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  guest.ExecRequest
		part string
	}{
		{"empty argv", guest.ExecRequest{}, "argv"},
		{"empty argv[0]", guest.ExecRequest{Argv: []string{"", "x"}}, "argv[0]"},
		{"NUL in argv", guest.ExecRequest{Argv: []string{"echo", "a\x00b"}}, "NUL"},
		{"unknown user", guest.ExecRequest{Argv: []string{"true"}, User: "bob"}, "user"},
		{"negative max output", guest.ExecRequest{Argv: []string{"true"}, MaxOutputBytes: -1}, "max_output_bytes"},
		{"max output too big", guest.ExecRequest{Argv: []string{"true"}, MaxOutputBytes: guest.MaxMaxOutputBytes + 1}, "max_output_bytes"},
		{"negative timeout", guest.ExecRequest{Argv: []string{"true"}, TimeoutMs: -5}, "timeout_ms"},
		{"missing cwd", guest.ExecRequest{Argv: []string{"true"}, Cwd: "nope"}, "does not exist"},
		{"cwd is a file", guest.ExecRequest{Argv: []string{"true"}, Cwd: "file"}, "not a directory"},
		{"bad env key", guest.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A=B": "c"}}, "env key"},
		{"empty env key", guest.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"": "c"}}, "env key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, stream := range []bool{false, true} {
				var onOut guest.OutputFunc
				if stream {
					onOut = func(string, []byte) {}
				}
				_, err := a.c.Exec(ctxT(t, 10*time.Second), tc.req, onOut)
				wantCode(t, err, errcode.InvalidArgument, tc.part)
			}
		})
	}
}

func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     errcode.Code
	}{
		{"malformed JSON", "POST", "/exec", `{"argv": [`, 400, errcode.InvalidArgument},
		{"not an object", "POST", "/exec", `"ls"`, 400, errcode.InvalidArgument},
		{"wrong type", "POST", "/exec", `{"argv": "ls"}`, 400, errcode.InvalidArgument},
		{"unknown field", "POST", "/exec", `{"argv": ["true"], "shell": true}`, 400, errcode.InvalidArgument},
		{"trailing data", "POST", "/exec", `{"argv": ["true"]} {}`, 400, errcode.InvalidArgument},
		{"empty body", "POST", "/exec", ``, 400, errcode.InvalidArgument},
		{"mkdir unknown field", "POST", "/files/mkdir", `{"path": "x", "recursive": true}`, 400, errcode.InvalidArgument},
		{"unknown endpoint", "GET", "/nope", ``, 501, errcode.UnsupportedOp},
		{"wrong method", "PATCH", "/files", ``, 501, errcode.UnsupportedOp},
		{"negative offset", "GET", "/files?path=x&offset=-1", ``, 400, errcode.InvalidArgument},
		{"non-numeric length", "GET", "/files?path=x&length=ten", ``, 400, errcode.InvalidArgument},
		{"bad mode", "PUT", "/files?path=x&mode=0999", `data`, 400, errcode.InvalidArgument},
		{"bad recursive", "DELETE", "/files?path=x&recursive=maybe", ``, 400, errcode.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			status, eb := a.raw(t, tc.method, tc.path, tc.body)
			if status != tc.status || eb.Code != string(tc.code) || eb.Message == "" {
				t.Fatalf("status %d body %+v, want %d %s", status, eb, tc.status, tc.code)
			}
		})
	}
	// A body larger than the exec bound is refused, not buffered.
	big := `{"argv": ["true"], "stdin": "` + strings.Repeat("A", 32<<20) + `"}`
	status, eb := a.raw(t, "POST", "/exec", big)
	if status != 400 || eb.Code != string(errcode.InvalidArgument) {
		t.Fatalf("huge body: %d %+v", status, eb)
	}
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			t.Parallel()
			var onOut guest.OutputFunc
			if stream {
				onOut = func(string, []byte) {}
			}
			start := time.Now()
			// Both the shell and its background child ignore SIGTERM; SIGKILL of the group
			// kills them anyway.
			res, err := a.c.Exec(ctxT(t, 30*time.Second), guest.ExecRequest{
				Argv:      []string{"sh", "-c", `trap "" TERM; sleep 100 & echo $!; sleep 100`},
				TimeoutMs: 500,
			}, onOut)
			elapsed := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if !res.TimedOut || res.ExitCode != 137 || res.Signal != "SIGKILL" {
				t.Fatalf("result %+v", res)
			}
			if elapsed > 2500*time.Millisecond {
				t.Fatalf("took %v for a 500 ms timeout", elapsed)
			}
			if res.DurationMs < 450 {
				t.Fatalf("duration %d ms", res.DurationMs)
			}
			bg, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
			if err != nil {
				t.Fatalf("stdout %q", string(res.Stdout))
			}
			processGone(t, bg, 2*time.Second)
		})
	}
}

func TestExecOutputBound(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	req := guest.ExecRequest{Argv: []string{"sh", "-c", "yes | head -c 5000000; yes e | head -c 3000 >&2"}, MaxOutputBytes: 1 << 20}
	check := func(t *testing.T, res guest.ExecResult) {
		t.Helper()
		if res.ExitCode != 0 || !res.Truncated || res.StdoutBytes != 5000000 || len(string(res.Stdout)) != 1<<20 {
			t.Fatalf("exit %d truncated %v stdout_bytes %d len %d", res.ExitCode, res.Truncated, res.StdoutBytes, len(string(res.Stdout)))
		}
		if string(res.Stdout) != strings.Repeat("y\n", 1<<19) {
			t.Fatal("kept stdout is not the first MiB of output")
		}
		if res.StderrBytes != 3000 || string(res.Stderr) != strings.Repeat("e\n", 1500) {
			t.Fatalf("stderr %d bytes", res.StderrBytes)
		}
	}
	t.Run("buffered", func(t *testing.T) {
		t.Parallel()
		check(t, a.exec(t, req))
	})
	t.Run("streamed", func(t *testing.T) {
		t.Parallel()
		var streamed = map[string]int{}
		maxChunk := 0
		res, err := a.c.Exec(ctxT(t, 60*time.Second), req, func(stream string, data []byte) {
			streamed[stream] += len(data)
			maxChunk = max(maxChunk, len(data))
		})
		if err != nil {
			t.Fatal(err)
		}
		check(t, res)
		if streamed["stdout"] != 5000000 || streamed["stderr"] != 3000 {
			t.Fatalf("streamed %v", streamed)
		}
		if maxChunk > 64<<10 {
			t.Fatalf("chunk of %d bytes", maxChunk)
		}
	})
	t.Run("streamed large escaped result", func(t *testing.T) {
		t.Parallel()
		// Control bytes are escaped sixfold in the JSON Result frame: 2 × 1 MiB of them make a
		// 12 MiB line, which the client must still read.
		res, err := a.c.Exec(ctxT(t, 60*time.Second), guest.ExecRequest{
			Argv: []string{"sh", "-c", `head -c 1048576 /dev/zero | tr '\0' '\1'; head -c 1048576 /dev/zero | tr '\0' '\2' >&2`},
		}, func(string, []byte) {})
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != strings.Repeat("\x01", 1<<20) || string(res.Stderr) != strings.Repeat("\x02", 1<<20) || res.Truncated {
			t.Fatalf("stdout %d stderr %d bytes", len(string(res.Stdout)), len(string(res.Stderr)))
		}
	})
	t.Run("small bound", func(t *testing.T) {
		t.Parallel()
		res := a.exec(t, guest.ExecRequest{Argv: []string{"echo", "hello world"}, MaxOutputBytes: 5})
		if string(res.Stdout) != "hello" || res.StdoutBytes != 12 || !res.Truncated {
			t.Fatalf("%+v", res)
		}
	})
}

func TestExecBackgroundChildHoldingStdout(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	start := time.Now()
	res := a.exec(t, guest.ExecRequest{Argv: []string{"sh", "-c", "sleep 30 & echo $!"}})
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Fatalf("took %v", elapsed)
	}
	bg, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v", res)
	}
	// The background child was not killed: it outlives the command, like with a shell, and
	// as an orphan it now belongs to the agent (PID 1 in a sandbox, a subreaper here).
	if st, ppid, ok := procStat(bg); !ok || st == "Z" || ppid != os.Getpid() {
		t.Fatalf("background child: state %q parent %d ok %v; want alive, parent %d", st, ppid, ok, os.Getpid())
	}
	_ = syscallKill(bg)
	processGone(t, bg, 5*time.Second)
}

func TestExecStreaming(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	var firstAt time.Time
	var chunks []string
	start := time.Now()
	res, err := a.c.Exec(ctxT(t, 30*time.Second), guest.ExecRequest{
		Argv: []string{"sh", "-c", "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three"},
	}, func(stream string, data []byte) {
		if firstAt.IsZero() {
			firstAt = time.Now()
		}
		chunks = append(chunks, stream+":"+string(data))
	})
	end := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if firstAt.IsZero() || end.Sub(firstAt) < 400*time.Millisecond {
		t.Fatalf("first chunk at %v, end at %v: output was not streamed live", firstAt.Sub(start), end.Sub(start))
	}
	// Each stream arrives in order. Across the two pipes there is no order to promise (each has
	// its own reader, as with any runtime that keeps stdout and stderr apart): a loaded CI once
	// delivered "three" before "two", 300 ms apart.
	perStream := map[string]string{}
	for _, c := range chunks {
		stream, data, _ := strings.Cut(c, ":")
		perStream[stream] += data
	}
	if perStream["stdout"] != "one\nthree\n" || perStream["stderr"] != "two\n" || len(perStream) != 2 {
		t.Fatalf("chunks %q: want stdout one, three and stderr two", chunks)
	}
	if res.ExitCode != 0 || string(res.Stdout) != "one\nthree\n" || string(res.Stderr) != "two\n" {
		t.Fatalf("result %+v", res)
	}
}

func TestExecCancelKillsCommand(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	t.Run("streaming", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(ctxT(t, 30*time.Second))
		defer cancel()
		pid := 0
		start := time.Now()
		_, err := a.c.Exec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", "echo $$; exec sleep 100"}}, func(_ string, data []byte) {
			if pid == 0 {
				pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
				cancel()
			}
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
		if pid == 0 || time.Since(start) > 10*time.Second {
			t.Fatalf("pid %d after %v", pid, time.Since(start))
		}
		processGone(t, pid, 5*time.Second)
	})
	t.Run("buffered", func(t *testing.T) {
		t.Parallel()
		pidFile := filepath.Join(a.workdir, "pid")
		ctx, cancel := context.WithCancel(ctxT(t, 30*time.Second))
		defer cancel()
		go func() {
			for ctx.Err() == nil {
				if b, err := os.ReadFile(pidFile); err == nil && bytes.HasSuffix(b, []byte("\n")) {
					cancel()
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		_, err := a.c.Exec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", "echo $$ > pid; exec sleep 100"}}, nil)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
		b, _ := os.ReadFile(pidFile)
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		processGone(t, pid, 5*time.Second)
	})
}

func TestExecConcurrent(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			res, err := a.c.Exec(ctxT(t, 60*time.Second), guest.ExecRequest{
				Argv: []string{"sh", "-c", fmt.Sprintf("echo %d; exit %d", i, i%5)},
			}, nil)
			if err != nil {
				t.Error(err)
				return
			}
			if string(res.Stdout) != fmt.Sprintf("%d\n", i) || res.ExitCode != i%5 {
				t.Errorf("command %d: %+v", i, res)
			}
		})
	}
	wg.Wait()
}

// TestNoZombies is not parallel: no other test's children exit while it counts.
func TestNoZombies(t *testing.T) {
	a := startAgent(t)
	cmds := [][]string{
		{"true"},
		{"sh", "-c", "exit 7"},
		{"sh", "-c", "kill -9 $$"},
		{"sh", "-c", "true & true & wait"},
		{"sh", "-c", "(sleep 0.2 &) ; sleep 0.1 & echo orphaned"}, // orphans reparent to the agent
		{"no-such-command-xyz"},
	}
	for _, argv := range cmds {
		a.exec(t, guest.ExecRequest{Argv: argv})
	}
	_, _ = a.c.Exec(ctxT(t, 10*time.Second), guest.ExecRequest{Argv: []string{"sleep", "10"}, TimeoutMs: 100}, nil)
	time.Sleep(400 * time.Millisecond) // let the orphans exit
	deadline := time.Now().Add(5 * time.Second)
	for {
		zs := zombieChildren(t)
		if len(zs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("zombie children left: %v", zs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
