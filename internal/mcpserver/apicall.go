package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/openapi"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// APICallFunc sends one request to agentbox's own REST API: in process, the api handler with
// the caller's identity (gate.CallerFrom) carried over, so that the REST gate (scopes,
// approvals, the audit log) applies to the inner request too; for `agentbox mcp` against a
// running serve, the REST client. A REST error is a reply (status ≥ 400 and its JSON body);
// err is for a request that could not be made. reply is at most MaxAPICallReply+1 bytes.
type APICallFunc func(ctx context.Context, method, path string, query url.Values, body []byte) (status int, header http.Header, reply []byte, err error)

// Bounds of api_call.
const (
	// MaxAPICallBody bounds the request body (JSON), as the REST API bounds JSON bodies.
	MaxAPICallBody = 24 << 20
	// MaxAPICallReply bounds the reply's body returned; a longer one is cut there and marked
	// truncated.
	MaxAPICallReply = 1 << 20
)

// APICallIn are api_call's arguments.
type APICallIn struct {
	Method string         `json:"method" jsonschema:"The HTTP method: GET, POST, PUT, PATCH or DELETE."`
	Path   string         `json:"path" jsonschema:"The route's path with its parameters filled in, e.g. /v1/sandboxes/sb-0123456789ab/jobs (no query string, no .. or empty segments); it must match a route of GET /v1/openapi.json."`
	Query  map[string]any `json:"query,omitempty" jsonschema:"Query parameters: a string, number or boolean, or an array of them for a repeated parameter."`
	Body   any            `json:"body,omitempty" jsonschema:"The request body, any JSON value, sent as application/json (at most 24 MiB)."`
}

// APICallOut is api_call's reply.
type APICallOut struct {
	// Route is the document's route the request matched ("GET /v1/sandboxes/{id}").
	Route  string `json:"route"`
	Status int    `json:"status"`
	// Headers are the reply's headers that say something about the body or the call.
	Headers map[string]string `json:"headers"`
	// Body is the reply: its JSON value (body_encoding "json"), its text ("text") or its bytes
	// in base64 ("base64"); absent when empty.
	Body         any    `json:"body,omitempty"`
	BodyEncoding string `json:"body_encoding"`
	// Bytes is the length of the body returned; Truncated says the reply was longer and was
	// cut at MaxAPICallReply bytes.
	Bytes     int  `json:"bytes"`
	Truncated bool `json:"truncated"`
}

// apiCallHeaders are the reply headers api_call returns.
var apiCallHeaders = []string{"Content-Type", "Content-Length", "Content-Disposition", "Location", "Allow", "Retry-After", "Www-Authenticate", "X-Agentbox-Sha256"}

func (s *Server) addAPICallTool() {
	methods := []any{"GET", "POST", "PUT", "PATCH", "DELETE"}
	addTool(s, &mcp.Tool{
		Name:  "api_call",
		Title: "Call agentbox's REST API",
		Description: `Send one request to agentbox's own REST API, for what the other tools leave out (e.g. image inspect, batch listing, a job's logs window). The routes are those of the OpenAPI document (GET /v1/openapi.json, which this tool can fetch); method and path are checked against it segment by segment before anything is sent: a {param} segment takes one non-empty segment, and "..", encoded "/" and empty segments are refused. Arguments: method, path (required), query (object), body (JSON). The call runs as you, under the same scopes, approvals and audit as every tool.
Reply: {route, status, headers, body (the JSON value; or text, or base64 for binary: body_encoding says which), bytes, truncated (the reply was cut at 1 MiB)}. A REST error comes back as this tool's error with the REST code and details.status.
` + errorsDoc("INVALID_ARGUMENT (a method or path outside the document: details.allowed lists every route; or a bad query or body)", "UNSUPPORTED_OPERATION (this server has no API to call)", "and any REST error of the route called"),
		Annotations: &mcp.ToolAnnotations{Title: "Call agentbox's REST API", DestructiveHint: ptr(true), IdempotentHint: false, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["method"].Enum = methods
		scalar := func() []*jsonschema.Schema { // fresh each time: a schema is a tree
			return []*jsonschema.Schema{{Type: "string"}, {Type: "number"}, {Type: "boolean"}}
		}
		in.Properties["query"].AdditionalProperties = &jsonschema.Schema{AnyOf: append(scalar(), &jsonschema.Schema{Type: "array", Items: &jsonschema.Schema{AnyOf: scalar()}})}
	}, s.apiCall)
}

func (s *Server) apiCall(ctx context.Context, call *mcp.CallToolRequest, in APICallIn) (APICallOut, string, error) {
	route, err := openapi.Match(in.Method, in.Path)
	if err != nil {
		return APICallOut{}, "", err
	}
	if route.Path == "/v1/sandboxes/{id}/pty" {
		return APICallOut{}, "", errcode.New(errcode.InvalidArgument, "GET /v1/sandboxes/{id}/pty is a WebSocket terminal, not a request and reply; use exec or job_start").With("argument", "path")
	}
	if s.opts.APICall == nil {
		return APICallOut{}, "", errcode.New(errcode.UnsupportedOp, "this MCP server has no REST API to call")
	}
	q := url.Values{}
	for k, v := range in.Query {
		vals, ok := v.([]any)
		if !ok {
			vals = []any{v}
		}
		for _, x := range vals {
			str, err := queryValue(x)
			if err != nil {
				return APICallOut{}, "", errcode.New(errcode.InvalidArgument, "query %q: %v", k, err).With("argument", "query")
			}
			q.Add(k, str)
		}
	}
	var body []byte
	if in.Body != nil {
		if body, err = json.Marshal(in.Body); err != nil {
			return APICallOut{}, "", errcode.New(errcode.InvalidArgument, "body: %v", err).With("argument", "body")
		}
		if len(body) > MaxAPICallBody {
			return APICallOut{}, "", errcode.New(errcode.InvalidArgument, "body is %d bytes of JSON; at most %d", len(body), MaxAPICallBody).With("argument", "body")
		}
	}
	// The inner request runs as this call's caller: over HTTP the identity the server put on
	// the request; on stdio the process's own session, as the gate saw this call.
	if _, ok := gate.CallerFrom(ctx); !ok {
		ctx = gate.WithCaller(ctx, gate.Caller{ID: s.processOwner, Name: "stdio", Scope: "admin", Principal: gate.AdminPrincipal})
	}
	owner, _ := s.ownerOf(ctx, call.Session)
	status, hdr, reply, err := s.opts.APICall(sandbox.WithOwner(ctx, owner), route.Method, in.Path, q, body)
	if err != nil {
		return APICallOut{}, "", err
	}
	out := APICallOut{Route: route.String(), Status: status, Headers: map[string]string{}}
	for _, h := range apiCallHeaders {
		if v := hdr.Get(h); v != "" {
			out.Headers[h] = v
		}
	}
	if len(reply) > MaxAPICallReply {
		reply, out.Truncated = reply[:MaxAPICallReply], true
	}
	out.Bytes = len(reply)
	mt, _, _ := mime.ParseMediaType(hdr.Get("Content-Type"))
	if status >= 400 && mt == "application/json" {
		var e struct {
			Error *ToolError `json:"error"`
		}
		if json.Unmarshal(reply, &e) == nil && e.Error != nil && e.Error.Code != "" {
			rerr := &errcode.Error{Code: e.Error.Code, Message: e.Error.Message, Details: e.Error.Details}
			return APICallOut{}, "", rerr.With("status", status).With("route", route.String())
		}
	}
	switch {
	case len(reply) == 0:
		out.BodyEncoding = "none"
	case !out.Truncated && (mt == "application/json" || strings.HasSuffix(mt, "+json")) && json.Unmarshal(reply, &out.Body) == nil:
		out.BodyEncoding = "json"
	case utf8.Valid(reply) && (strings.HasPrefix(mt, "text/") || mt == "application/json" || mt == "application/x-ndjson" || mt == ""):
		out.Body, out.BodyEncoding = string(reply), "text"
	default:
		out.Body, out.BodyEncoding = base64.StdEncoding.EncodeToString(reply), "base64"
	}
	text := fmt.Sprintf("%s %s → %d (%d bytes", route.Method, in.Path, status, out.Bytes)
	if out.Truncated {
		text += fmt.Sprintf(", truncated at %d", MaxAPICallReply)
	}
	text += ")"
	if out.BodyEncoding == "json" || out.BodyEncoding == "text" {
		shown := string(reply)
		if len(shown) > 16<<10 {
			shown = shown[:16<<10] + "… (the whole body is in the structured content)"
		}
		text += "\n" + shown
	}
	return out, text, nil
}

func queryValue(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case json.Number:
		return x.String(), nil
	}
	return "", fmt.Errorf("must be a string, number or boolean, or an array of them")
}
