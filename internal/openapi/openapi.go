// Package openapi holds agentbox's REST API contract: the OpenAPI 3.1 document (openapi.json,
// generated from internal/api's Go types by `go generate ./internal/api` and checked against
// the server's routes and real replies by internal/api's tests), served at GET
// /v1/openapi.json, and the route matcher with which the MCP api_call tool checks a request
// against the document, segment by segment, before anything is sent.
package openapi

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/text"
)

//go:embed openapi.json
var doc []byte

// Document returns the OpenAPI document (JSON). Callers must not modify it.
func Document() []byte { return doc }

// Route is one operation of the document: a method and a path template as the document writes
// it ("/v1/sandboxes/{id}").
type Route struct {
	Method string `json:"method"`
	Path   string `json:"path"`
}

func (r Route) String() string { return r.Method + " " + r.Path }

// methods are the operation keys of an OpenAPI path item.
var methods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// Parse returns the routes of an OpenAPI document, sorted by path then method.
func Parse(document []byte) ([]Route, error) {
	var d struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(document, &d); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	var out []Route
	for p, item := range d.Paths {
		for m := range item {
			if slices.Contains(methods, m) {
				out = append(out, Route{Method: strings.ToUpper(m), Path: p})
			}
		}
	}
	slices.SortFunc(out, func(a, b Route) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Method, b.Method)
	})
	return out, nil
}

var routes = sync.OnceValue(func() []Route {
	r, err := Parse(doc)
	if err != nil {
		panic(err) // the embedded document is checked by every test of internal/api
	}
	return r
})

// Routes returns the routes of the document.
func Routes() []Route { return slices.Clone(routes()) }

// Match checks a request's method and path against the document, segment by segment: a
// literal segment matches itself, a "{param}" segment one non-empty segment. The path is
// refused (INVALID_ARGUMENT, before anything is sent) when it is not absolute, carries a query
// or fragment, has an empty, "." or ".." segment (also percent-encoded), an encoded "/" or
// "\", or a control character; a path or method outside the document is refused with the list
// of allowed routes (details "allowed"). It returns the route matched, preferring literal
// segments to parameters.
func Match(method, path string) (Route, error) {
	return match(routes(), method, path)
}

func match(rs []Route, method, path string) (Route, error) {
	method = strings.ToUpper(strings.TrimSpace(method))
	if err := checkPath(path); err != nil {
		return Route{}, err
	}
	segs := strings.Split(path[1:], "/")
	var best *Route
	bestScore := -1
	var pathMethods []string
	for i, r := range rs {
		score, ok := matchSegments(strings.Split(r.Path[1:], "/"), segs)
		if !ok {
			continue
		}
		if r.Method != method {
			pathMethods = append(pathMethods, r.Method)
			continue
		}
		if score > bestScore {
			best, bestScore = &rs[i], score
		}
	}
	if best != nil {
		return *best, nil
	}
	allowed := make([]string, len(rs))
	for i, r := range rs {
		allowed[i] = r.String()
	}
	if len(pathMethods) > 0 {
		slices.Sort(pathMethods)
		pathMethods = slices.Compact(pathMethods)
		return Route{}, errcode.New(errcode.InvalidArgument, "method %q is not allowed on path %q: it takes %s; the allowed routes are: %s",
			method, path, strings.Join(pathMethods, ", "), strings.Join(allowed, "; ")).With("allowed", allowed)
	}
	return Route{}, errcode.New(errcode.InvalidArgument, "%s %s is not a route of agentbox's REST API (GET /v1/openapi.json); the allowed routes are: %s",
		method, path, strings.Join(allowed, "; ")).With("allowed", allowed)
}

// matchSegments reports whether segs fit the template tmpl, and how many literal segments
// matched (the more specific route wins).
func matchSegments(tmpl, segs []string) (int, bool) {
	if len(tmpl) != len(segs) {
		return 0, false
	}
	n := 0
	for i, t := range tmpl {
		if strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}") {
			continue // checkPath made sure the segment is not empty
		}
		if t != segs[i] {
			return 0, false
		}
		n++
	}
	return n, true
}

// checkPath refuses a path that is not a plain absolute path of non-empty segments.
func checkPath(path string) error {
	bad := func(why string) error {
		return errcode.New(errcode.InvalidArgument, "path %q %s; give an absolute path of the REST API such as /v1/sandboxes/sb-0123456789ab (the query goes in query)", text.Truncate(path, 200), why).With("argument", "path")
	}
	if !strings.HasPrefix(path, "/") {
		return bad("must start with /")
	}
	if len(path) > 4096 {
		return bad("is longer than 4096 bytes")
	}
	for _, c := range path {
		if c < 0x20 || c == 0x7f {
			return bad("contains a control character")
		}
	}
	if strings.ContainsAny(path, "?#\\") {
		return bad(`must not contain "?", "#" or "\"`)
	}
	lower := strings.ToLower(path)
	if strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") || strings.Contains(lower, "%00") {
		return bad("must not contain an encoded /, \\ or NUL")
	}
	for _, seg := range strings.Split(path[1:], "/") {
		if seg == "" {
			return bad("has an empty segment (// or a trailing /)")
		}
		dec, err := url.PathUnescape(seg)
		if err != nil {
			return bad("has a malformed percent-encoding")
		}
		if dec == "." || dec == ".." {
			return bad(`has a "." or ".." segment`)
		}
	}
	return nil
}
