package e2b

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// templateLabel keeps the template a sandbox was created from, so that get and list report it.
const templateLabel = "e2b.template"

// DefaultTimeout is a sandbox's timeout when create gives none: E2B's 300 seconds.
const DefaultTimeout = 300

// newSandbox is E2B's create body (NewSandbox). Fields agentbox does not map are accepted and
// ignored (docs/E2B.md lists them).
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              bool              `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *sandboxNetwork   `json:"network"`
	AutoPause           *bool             `json:"autoPause"`
	AutoResume          *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	VolumeMounts []json.RawMessage `json:"volumeMounts"`
}

// sandboxNetwork is E2B's network configuration (SandboxNetworkConfig).
type sandboxNetwork struct {
	AllowOut           []string        `json:"allowOut"`
	DenyOut            []string        `json:"denyOut"`
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	MaskRequestHost    *string         `json:"maskRequestHost"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
	Rules              json.RawMessage `json:"rules"`
}

// denyAll is E2B's "deny every address" entry.
const denyAll = "0.0.0.0/0"

// egressPolicy maps E2B's internet and network options onto agentbox's egress policy (nil: no
// network, agentbox's default). E2B's allowOut wins over its denyOut; agentbox's deny wins over
// its allow: what cannot be said exactly is refused, naming the field.
func egressPolicy(b newSandbox) (*sandbox.Network, error) {
	n := b.Network
	if n == nil {
		n = &sandboxNetwork{}
	}
	set := func(m json.RawMessage) bool { return len(m) > 0 && string(m) != "null" }
	if set(n.EgressProxy) || set(n.Rules) {
		return nil, errcode.New(errcode.UnsupportedOp, "network.egressProxy and network.rules are not offered by agentbox's E2B API; give allowOut/denyOut, or use agentbox's own network policy and secrets (docs/API.md)")
	}
	closed := b.AllowInternetAccess != nil && !*b.AllowInternetAccess || slices.Contains(n.DenyOut, denyAll)
	switch {
	case closed && len(n.AllowOut) == 0:
		return nil, nil // no network at all
	case closed:
		// Nothing but allowOut (the rest of denyOut lies within "everything").
		return &sandbox.Network{Policy: &egress.Policy{Allow: slices.Clone(n.AllowOut), Deny: []string{}}}, nil
	case len(n.AllowOut) > 0 && len(n.DenyOut) > 0:
		return nil, errcode.New(errcode.InvalidArgument, "network.allowOut beside a denyOut other than %s cannot be mapped: in E2B allowOut wins over denyOut, in agentbox deny wins over allow; deny %s and list what to allow, or drop allowOut", denyAll, denyAll)
	case b.AllowInternetAccess == nil && len(n.AllowOut) == 0 && len(n.DenyOut) == 0:
		return nil, nil // not asked: agentbox's default, no network
	}
	// The internet, less denyOut: "*" is any public host (by name; private and metadata
	// addresses never).
	return &sandbox.Network{Policy: &egress.Policy{Allow: append([]string{"*"}, n.AllowOut...), Deny: append([]string{}, n.DenyOut...)}}, nil
}

// sandboxReply is E2B's Sandbox: what create, connect and resume answer.
type sandboxReply struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// sandboxDetail is E2B's SandboxDetail and ListedSandbox: what get and list answer.
type sandboxDetail struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
	Domain      *string           `json:"domain"`
	// AllowInternetAccess: false without network, true when any public host is allowed, left
	// out for a narrower policy.
	AllowInternetAccess *bool `json:"allowInternetAccess,omitempty"`
	// Lifecycle is what happens at the timeout ("kill", or "pause": agentbox's on_expiry
	// sleep) and whether a call resumes a paused sandbox (agentbox's auto_wake).
	Lifecycle lifecycle `json:"lifecycle"`
}

// lifecycle is E2B's SandboxLifecycle.
type lifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// decodeBody reads an optional JSON body into v (E2B's API ignores unknown fields).
func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil {
		return errcode.New(errcode.InvalidArgument, "request body: %v", err)
	}
	if len(b) > 1<<20 {
		return errcode.New(errcode.FileTooLarge, "request body exceeds 1 MiB")
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errcode.New(errcode.InvalidArgument, "request body is not valid JSON: %v", err)
	}
	return nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var body newSandbox
	if err := decodeBody(r, &body); err != nil {
		writeAPIError(w, err)
		return
	}
	if body.TemplateID == "" {
		body.TemplateID = "base"
	}
	img, known := Templates[body.TemplateID]
	if !known {
		img = body.TemplateID
	}
	ttl := int64(DefaultTimeout)
	if body.Timeout != nil {
		ttl = *body.Timeout
	}
	if ttl < 1 {
		writeAPIError(w, errcode.New(errcode.InvalidArgument, "timeout must be at least 1 second; got %d", ttl))
		return
	}
	if max := int64(s.svc.Config().MaxTTL / time.Second); max > 0 && ttl > max {
		ttl = max // E2B caps the timeout at the plan's maximum; agentbox at --max-ttl
	}
	// lifecycle: onTimeout "pause" sleeps the sandbox at its timeout (agentbox's on_expiry
	// sleep); autoResume wakes it for the next envd call (agentbox's auto_wake).
	req := sandbox.CreateRequest{Image: img, TTLSeconds: ttl, Env: body.EnvVars}
	if body.AutoPause != nil && *body.AutoPause {
		req.OnExpiry = sandbox.OnExpirySleep
	}
	req.AutoWake = body.AutoResume != nil && body.AutoResume.Enabled
	if len(body.VolumeMounts) > 0 {
		writeAPIError(w, errcode.New(errcode.UnsupportedOp, "volumeMounts are not offered by agentbox's E2B API: agentbox has no E2B volumes (docs/E2B.md)"))
		return
	}
	network, err := egressPolicy(body)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	labels := map[string]string{}
	for k, v := range body.Metadata {
		labels[k] = v
	}
	labels[templateLabel] = body.TemplateID
	req.Labels, req.Network = labels, network
	sb, err := s.svc.Create(r.Context(), req)
	if err != nil {
		if errcode.Of(err) == errcode.ImageNotFound {
			err = errcode.New(errcode.SandboxNotFound, "template %q not found: it is neither an E2B template agentbox maps (base, code-interpreter-v1) nor an image it can pull: %s", body.TemplateID, errcode.Message(err))
		}
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.reply(r, sb))
}

// reply is sb as E2B's Sandbox, with the caller's credential as its access tokens (the SDK
// sends them on envd and interpreter calls, which agentbox authenticates like any other).
func (s *Server) reply(r *http.Request, sb sandbox.Sandbox) sandboxReply {
	cred := credentialFrom(r.Context())
	out := sandboxReply{SandboxID: sb.ID, TemplateID: templateOf(sb), ClientID: ClientID, EnvdVersion: EnvdVersion, EnvdAccessToken: cred}
	if cred != "" {
		out.TrafficAccessToken = &cred
	}
	if s.opts.Domain != "" {
		d := s.opts.Domain
		out.Domain = &d
	}
	return out
}

func templateOf(sb sandbox.Sandbox) string {
	if t := sb.Labels[templateLabel]; t != "" {
		return t
	}
	if sb.Image == "" || sb.Image == image.Host {
		return "base"
	}
	return sb.Image
}

func (s *Server) detail(sb sandbox.Sandbox) sandboxDetail {
	meta := map[string]string{}
	for k, v := range sb.Labels {
		if k != templateLabel {
			meta[k] = v
		}
	}
	state := "running"
	if sb.State == sandbox.StateSleeping {
		state = "paused"
	}
	cpu := int(sb.CPU + 0.999)
	if cpu < 1 {
		cpu = 1
	}
	d := sandboxDetail{SandboxID: sb.ID, TemplateID: templateOf(sb), ClientID: ClientID, StartedAt: sb.CreatedAt, EndAt: sb.ExpiresAt,
		CPUCount: cpu, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskMB, Metadata: meta, State: state, EnvdVersion: EnvdVersion,
		Lifecycle: lifecycle{OnTimeout: "kill", AutoResume: sb.AutoWake}}
	if sb.OnExpiry == sandbox.OnExpirySleep {
		d.Lifecycle.OnTimeout = "pause"
	}
	if s.opts.Domain != "" {
		dom := s.opts.Domain
		d.Domain = &dom
	}
	if p := sb.Network.Policy; p == nil {
		d.AllowInternetAccess = new(bool)
	} else if slices.Contains(p.Allow, "*") && len(p.Deny) == 0 {
		open := true
		d.AllowInternetAccess = &open
	}
	return d
}

// live reads sandbox id: SANDBOX_NOT_FOUND unless it is running or paused (E2B forgets a
// sandbox once killed).
func (s *Server) live(r *http.Request, id string) (sandbox.Sandbox, error) {
	sb, err := s.svc.Get(r.Context(), id)
	if err != nil {
		return sb, notFound(id, err)
	}
	switch sb.State {
	case sandbox.StateRunning, sandbox.StateSleeping, sandbox.StateCreating:
		return sb, nil
	}
	return sb, errcode.New(errcode.SandboxNotFound, "sandbox %q not found (it is %s)", id, sb.State)
}

// notFound words a missing sandbox as E2B does.
func notFound(id string, err error) error {
	if errcode.Of(err) == errcode.SandboxNotFound || errcode.Of(err) == errcode.InvalidArgument {
		return errcode.New(errcode.SandboxNotFound, "sandbox %q not found", id)
	}
	return err
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.live(r, r.PathValue("id"))
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.detail(sb))
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var f sandbox.ListFilter
	f.Principal, _ = authz.ListPrincipal(r.Context())
	want := map[string]bool{"running": true, "paused": true}
	if st := q.Get("state"); st != "" {
		want = map[string]bool{}
		for _, v := range strings.Split(st, ",") {
			want[strings.TrimSpace(v)] = true
		}
	}
	if m := q.Get("metadata"); m != "" {
		vals, err := url.ParseQuery(m)
		if err != nil {
			writeAPIError(w, errcode.New(errcode.InvalidArgument, "metadata must be key=value pairs joined by &, URL-encoded: %v", err))
			return
		}
		f.Labels = map[string]string{}
		for k, v := range vals {
			if len(v) > 0 {
				f.Labels[k] = v[0]
			}
		}
	}
	list, err := s.svc.List(r.Context(), f)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	out := []sandboxDetail{}
	for _, sb := range list {
		d := s.detail(sb)
		if sb.State != sandbox.StateRunning && sb.State != sandbox.StateSleeping {
			continue
		}
		if !want[d.State] {
			continue
		}
		if t := q.Get("template"); t != "" && d.TemplateID != t {
			continue
		}
		out = append(out, d)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, err := s.live(r, id); err != nil {
		writeAPIError(w, err)
		return
	}
	s.procs.dropSandbox(id)
	s.code.drop(id)
	if _, err := s.svc.Destroy(r.Context(), id); err != nil {
		writeAPIError(w, notFound(id, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// timeoutBody is the body of set timeout, connect and resume.
type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// applyTimeout makes sb end timeout seconds from now (at most --max-ttl). With shorten (E2B's
// set timeout) that end may be earlier than the current one, and a timeout of 0 or less ends
// the sandbox now; without (connect, resume: E2B's keep-alive) an earlier end leaves it as it
// is.
func (s *Server) applyTimeout(r *http.Request, sb sandbox.Sandbox, timeout int64, shorten bool) error {
	want := time.Duration(max(timeout, 0)) * time.Second
	if !shorten && !time.Now().Add(want).After(sb.ExpiresAt) {
		return nil
	}
	_, err := s.svc.ExpireIn(r.Context(), sb.ID, want)
	return err
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if err := decodeBody(r, &body); err != nil {
		writeAPIError(w, err)
		return
	}
	if body.Timeout == nil {
		writeAPIError(w, errcode.New(errcode.InvalidArgument, "timeout (seconds) is required"))
		return
	}
	sb, err := s.live(r, r.PathValue("id"))
	if err == nil {
		err = s.applyTimeout(r, sb, *body.Timeout, true)
	}
	if err != nil {
		writeAPIError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sb, err := s.live(r, id)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if sb.State == sandbox.StateSleeping {
		writeAPIError(w, errcode.New(errcode.Conflict, "sandbox %q is already paused", id))
		return
	}
	s.procs.dropSandbox(id)
	s.code.drop(id)
	if _, err := s.svc.Sleep(r.Context(), id); err != nil {
		writeAPIError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resumeSandbox is E2B's v1 resume: 201 with the sandbox; 409 when it is not paused.
func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var body timeoutBody
	if err := decodeBody(r, &body); err != nil {
		writeAPIError(w, err)
		return
	}
	sb, err := s.live(r, id)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if sb.State != sandbox.StateSleeping {
		writeAPIError(w, errcode.New(errcode.Conflict, "sandbox %q is not paused", id))
		return
	}
	if sb, err = s.svc.Wake(r.Context(), id); err == nil && body.Timeout != nil {
		err = s.applyTimeout(r, sb, *body.Timeout, false)
	}
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.reply(r, sb))
}

// connectSandbox is E2B's connect: a running sandbox answers 200 (its timeout set when one is
// given), a paused one is woken and answers 201.
func (s *Server) connectSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var body timeoutBody
	if err := decodeBody(r, &body); err != nil {
		writeAPIError(w, err)
		return
	}
	sb, err := s.live(r, id)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	status := http.StatusOK
	if sb.State == sandbox.StateSleeping {
		if sb, err = s.svc.Wake(r.Context(), id); err != nil {
			writeAPIError(w, err)
			return
		}
		status = http.StatusCreated
	}
	if body.Timeout != nil {
		if err := s.applyTimeout(r, sb, *body.Timeout, false); err != nil {
			writeAPIError(w, err)
			return
		}
	}
	writeJSON(w, status, s.reply(r, sb))
}

// sandboxMetric is E2B's SandboxMetric: one sample.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// sandboxMetrics is E2B's getMetrics: agentbox keeps no series, so the answer is one sample
// taken now (CPU use since the previous sample by any caller; 0 on the first), whatever the
// start and end asked.
func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if s.opts.Metrics == nil {
		s.unsupportedAPI(w, r)
		return
	}
	sb, err := s.live(r, id)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if sb.State != sandbox.StateRunning {
		writeJSON(w, http.StatusOK, []sandboxMetric{}) // a paused sandbox has no samples, as E2B's
		return
	}
	m, err := s.opts.Metrics.Metrics(r.Context(), id)
	if err != nil {
		writeAPIError(w, notFound(id, err))
		return
	}
	d := s.detail(sb)
	out := sandboxMetric{Timestamp: m.SampledAt.UTC(), TimestampUnix: m.SampledAt.Unix(), CPUCount: d.CPUCount}
	if m.CPUPercent != nil {
		out.CPUUsedPct = *m.CPUPercent
	}
	if m.Memory != nil {
		out.MemUsed, out.MemTotal, out.MemCache = m.Memory.UsedBytes, m.Memory.LimitBytes, m.Memory.CacheBytes
	}
	if out.MemTotal == 0 {
		out.MemTotal = sb.MemoryMB << 20
	}
	if m.Disk != nil {
		out.DiskUsed, out.DiskTotal = m.Disk.UsedBytes, m.Disk.TotalBytes
	}
	if out.DiskTotal == 0 {
		out.DiskTotal = sb.DiskMB << 20
	}
	writeJSON(w, http.StatusOK, []sandboxMetric{out})
}

// unsupportedAPI answers the sandbox routes of E2B's API that agentbox does not map (metrics,
// network, snapshots, fork, refreshes): 501 naming the agentbox call that does it.
func (s *Server) unsupportedAPI(w http.ResponseWriter, r *http.Request) {
	writeAPIError(w, errcode.New(errcode.UnsupportedOp, "%s %s is not part of agentbox's E2B API (docs/E2B.md lists what is); use agentbox's own API for it (docs/API.md)", r.Method, r.URL.Path))
}
