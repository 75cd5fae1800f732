// Package sameorigin decides whether a browser's request comes from a page of the server's own
// origin: the scheme, host and port the request was addressed to. A browser sends an Origin
// header on cross-origin requests, WebSocket handshakes and unsafe methods; a page served by
// another origin (another port of localhost, https where the server is plain HTTP, another
// host) must not drive the server with the user's credentials.
package sameorigin

import (
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Of is the origin r was addressed to ("http://127.0.0.1:8080"): https when it came over TLS,
// its Host header's name and port (the scheme's default port when the Host names none).
func Of(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	host, port := splitHostPort(r.Host, scheme)
	return scheme + "://" + net.JoinHostPort(host, port)
}

// Same reports whether origin (an Origin header's value) is the origin r was addressed to:
// the same scheme, host (case-insensitive) and port, a scheme's default port counting as given.
// "null" (an opaque origin: a sandboxed frame, a file: page) and anything unparsable are not.
func Same(r *http.Request, origin string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || u.Path != "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return false
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return false
	}
	oh, op := splitHostPort(u.Host, scheme)
	return Of(r) == scheme+"://"+net.JoinHostPort(oh, op)
}

// splitHostPort splits hostport into its lower-case host (brackets and a trailing dot off) and
// its port, the scheme's default when it names none.
func splitHostPort(hostport, scheme string) (host, port string) {
	host = hostport
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host, port = h, p
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if port == "" {
		port = "80"
		if scheme == "https" {
			port = "443"
		}
	}
	return host, port
}
