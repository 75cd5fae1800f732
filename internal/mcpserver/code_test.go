package mcpserver_test

import (
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/interp"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestRunCode: run_code in a runc sandbox's interpreter keeps state between calls, streams
// prints into logs, reports an exception with its traceback as data, and a context made by
// code_context_create has its own namespace and cwd; a missing context or sandbox is an error.
func TestRunCode(t *testing.T) {
	svc := service(t, sandbox.Config{})
	m := interp.New(svc.Service)
	defer m.Close()
	srv := mcpserver.New(svc, mcpserver.Options{ControlPlane: "test", Interpreter: m})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	var sb wire.Sandbox
	c.ok("sandbox_create", obj{"ttl_seconds": 120}, &sb)

	var ex interp.Execution
	c.ok("run_code", obj{"sandbox_id": sb.ID, "code": "x = 41\nprint('set', x)"}, &ex)
	if strings.Join(ex.Logs.Stdout, "") != "set 41\n" || len(ex.Results) != 0 || ex.Error != nil {
		t.Fatalf("first cell: %+v", ex)
	}
	ex = interp.Execution{}
	c.ok("run_code", obj{"sandbox_id": sb.ID, "code": "x + 1"}, &ex)
	if len(ex.Results) != 1 || ex.Results[0]["text"] != "42" || ex.Results[0]["is_main_result"] != true || ex.ExecutionCount != 2 {
		t.Fatalf("state between calls: %+v", ex)
	}
	ex = interp.Execution{}
	c.ok("run_code", obj{"sandbox_id": sb.ID, "code": "def f():\n    raise ValueError('bad')\nf()"}, &ex)
	if ex.Error == nil || ex.Error.Name != "ValueError" || ex.Error.Value != "bad" || !strings.Contains(ex.Error.Traceback, "in f") || strings.Contains(ex.Error.Traceback, "<string>") {
		t.Fatalf("exception: %+v", ex.Error)
	}

	var ctx interp.Context
	c.ok("code_context_create", obj{"sandbox_id": sb.ID, "cwd": "/tmp"}, &ctx)
	if ctx.ID == "" || ctx.Language != "python" || ctx.Cwd != "/tmp" {
		t.Fatalf("context: %+v", ctx)
	}
	ex = interp.Execution{}
	c.ok("run_code", obj{"sandbox_id": sb.ID, "context_id": ctx.ID, "code": "import os\n('x' in globals(), os.getcwd())"}, &ex)
	if len(ex.Results) != 1 || ex.Results[0]["text"] != "(False, '/tmp')" {
		t.Fatalf("a new context's namespace and cwd: %+v", ex)
	}
	c.fails("run_code", obj{"sandbox_id": sb.ID, "context_id": "nope", "code": "1"}, "FILE_NOT_FOUND")
	c.fails("run_code", obj{"sandbox_id": sb.ID, "language": "r", "code": "1"}, "INVALID_ARGUMENT")
	c.fails("run_code", obj{"sandbox_id": "sb-000000000000", "code": "1"}, "SANDBOX_NOT_FOUND")
}
