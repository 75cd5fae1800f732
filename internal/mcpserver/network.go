package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Network: sandbox_create's network and secrets, and the tools
// sandbox_network_update, sandbox_connections, sandbox_secret_calls, sandbox_expose and
// sandbox_unexpose.

// NetworkBackend is what the network tools need of the network feature (policy updates,
// records and preview URLs), *netsession.Service.
type NetworkBackend interface {
	// UpdateNetwork replaces a sandbox's egress policy (sandbox_network_update).
	UpdateNetwork(ctx context.Context, id string, p egress.Policy) (sandbox.Sandbox, error)
	Connections(ctx context.Context, id string, after int64, limit int) (sandbox.ConnectionList, error)
	SecretCalls(ctx context.Context, id string, after int64, limit int) (sandbox.SecretCallList, error)
	Expose(ctx context.Context, id string, port int, public bool) (sandbox.Exposure, error)
	Unexpose(ctx context.Context, id string, port int) error
}

// MaxRecordPage bounds one page of sandbox_connections and sandbox_secret_calls.
const MaxRecordPage = 1000

// PolicyIn is a network policy as sandbox_create's network object.
type PolicyIn struct {
	Allow []string `json:"allow,omitempty" jsonschema:"Hosts the sandbox may reach: names (pypi.org), wildcards (*.github.com), with an optional :port (default 80 and 443), or CIDRs (203.0.113.0/24). \"*\" means any public host. Private, loopback and cloud-metadata addresses are never reachable."`
	Deny  []string `json:"deny,omitempty" jsonschema:"Hosts refused even when allow matches (same forms); deny wins."`
}

// SecretIn is one secret of sandbox_create.
type SecretIn struct {
	From  string   `json:"from" jsonschema:"Where the server reads the value, at each request: env:VAR (a variable the server allows with --secret-env) or file:/path (under a --secret-dir). The value never enters the sandbox."`
	Hosts []string `json:"hosts" jsonschema:"The only hosts whose requests get the value swapped in (e.g. api.openai.com); a placeholder sent anywhere else stays a placeholder."`
	Body  bool     `json:"body,omitempty" jsonschema:"Swap the placeholder in request bodies too, not only in headers (default false)."`
}

const networkDoc = `The sandbox's network: "none" (the default: no network at all) or {"allow": [...], "deny": [...]}: only the hosts allowed are reachable, through agentbox's egress proxy (HTTP_PROXY is set for every command; pip, npm, git, curl work unchanged). Entries are host names with an optional *. wildcard and :port (default 80 and 443), or CIDRs; deny wins; "*" allows any public host. An empty allow list gives a sandbox with no reachable host whose policy can be changed later with sandbox_network_update (a "none" sandbox cannot be changed).`

// networkSchema is sandbox_create's network argument: the string "none" or a policy object.
func networkSchema() *jsonschema.Schema {
	obj := schemaFor[PolicyIn]()
	return &jsonschema.Schema{
		Description: networkDoc,
		OneOf:       []*jsonschema.Schema{{Type: "string", Enum: []any{"none"}}, obj},
	}
}

// networkArg converts sandbox_create's network argument (already checked against
// networkSchema): nil or "none" is the default.
func networkArg(v any) (*sandbox.Network, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		if x == "none" {
			return nil, nil
		}
	case map[string]any:
		b, _ := json.Marshal(x)
		var p PolicyIn
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, errcode.New(errcode.InvalidArgument, "sandbox_create: argument \"network\": %v", err)
		}
		return &sandbox.Network{Policy: &egress.Policy{Allow: nonNil(p.Allow), Deny: nonNil(p.Deny)}}, nil
	}
	return nil, errcode.New(errcode.InvalidArgument, `sandbox_create: argument "network" must be "none" or an object {"allow": [...], "deny": [...]}`)
}

func secretsArg(in map[string]SecretIn) map[string]sandbox.SecretSpec {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]sandbox.SecretSpec, len(in))
	for k, v := range in {
		out[k] = sandbox.SecretSpec{From: v.From, Hosts: v.Hosts, Body: v.Body}
	}
	return out
}

// tweakCreateNetwork publishes network's oneOf schema and the secrets' bounds.
func tweakCreateNetwork(in *jsonschema.Schema) {
	in.Properties["network"] = networkSchema()
	sec := in.Properties["secrets"]
	sec.AdditionalProperties.Properties["hosts"].MinItems = ptr(1)
	sec.AdditionalProperties.Properties["from"].Pattern = `^(env|file):.+`
	sec.PropertyNames = &jsonschema.Schema{Type: "string", Pattern: `^[A-Za-z_][A-Za-z0-9_]*$`}
}

const egressRefusedDoc = `When a command in the sandbox is refused network access (an HTTP 403 from agentbox's proxy whose body says "agentbox egress: HOST:PORT refused", or a connection reset), the host is not allowed: add it with sandbox_network_update if the task needs it, then retry; sandbox_connections shows what was refused and which rule decided.`

func (s *Server) addNetworkTools() {
	addTool(s, &mcp.Tool{
		Name:  "sandbox_network_update",
		Title: "Change a sandbox's network policy",
		Description: `Replace the egress policy of a running sandbox created with a network policy; the next connection sees it (no restart; open connections are not cut). Arguments: sandbox_id (required), allow (required: the WHOLE new allow list — include the hosts already allowed that you still need), deny.
Entries: host names (pypi.org), wildcards (*.githubusercontent.com), an optional :port (default 80 and 443), or CIDRs; deny wins over allow; "*" allows any public host. Private, loopback, link-local and cloud-metadata addresses are never reachable.
` + egressRefusedDoc + `
Reply: {sandbox_id, state, network: {allow, deny}}.
` + errorsDoc(errNotFound, errNotRunning, "CONFLICT (the sandbox was created with network \"none\": create a new one with a network policy)", errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Change a sandbox's network policy", IdempotentHint: true, DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, nil, s.sandboxNetworkUpdate)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_connections",
		Title: "A sandbox's network connections",
		Description: `List a sandbox's network connections and DNS queries, oldest first: every one, allowed or refused. Arguments: sandbox_id (required), after (a cursor: the next value of the previous page; without it, the newest limit records), limit (1–1000, default 100).
Reply: {sandbox_id, connections: [{seq, time, kind (proxy, transparent or dns), host, port, addr, decision (allowed, denied or error), rule (the policy entry or built-in class that decided), reason (why, and how to change it), bytes_out, bytes_in, duration_ms, intercepted}], next, omitted}.
Use it when a download or API call fails inside the sandbox: a denied record names the rule; add the host with sandbox_network_update.
` + errorsDoc(errNotFound, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "A sandbox's network connections", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, tweakPage, s.sandboxConnections)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_secret_calls",
		Title: "A sandbox's secret swaps",
		Description: `List the requests of a sandbox that carried a secret's placeholder, oldest first (never the value). Arguments: sandbox_id (required), after (cursor), limit (1–1000, default 100).
Reply: {sandbox_id, calls: [{seq, time, secret, host, method, path, replaced (false when the host is not one of the secret's hosts, or the value could not be read), scrubbed (a response from the host that carried the value back: how many times the sandbox got the placeholder in its place), reason}], next, omitted}.
Secrets are given at sandbox_create (secrets: {"NAME": {"from": "env:VAR", "hosts": ["api.example.com"]}}): the sandbox sees NAME=<placeholder>, and agentbox's proxy swaps in the value only on requests to those hosts.
` + errorsDoc(errNotFound, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "A sandbox's secret swaps", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, tweakPage, s.sandboxSecretCalls)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_expose",
		Title: "Expose a sandbox's port as a preview URL",
		Description: `Make a server running in the sandbox reachable from the user's machine as a preview URL (HTTP and WebSocket), without giving the sandbox any network. Arguments: sandbox_id (required), port (required: the port your server listens on inside the sandbox, 1–65535; it must listen on 127.0.0.1 or 0.0.0.0), public (default false).
Reply: {sandbox_id, url (http://PORT-SANDBOX_ID.localhost:SERVERPORT/), port, public, access_token (private only; given once)}. Private: open url + "?agentbox_token=" + access_token once in a browser (it becomes a cookie), or send the server's bearer token; public: no credential. Exposing a port again gives a new access token.
Start the server in the background first (job_start), then expose; a 502 from the URL means nothing listens on the port yet. sandbox_unexpose or sandbox_destroy removes it.
` + errorsDoc(errNotFound, errNotRunning, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Expose a sandbox's port as a preview URL", IdempotentHint: false, DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, tweakPort, s.sandboxExpose)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_unexpose",
		Title: "Remove a preview URL",
		Description: `Remove the preview URL of a sandbox's port; its access token stops working at once. Arguments: sandbox_id (required), port (required, 1–65535).
Reply: {sandbox_id, port}.
` + errorsDoc("SANDBOX_NOT_FOUND (no such sandbox, or the port is not exposed: sandbox_get and your earlier sandbox_expose reply say which)", errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Remove a preview URL", DestructiveHint: ptr(true), IdempotentHint: false, OpenWorldHint: ptr(false)},
	}, tweakPort, s.sandboxUnexpose)
}

func tweakPage(in *jsonschema.Schema) {
	in.Properties["after"].Minimum = ptr(0.0)
	in.Properties["limit"].Minimum = ptr(1.0)
	in.Properties["limit"].Maximum = ptr(float64(MaxRecordPage))
}

func tweakPort(in *jsonschema.Schema) {
	in.Properties["port"].Minimum = ptr(1.0)
	in.Properties["port"].Maximum = ptr(65535.0)
}

// NetworkUpdateIn are sandbox_network_update's arguments.
type NetworkUpdateIn struct {
	SandboxID string   `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab (from sandbox_create or sandbox_list)."`
	Allow     []string `json:"allow" jsonschema:"The whole new allow list (it replaces the old one): host names, *. wildcards, :port, CIDRs; [] allows nothing."`
	Deny      []string `json:"deny,omitempty" jsonschema:"The whole new deny list (deny wins over allow)."`
}

// NetworkOut is sandbox_network_update's reply.
type NetworkOut struct {
	SandboxID string   `json:"sandbox_id" jsonschema:"The sandbox's id."`
	State     string   `json:"state" jsonschema:"The sandbox's state."`
	Network   PolicyIn `json:"network" jsonschema:"The policy now in force (normalised)."`
}

func (s *Server) sandboxNetworkUpdate(ctx context.Context, _ *mcp.CallToolRequest, in NetworkUpdateIn) (NetworkOut, string, error) {
	p := egress.Policy{Allow: nonNil(in.Allow), Deny: nonNil(in.Deny)}
	sb, err := s.net.UpdateNetwork(ctx, in.SandboxID, p)
	if err != nil {
		return NetworkOut{}, "", err
	}
	if sb.Network.Policy != nil {
		p = *sb.Network.Policy
	}
	out := NetworkOut{SandboxID: sb.ID, State: string(sb.State), Network: PolicyIn{Allow: nonNil(p.Allow), Deny: nonNil(p.Deny)}}
	return out, fmt.Sprintf("%s now allows [%s] and denies [%s]; the next connection sees it.", sb.ID, strings.Join(p.Allow, ", "), strings.Join(p.Deny, ", ")), nil
}

// PageIn are the arguments of the paged record tools.
type PageIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab (from sandbox_create or sandbox_list)."`
	After     int64  `json:"after,omitempty" jsonschema:"Cursor: return records after it (pass the previous reply's next); 0 or absent: the newest limit records."`
	Limit     int    `json:"limit,omitempty" jsonschema:"Most records to return, 1 to 1000; default 100."`
}

func (s *Server) sandboxConnections(ctx context.Context, _ *mcp.CallToolRequest, in PageIn) (sandbox.ConnectionList, string, error) {
	l, err := s.net.Connections(ctx, in.SandboxID, in.After, in.Limit)
	if err != nil {
		return sandbox.ConnectionList{}, "", err
	}
	l.Connections = nonNil(l.Connections)
	return l, renderConnections(l), nil
}

func (s *Server) sandboxSecretCalls(ctx context.Context, _ *mcp.CallToolRequest, in PageIn) (sandbox.SecretCallList, string, error) {
	l, err := s.net.SecretCalls(ctx, in.SandboxID, in.After, in.Limit)
	if err != nil {
		return sandbox.SecretCallList{}, "", err
	}
	l.Calls = nonNil(l.Calls)
	var b strings.Builder
	fmt.Fprintf(&b, "%d secret call(s) of %s (next cursor %d)", len(l.Calls), l.SandboxID, l.Next)
	if l.Omitted > 0 {
		fmt.Fprintf(&b, "; %d older not shown", l.Omitted)
	}
	for _, c := range l.Calls {
		state := "replaced"
		switch {
		case c.Scrubbed > 0:
			state = fmt.Sprintf("response scrubbed: the value came back %d time(s), the sandbox got the placeholder", c.Scrubbed)
		case !c.Replaced:
			state = "NOT replaced: " + c.Reason
		}
		fmt.Fprintf(&b, "\n%s %s %s %s%s: %s", c.Time.Format(time.RFC3339), c.Secret, c.Method, c.Host, c.Path, state)
	}
	return l, b.String(), nil
}

// renderConnections is one line per record.
func renderConnections(l sandbox.ConnectionList) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d connection(s) of %s (next cursor %d)", len(l.Connections), l.SandboxID, l.Next)
	if l.Omitted > 0 {
		fmt.Fprintf(&b, "; %d older not shown", l.Omitted)
	}
	for _, c := range l.Connections {
		fmt.Fprintf(&b, "\n%s %s %s %s", c.Time.Format(time.RFC3339), c.Kind, net.JoinHostPort(c.Host, fmt.Sprint(c.Port)), c.Decision)
		if c.Rule != "" {
			fmt.Fprintf(&b, " by %s", c.Rule)
		}
		if c.Decision == egress.Allowed {
			fmt.Fprintf(&b, " (%d B out, %d B in, %d ms)", c.BytesOut, c.BytesIn, c.DurationMS)
		}
		if c.Reason != "" && c.Decision != egress.Allowed {
			fmt.Fprintf(&b, ": %s", c.Reason)
		}
	}
	return b.String()
}

// PortIn are sandbox_unexpose's arguments.
type PortIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab (from sandbox_create or sandbox_list)."`
	Port      int    `json:"port" jsonschema:"The port inside the sandbox, 1 to 65535."`
}

// ExposeIn are sandbox_expose's arguments.
type ExposeIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab (from sandbox_create or sandbox_list)."`
	Port      int    `json:"port" jsonschema:"The port your server listens on inside the sandbox (on 127.0.0.1 or 0.0.0.0), 1 to 65535."`
	Public    bool   `json:"public,omitempty" jsonschema:"true: anyone who can reach the agentbox server may open the URL without a credential; default false (the bearer token or the access token in the reply)."`
}

func (s *Server) sandboxExpose(ctx context.Context, _ *mcp.CallToolRequest, in ExposeIn) (sandbox.Exposure, string, error) {
	e, err := s.net.Expose(ctx, in.SandboxID, in.Port, in.Public)
	if err != nil {
		return sandbox.Exposure{}, "", err
	}
	if e.Public {
		return e, fmt.Sprintf("Port %d of %s is public at %s", e.Port, e.SandboxID, e.URL), nil
	}
	return e, fmt.Sprintf("Port %d of %s is at %s (private). Open %s?agentbox_token=%s once in a browser, or send the server's bearer token.", e.Port, e.SandboxID, e.URL, e.URL, e.AccessToken), nil
}

// UnexposeOut is sandbox_unexpose's reply.
type UnexposeOut struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id."`
	Port      int    `json:"port" jsonschema:"The port that is no longer exposed."`
}

func (s *Server) sandboxUnexpose(ctx context.Context, _ *mcp.CallToolRequest, in PortIn) (UnexposeOut, string, error) {
	if err := s.net.Unexpose(ctx, in.SandboxID, in.Port); err != nil {
		return UnexposeOut{}, "", err
	}
	return UnexposeOut{SandboxID: in.SandboxID, Port: in.Port}, fmt.Sprintf("Port %d of %s is no longer exposed.", in.Port, in.SandboxID), nil
}
