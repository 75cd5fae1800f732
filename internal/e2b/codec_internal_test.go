package e2b

import (
	"encoding/json"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/agentbox/agentbox/internal/e2b/envd/process"
)

// The process events are written by hand (codec.go): each must be the JSON protojson writes,
// value for value, for a Start and a Connect stream alike.
func TestEventJSONIsProtojsons(t *testing.T) {
	str := func(s string) *string { return &s }
	events := []*process.ProcessEvent{
		nil,
		{},
		{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 1000}}},
		{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{}}},
		{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte("hello\n\x00\xff")}}}},
		{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: []byte{}}}}},
		{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: []byte("\x1b[0m>")}}}},
		{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{}}},
		{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: 0, Exited: true, Status: "exit status 0"}}},
		{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: 2, Exited: true, Status: "exit status 2"}}},
		{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: killed"}}},
		{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "error", Error: str("sandbox \"sb-1\" is\tgone\n\\ \x01 \x7f é ✓")}}},
		{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{Error: str("")}}},
		{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{}}},
		{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}},
	}
	for _, ev := range events {
		for _, m := range []proto.Message{&process.StartResponse{Event: ev}, &process.ConnectResponse{Event: ev}} {
			want, err := protojson.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			got, err := jsonCodec{}.MarshalAppend([]byte("prefix"), m)
			if err != nil {
				t.Fatal(err)
			}
			if string(got[:6]) != "prefix" {
				t.Fatalf("MarshalAppend dropped what it appends to: %q", got)
			}
			var w, g any
			if err := json.Unmarshal(want, &w); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(got[6:], &g); err != nil {
				t.Fatalf("%v: not JSON: %s: %v", ev, got[6:], err)
			}
			if !reflect.DeepEqual(w, g) {
				t.Errorf("%T %v:\n got %s\nwant %s", m, ev, got[6:], want)
			}
			back := m.ProtoReflect().New().Interface()
			if err := (jsonCodec{}).Unmarshal(got[6:], back); err != nil || !proto.Equal(back, m) {
				t.Errorf("%s reads back as %v (%v), not %v", got[6:], back, err, m)
			}
		}
	}
	// A string protojson refuses (not UTF-8) goes to protojson, which says so.
	bad := &process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{Status: "\xff"}}}}
	if _, err := (jsonCodec{}).Marshal(bad); err == nil {
		t.Error("an end event whose status is not UTF-8 was written; protojson refuses it")
	}
	// Other messages are protojson's.
	ls := &process.ListResponse{Processes: []*process.ProcessInfo{{Pid: 1001, Tag: str("t")}}}
	got, err := jsonCodec{}.Marshal(ls)
	if err != nil {
		t.Fatal(err)
	}
	back := &process.ListResponse{}
	if err := protojson.Unmarshal(got, back); err != nil || !proto.Equal(back, ls) {
		t.Errorf("ListResponse: %s", got)
	}
}
