package api

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

// Preview URLs: a request whose Host is {port}-{sandbox_id}.localhost[:serverport]
// goes to the port a sandbox exposed (sandbox_expose), never to the /v1 routes. The bytes go
// through the sandbox's agent (PreviewBackend.DialPort); the sandbox gets no route in.
//
// Access: the server's bearer token (Authorization header), or the exposure's access token —
// given once as ?agentbox_token=… (answered with a redirect to the same URL without it and a
// host-only, HttpOnly, SameSite=Strict cookie), then sent as that cookie — or none when the
// exposure is public.
//
// Isolation: every preview host is its own origin, and a sandbox's app is an untrusted one.
// No agentbox credential is forwarded to it (the Authorization header when it carries the
// server's token or an API key, X-Api-Key, the access token in the query, every cookie named
// agentbox_…). Its responses cannot reach beyond its own host: a Set-Cookie loses any Domain
// attribute (Domain=localhost would set the cookie for the API and every other preview) and
// one naming an agentbox cookie is dropped, as is a Clear-Site-Data that would clear cookies
// (browsers clear them for the whole site, every preview's and the API's included).

// PreviewBackend is what preview URLs need from the control plane (*sandbox.Service).
type PreviewBackend interface {
	// AuthorizePreview: nil, SANDBOX_NOT_FOUND (not exposed) or AUTH_FAILED.
	AuthorizePreview(ctx context.Context, id string, port int, accessToken string, bearer bool) error
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

const (
	// PreviewTokenParam is the query parameter that carries an exposure's access token once.
	PreviewTokenParam = "agentbox_token"
	// PreviewCookie is the cookie that carries it afterwards.
	PreviewCookie = "agentbox_preview"
	// reservedCookiePrefix names agentbox's cookies: a preview never forwards them to the
	// sandbox nor lets the sandbox set them.
	reservedCookiePrefix = "agentbox_"
	// maxPreviewResponseHeader bounds an upstream's response header, like the server's own.
	maxPreviewResponseHeader = 64 << 10
)

// PreviewHost parses a preview URL's Host ("3000-sb-0123456789ab.localhost", with or without
// ":port"). match is true when hostport has the preview shape ({digits}-{…}.localhost); ok is true when it also names a valid sandbox id and a port 1–65535.
func PreviewHost(hostport string) (id string, port int, match, ok bool) {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	label, found := strings.CutSuffix(host, ".localhost")
	if !found || label == "" || strings.Contains(label, ".") {
		return "", 0, false, false
	}
	ps, id, found := strings.Cut(label, "-")
	if !found || ps == "" || strings.Trim(ps, "+0123456789") != "" {
		return "", 0, false, false
	}
	n, err := strconv.Atoi(ps)
	if err != nil || strconv.Itoa(n) != ps || n < 1 || n > 65535 || !sandboxid.Valid(id) {
		return "", 0, true, false
	}
	return id, n, true, true
}

// PreviewURL is the preview URL of a sandbox's port on a server listening at serverPort.
func PreviewURL(id string, port, serverPort int) string {
	return fmt.Sprintf("http://%d-%s.localhost:%d/", port, id, serverPort)
}

type previewTarget struct {
	id   string
	port int
}

type previewKey struct{}

// newPreviewProxy is the reverse proxy of every preview URL: it dials the target the request's
// context carries through b (a fresh connection per request: no pooled connection outlives an
// unexpose), passes WebSocket upgrades, streams both bodies and sets X-Forwarded-*.
func (s *Server) newPreviewProxy(b PreviewBackend) *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			t := ctx.Value(previewKey{}).(previewTarget)
			return b.DialPort(ctx, t.id, t.port)
		},
		DisableKeepAlives:      true,
		DisableCompression:     true,
		MaxResponseHeaderBytes: maxPreviewResponseHeader,
		ResponseHeaderTimeout:  5 * time.Minute,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(previewKey{}).(previewTarget)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(t.port))
			pr.Out.Host = pr.In.Host // the app sees the name it was asked by
			pr.SetXForwarded()
		},
		ModifyResponse: func(resp *http.Response) error {
			confineResponse(resp.Header)
			return nil
		},
		Transport:     tr,
		FlushInterval: -1, // stream (server-sent events, long downloads)
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := r.Context().Value(previewKey{}).(previewTarget)
			if r.Context().Err() != nil {
				return // the client went away
			}
			var msg string
			status := http.StatusBadGateway
			switch errcode.Of(err) {
			case errcode.SandboxNotFound:
				status, msg = http.StatusNotFound, fmt.Sprintf("agentbox preview: sandbox %s does not exist", t.id)
			case errcode.SandboxNotRunning:
				status, msg = http.StatusServiceUnavailable, fmt.Sprintf("agentbox preview: sandbox %s is not running", t.id)
			default:
				msg = fmt.Sprintf("agentbox preview: nothing listens on port %d in %s; start your server on 127.0.0.1:%d (%s)", t.port, t.id, t.port, errcode.Message(err))
			}
			if errcode.Of(err) == errcode.Internal {
				s.log.Debug("preview upstream failed", "sandbox", t.id, "port", t.port, "err", err)
			}
			previewError(w, status, msg)
		},
	}
}

func previewError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintln(w, msg)
}

// preview serves a request addressed to a preview URL.
func (s *Server) preview(w http.ResponseWriter, r *http.Request, id string, port int) {
	b := s.previewBackend()
	if b == nil {
		previewError(w, http.StatusNotFound, "agentbox preview: this server serves no preview URLs")
		return
	}
	// Take agentbox's credentials off the request: the sandbox sees none of them.
	bearer := s.opts.Token != "" && s.authorized(r)
	stripCredentials(r, s.opts.Token)
	q := r.URL.Query()
	fromQuery, inQuery := q.Get(PreviewTokenParam), q.Has(PreviewTokenParam)
	if inQuery {
		q.Del(PreviewTokenParam)
		r.URL.RawQuery = q.Encode()
	}
	fromCookie := stripCookies(r, PreviewCookie)
	tok := fromCookie
	if inQuery {
		tok = fromQuery
	}
	if s.opts.Token == "" {
		bearer = true // --insecure-no-auth: no credential is asked anywhere
	}
	if err := b.AuthorizePreview(r.Context(), id, port, tok, bearer); err != nil {
		switch errcode.Of(err) {
		case errcode.SandboxNotFound:
			previewError(w, http.StatusNotFound, fmt.Sprintf("agentbox preview: port %d of %s is not exposed (sandbox_expose makes it a preview URL)", port, id))
		case errcode.AuthFailed:
			previewError(w, http.StatusUnauthorized, fmt.Sprintf("agentbox preview: port %d of %s is private: open the URL with ?%s=<access_token> from sandbox_expose's reply, or send the server's bearer token", port, id, PreviewTokenParam))
		default:
			if errcode.Of(err) == errcode.Internal {
				s.log.Error("preview authorization failed", "sandbox", id, "port", port, "err", err)
			}
			previewError(w, errcode.HTTPStatus(errcode.Of(err)), "agentbox preview: "+errcode.Message(err))
		}
		return
	}
	if inQuery && fromQuery != "" && (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Upgrade") == "" {
		// Trade the token in the URL for a cookie of this host only, and drop it from the
		// address bar (and from any later Referer). A WebSocket handshake cannot follow a
		// redirect, so it is served with the query's token (taken off the URL above).
		http.SetCookie(w, &http.Cookie{Name: PreviewCookie, Value: fromQuery, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		loc := (&url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}).RequestURI()
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, loc, http.StatusFound)
		return
	}
	ctx := context.WithValue(r.Context(), previewKey{}, previewTarget{id: id, port: port})
	s.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// previewBackend is Options.Preview, else the service's network feature (nil: neither).
func (s *Server) previewBackend() PreviewBackend {
	if s.opts.Preview != nil {
		return s.opts.Preview
	}
	if s.svc != nil {
		return s.opts.Network
	}
	return nil
}

// stripCredentials takes every agentbox credential off a request bound for a sandbox: the
// Authorization header when it is the server's token or an API key (an app's own
// Authorization stays), X-Api-Key, and every cookie named agentbox_… (the preview cookie is
// read by the caller first). The query's access token is the caller's: it needs its value.
func stripCredentials(r *http.Request, token string) {
	if cred, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		cred = strings.TrimSpace(cred)
		if auth.IsKey(cred) || (token != "" && constantEq(cred, token)) {
			r.Header.Del("Authorization")
		}
	}
	r.Header.Del(APIKeyHeader)
}

// stripCookies removes every agentbox cookie (named agentbox_…) from r's Cookie headers,
// keeping the others as they were written, and returns the value of the last one called name.
func stripCookies(r *http.Request, name string) string {
	hs := r.Header.Values("Cookie")
	if len(hs) == 0 {
		return ""
	}
	var val string
	var kept []string
	for _, h := range hs {
		for _, part := range strings.Split(h, ";") {
			k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
			k = strings.TrimSpace(k)
			if k == name {
				val = strings.Trim(strings.TrimSpace(v), `"`)
			}
			if reservedCookie(k) {
				continue
			}
			if strings.TrimSpace(part) != "" {
				kept = append(kept, strings.TrimSpace(part))
			}
		}
	}
	r.Header.Del("Cookie")
	if len(kept) > 0 {
		r.Header.Set("Cookie", strings.Join(kept, "; "))
	}
	return val
}

// reservedCookie reports whether a cookie name is agentbox's (any case: a browser keeps
// Agentbox_preview apart from agentbox_preview, but neither is the sandbox's to use).
func reservedCookie(name string) bool {
	return len(name) >= len(reservedCookiePrefix) && strings.EqualFold(name[:len(reservedCookiePrefix)], reservedCookiePrefix)
}

// confineResponse keeps a sandbox's response to its own preview host: each Set-Cookie loses
// its Domain attributes (a host-only cookie reaches this preview host and no other; a Domain
// of localhost would reach the API and every preview), one naming an agentbox cookie or that
// a browser could read differently is dropped, and a Clear-Site-Data that clears cookies
// (which browsers do for the whole site) is dropped.
func confineResponse(h http.Header) {
	if scs := h.Values("Set-Cookie"); len(scs) > 0 {
		h.Del("Set-Cookie")
		for _, sc := range scs {
			if kept, ok := hostOnlyCookie(sc); ok {
				h.Add("Set-Cookie", kept)
			}
		}
	}
	if csd := strings.ToLower(strings.Join(h.Values("Clear-Site-Data"), ",")); strings.Contains(csd, `"cookies"`) || strings.Contains(csd, `"*"`) {
		h.Del("Clear-Site-Data")
	}
}

// hostOnlyCookie is a Set-Cookie value without its Domain attributes, split as browsers split
// it (RFC 6265 §5.2: the name=value pair up to the first ';', then ';'-separated attributes
// whose names are compared case-insensitively); ok is false when it must be dropped: an agentbox
// cookie, or one Go cannot parse (a browser might read it otherwise than this check does).
func hostOnlyCookie(sc string) (string, bool) {
	c, err := http.ParseSetCookie(sc)
	if err != nil || reservedCookie(c.Name) {
		return "", false
	}
	parts := strings.Split(sc, ";")
	if n, _, _ := strings.Cut(parts[0], "="); reservedCookie(strings.TrimSpace(n)) {
		return "", false
	}
	kept := parts[:1]
	for _, a := range parts[1:] {
		k, _, _ := strings.Cut(a, "=")
		if strings.EqualFold(strings.TrimSpace(k), "domain") {
			continue
		}
		kept = append(kept, a)
	}
	return strings.Join(kept, ";"), true
}
