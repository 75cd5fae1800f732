package e2b

import (
	"encoding/base64"
	"strconv"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/agentbox/agentbox/internal/e2b/envd/process"
)

// jsonCodec is Connect's JSON codec (protojson: the SDKs speak connect+json) with the process
// events — every message of a Start or Connect stream — written directly: the same JSON
// protojson writes for them (field names, omitted zero values, base64 bytes), without its
// reflection on each event. Everything else, and every request, goes through protojson.
type jsonCodec struct{}

var _ connect.Codec = jsonCodec{}

func (jsonCodec) Name() string { return "json" }

func (c jsonCodec) Marshal(m any) ([]byte, error) { return c.MarshalAppend(nil, m) }

// MarshalAppend is what Connect calls for each message it sends.
func (jsonCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	var ev *process.ProcessEvent
	switch r := m.(type) {
	case *process.StartResponse:
		ev = r.GetEvent()
	case *process.ConnectResponse:
		ev = r.GetEvent()
	default:
		pm, ok := m.(proto.Message)
		if !ok {
			return nil, connect.NewError(connect.CodeInternal, errNotProto)
		}
		return protojson.MarshalOptions{}.MarshalAppend(dst, pm)
	}
	if out, ok := appendEventResponse(dst, ev); ok {
		return out, nil
	}
	return protojson.MarshalOptions{}.MarshalAppend(dst, m.(proto.Message))
}

func (jsonCodec) Unmarshal(b []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return errNotProto
	}
	if len(b) == 0 {
		return errEmptyJSON
	}
	// As Connect's own codec: unknown fields are let through (a newer SDK's).
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, pm)
}

type codecError string

func (e codecError) Error() string { return string(e) }

const (
	errNotProto  = codecError("the message is not a protobuf message")
	errEmptyJSON = codecError("zero-length payload is not a valid JSON object")
)

// appendEventResponse appends {"event":…} for ev (a StartResponse or ConnectResponse carrying
// it) as protojson does; ok is false for what it does not write itself (a string that is not
// UTF-8, which protojson refuses): the caller then uses protojson.
func appendEventResponse(b []byte, ev *process.ProcessEvent) ([]byte, bool) {
	if ev == nil {
		return append(b, "{}"...), true
	}
	b = append(b, `{"event":{`...)
	switch e := ev.GetEvent().(type) {
	case *process.ProcessEvent_Start:
		b = append(b, `"start":{`...)
		if pid := e.Start.GetPid(); pid != 0 {
			b = append(b, `"pid":`...)
			b = strconv.AppendUint(b, uint64(pid), 10)
		}
		b = append(b, '}')
	case *process.ProcessEvent_Data:
		b = append(b, `"data":{`...)
		switch o := e.Data.GetOutput().(type) {
		case *process.ProcessEvent_DataEvent_Stdout:
			b = appendBytesField(b, "stdout", o.Stdout)
		case *process.ProcessEvent_DataEvent_Stderr:
			b = appendBytesField(b, "stderr", o.Stderr)
		case *process.ProcessEvent_DataEvent_Pty:
			b = appendBytesField(b, "pty", o.Pty)
		}
		b = append(b, '}')
	case *process.ProcessEvent_End:
		end := e.End
		if !utf8.ValidString(end.GetStatus()) || !utf8.ValidString(end.GetError()) {
			return nil, false
		}
		b = append(b, `"end":{`...)
		sep := false
		field := func(name string) {
			if sep {
				b = append(b, ',')
			}
			sep = true
			b = append(b, '"')
			b = append(b, name...)
			b = append(b, `":`...)
		}
		if end.GetExitCode() != 0 {
			field("exitCode")
			b = strconv.AppendInt(b, int64(end.GetExitCode()), 10)
		}
		if end.GetExited() {
			field("exited")
			b = append(b, "true"...)
		}
		if end.GetStatus() != "" {
			field("status")
			b = appendJSONString(b, end.GetStatus())
		}
		if end.Error != nil {
			field("error")
			b = appendJSONString(b, *end.Error)
		}
		b = append(b, '}')
	case *process.ProcessEvent_Keepalive:
		b = append(b, `"keepalive":{}`...)
	}
	return append(b, "}}"...), true
}

// appendBytesField appends "name":"base64" (standard, padded: protojson's bytes).
func appendBytesField(b []byte, name string, v []byte) []byte {
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, `":"`...)
	b = base64.StdEncoding.AppendEncode(b, v)
	return append(b, '"')
}

// appendJSONString appends s, valid UTF-8, as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		case c < 0x20 || c == 0x7f:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
