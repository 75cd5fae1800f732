package client

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/remotejobs"
	"github.com/agentbox/agentbox/internal/sandbox"
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
		if a.NumField() != b.NumField() {
			return a.String() + " and " + b.String() + " have different fields"
		}
		for i := range a.NumField() {
			fa, fb := a.Field(i), b.Field(i)
			if fa.Name != fb.Name || fa.Tag != fb.Tag || fa.Anonymous != fb.Anonymous {
				return a.String() + "." + fa.Name + " is not " + b.String() + "." + fb.Name + " (name, tag or embedding)"
			}
			if p := sameShape(fa.Type, fb.Type); p != "" {
				return a.String() + "." + fa.Name + ": " + p
			}
		}
		return ""
	}
	return "" // a bool, number or string of the same kind encodes the same
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

// TestReplyShapes: the client's copies of the server's request and reply bodies (those that
// still hold domain types, and the wire copies of api's requests that have methods) encode
// exactly as the server's types do.
func TestReplyShapes(t *testing.T) {
	for _, c := range []struct{ client, server any }{
		{PoolList{}, api.PoolList{}},
		{SnapshotList{}, api.SnapshotList{}},
		{execFrame{}, api.ExecFrame{}},
		{approvalList{}, api.ApprovalList{}},
		{imageList{}, api.ImageList{}},
		{importResult{}, api.ImportResult{}},
		{exposureList{}, api.ExposureList{}},
		{runRequest{}, api.RunRequest{}},
		{batchStartRequest{}, api.BatchStartRequest{}},
		{matrixStartRequest{}, api.MatrixStartRequest{}},
		{compareStartRequest{}, api.CompareStartRequest{}},
		{wire.ExecRequest{}, api.ExecRequest{}},
		{wire.PoolSetRequest{}, api.PoolSetRequest{}},
		{wire.WaitOptions{}, api.WaitOptions{}},
		{wire.PTYExit{}, sandbox.PTYExit{}},
		{wire.PTYRequest{}, sandbox.PTYRequest{}},
		{wire.RemoteJobStart{}, remotejobs.StartRequest{}},
		{wire.RemoteJobLogsRequest{}, remotejobs.LogsRequest{}},
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
