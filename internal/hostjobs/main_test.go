package hostjobs_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/hostjobs"
)

// TestMain lets the test binary play the two other processes of a machine: the supervisor
// (`hostjob-supervise DIR`, as agentbox does) and a whole agent (`test-agent DIR`: a Manager and
// its handler on a loopback port it prints), which the tests kill and start again.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case hostjobs.SupervisorCommand:
			os.Exit(hostjobs.Supervise(os.Args[2:]))
		case "test-agent":
			os.Exit(testAgent(os.Args[2]))
		}
	}
	os.Exit(m.Run())
}

func testAgent(dir string) int {
	mgr, err := hostjobs.NewManager(hostjobs.Options{Dir: dir, NoSystemdScope: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(ln.Addr().String())
	http.Serve(ln, hostjobs.NewHandler(mgr))
	return 0
}

// agentProc is a test agent running as its own process.
type agentProc struct {
	cmd    *exec.Cmd
	client *hostjobs.Client
}

func startAgent(t *testing.T, dir string) *agentProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "test-agent", dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("test agent: %v", err)
	}
	a := &agentProc{cmd: cmd, client: hostjobs.NewClient(&http.Client{Timeout: 60 * time.Second}, "http://"+strings.TrimSpace(addr))}
	t.Cleanup(func() { a.kill() })
	return a
}

// kill SIGKILLs the agent (and only it: its jobs' supervisors run in their own sessions).
func (a *agentProc) kill() {
	if a.cmd.ProcessState == nil {
		a.cmd.Process.Kill()
		a.cmd.Wait()
	}
}

func newManager(t *testing.T) (*hostjobs.Manager, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "jobs")
	m, err := hostjobs.NewManager(hostjobs.Options{Dir: dir, NoSystemdScope: true})
	if err != nil {
		t.Fatal(err)
	}
	return m, dir
}
