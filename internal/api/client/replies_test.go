package client

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/remotejobs"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/wire"
)

// sameShape returns "" when a and b encode to the same JSON: the same fields in the same order,
// each with the same name, tag, embedding and type (or a type of the same shape), or says where
// they differ.
func sameShape(a, b reflect.Type) string {
	if a == b {
		return ""
	}
	if a.Kind() != b.Kind() {
		return a.String() + " is a " + a.Kind().String() + ", " + b.String() + " a " + b.Kind().String()
	}
	if equivalent[[2]reflect.Type{a, b}] || equivalent[[2]reflect.Type{b, a}] {
		return ""
	}
	if a.Kind() == reflect.Pointer {
		return sameShape(a.Elem(), b.Elem())
	}
	if marshals(a) || marshals(b) {
		return a.String() + " and " + b.String() + " are different types that marshal themselves"
	}
	switch a.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return sameShape(a.Elem(), b.Elem())
	case reflect.Map:
		if p := sameShape(a.Key(), b.Key()); p != "" {
			return p
		}
		return sameShape(a.Elem(), b.Elem())
	case reflect.Struct:
		fa, fb := jsonFields(a), jsonFields(b)
		if len(fa) != len(fb) {
			return a.String() + " and " + b.String() + " have different fields"
		}
		for i := range fa {
			x, y := fa[i], fb[i]
			named := !x.Anonymous || !y.Anonymous || x.Tag.Get("json") != ""
			if x.Tag != y.Tag || x.Anonymous != y.Anonymous || (named && x.Name != y.Name) {
				return a.String() + "." + x.Name + " is not " + b.String() + "." + y.Name + " (name, tag or embedding)"
			}
			if p := sameShape(x.Type, y.Type); p != "" {
				return a.String() + "." + x.Name + ": " + p
			}
		}
		return ""
	}
	return "" // a bool, number or string of the same kind encodes the same
}

// jsonFields are the fields of t that encoding/json writes: exported, not tagged "-".
func jsonFields(t reflect.Type) []reflect.StructField {
	var out []reflect.StructField
	for f := range t.Fields() {
		if (f.IsExported() || f.Anonymous) && f.Tag.Get("json") != "-" {
			out = append(out, f)
		}
	}
	return out
}

// equivalent are the pairs of types that marshal themselves the same way (TestWireSandboxBytes
// holds the network's two types to it).
var equivalent = map[[2]reflect.Type]bool{
	{reflect.TypeFor[wire.Network](), reflect.TypeFor[sandbox.Network]()}: true,
}

// marshals reports whether t (or *t) writes its own JSON.
func marshals(t reflect.Type) bool {
	for _, i := range []reflect.Type{reflect.TypeFor[json.Marshaler](), reflect.TypeFor[encoding.TextMarshaler]()} {
		if t.Implements(i) || reflect.PointerTo(t).Implements(i) {
			return true
		}
	}
	return false
}

// TestReplyShapes: the wire types the client sends and reads encode exactly as the server's
// types they stand for (api's bodies, the domain's requests and replies) do: the same fields
// in the same order, with the same names, tags and shapes.
func TestReplyShapes(t *testing.T) {
	for _, c := range []struct{ client, server any }{
		// the lists and frames api replies with
		{wire.PoolList{}, api.PoolList{}},
		{wire.SnapshotList{}, api.SnapshotList{}},
		{wire.ExecFrame{}, api.ExecFrame{}},
		{wire.ApprovalList{}, api.ApprovalList{}},
		{wire.ImageList{}, api.ImageList{}},
		{wire.ImportResult{}, api.ImportResult{}},
		{wire.ExposureList{}, api.ExposureList{}},
		{wire.KeyList{}, api.KeyList{}},
		{wire.RunRequest{}, api.RunRequest{}},
		{wire.BatchStartRequest{}, api.BatchStartRequest{}},
		{wire.MatrixStartRequest{}, api.MatrixStartRequest{}},
		{wire.CompareStartRequest{}, api.CompareStartRequest{}},
		{wire.ExecRequest{}, api.ExecRequest{}},
		{wire.PoolSetRequest{}, api.PoolSetRequest{}},
		{wire.WaitOptions{}, api.WaitOptions{}},
		// the domain's requests and replies
		{wire.PTYExit{}, sandbox.PTYExit{}},
		{wire.PTYRequest{}, sandbox.PTYRequest{}},
		{wire.RemoteJobStart{}, remotejobs.StartRequest{}},
		{wire.RemoteJobLogsRequest{}, remotejobs.LogsRequest{}},
		{wire.CreateRequest{}, sandbox.CreateRequest{}},
		{wire.Capacity{}, sandbox.Capacity{}},
		{wire.ConnectionList{}, sandbox.ConnectionList{}},
		{wire.SecretCallList{}, sandbox.SecretCallList{}},
		{wire.DiffRequest{}, sandbox.DiffRequest{}},
		{wire.DiffResult{}, sandbox.DiffResult{}},
		{wire.DirList{}, sandbox.DirList{}},
		{wire.ExecResult{}, sandbox.ExecResult{}},
		{wire.Exposure{}, sandbox.Exposure{}},
		{wire.FileInfo{}, sandbox.FileInfo{}},
		{wire.FleetMetrics{}, sandbox.FleetMetrics{}},
		{wire.SandboxMetrics{}, sandbox.SandboxMetrics{}},
		{wire.ForkRequest{}, sandbox.ForkRequest{}},
		{wire.Job{}, sandbox.Job{}},
		{wire.JobList{}, sandbox.JobList{}},
		{wire.JobLogs{}, sandbox.JobLogs{}},
		{wire.Pool{}, sandbox.Pool{}},
		{wire.PoolStatus{}, sandbox.PoolStatus{}},
		{wire.Snapshot{}, sandbox.Snapshot{}},
		{wire.SnapshotRequest{}, sandbox.SnapshotRequest{}},
		{wire.Run{}, runs.Run{}},
		{wire.RunList{}, runs.RunList{}},
		{wire.RunEventList{}, runs.EventList{}},
		{wire.RunLogs{}, runs.Logs{}},
		{wire.RunSpec{}, runs.Spec{}},
		{wire.Batch{}, runs.Batch{}},
		{wire.BatchList{}, runs.BatchList{}},
		{wire.BatchRequest{}, runs.BatchRequest{}},
		{wire.MatrixRequest{}, runs.MatrixRequest{}},
		{wire.CompareRequest{}, runs.CompareRequest{}},
		{wire.Image{}, image.Image{}},
		{wire.ImageUsage{}, image.Usage{}},
		{wire.ImageProgress{}, image.Progress{}},
		{wire.PruneReport{}, image.PruneReport{}},
		{wire.Approval{}, approval.Approval{}},
		{wire.AuditList{}, audit.List{}},
		{wire.APIKey{}, auth.Key{}},
		{wire.KeyCreateRequest{}, auth.CreateRequest{}},
		{wire.CreatedKey{}, auth.Created{}},
		{wire.SQLResult{}, sqlquery.Result{}},
		{wire.Policy{}, egress.Policy{}},
		{wire.Connection{}, egress.Connection{}},
	} {
		if p := sameShape(reflect.TypeOf(c.client), reflect.TypeOf(c.server)); p != "" {
			t.Errorf("%T and %T: %s", c.client, c.server, p)
		}
	}
	if wire.MaxPTYRows != sandbox.MaxPTYRows || wire.MaxPTYCols != sandbox.MaxPTYCols || wire.MaxPTYData != sandbox.MaxPTYData ||
		wire.MaxPTYMessage != api.MaxPTYMessage {
		t.Error("the wire's terminal limits are not the server's")
	}
}

// TestReplyShapesCatch: the comparison finds a renamed tag, a changed type and a missing field.
func TestReplyShapesCatch(t *testing.T) {
	type a struct {
		X int `json:"x"`
	}
	type tag struct {
		X int `json:"y"`
	}
	type typ struct {
		X string `json:"x"`
	}
	type more struct {
		X int `json:"x"`
		Y int `json:"y"`
	}
	type stamp struct {
		X time.Duration `json:"x"`
	}
	type when struct {
		X time.Time `json:"x"`
	}
	type whenNot struct {
		X struct{ Wall uint64 } `json:"x"`
	}
	if sameShape(reflect.TypeOf(when{}), reflect.TypeOf(whenNot{})) == "" {
		t.Error("a type that marshals itself passed as a plain struct")
	}
	for _, b := range []any{tag{}, typ{}, more{}, []a{}, stamp{}} {
		if sameShape(reflect.TypeOf(a{}), reflect.TypeOf(b)) == "" {
			t.Errorf("%T passed as the same shape as a", b)
		}
	}
	type same struct {
		X int `json:"x"`
	}
	if p := sameShape(reflect.TypeOf(a{}), reflect.TypeOf(same{})); p != "" {
		t.Errorf("same shape refused: %s", p)
	}
}

// TestExecRequestBytes: the CLI's exec body is byte for byte what api's type writes, every field
// set and none.
func TestExecRequestBytes(t *testing.T) {
	full := wire.ExecRequest{Command: []string{"sh", "-c", "true"}, Env: map[string]string{"A": "1"}, Cwd: "/w", Stdin: "in",
		StdinBase64: "aW4=", TimeoutSeconds: 1.5, MaxOutputBytes: 9, User: "root", Background: true, Changes: true, Checkpoint: true}
	for _, w := range []wire.ExecRequest{full, {}} {
		got, _ := json.Marshal(w)
		want, _ := json.Marshal(api.ExecRequest(w))
		if !bytes.Equal(got, want) {
			t.Fatalf("wire: %s\napi:  %s", got, want)
		}
	}
}
