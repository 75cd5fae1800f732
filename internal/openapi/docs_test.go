package openapi_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/openapi"
)

// docRoute finds a REST route the docs name: a method, then a path under /v1/ up to a space,
// backtick, quote, closing bracket or query string.
var docRoute = regexp.MustCompile("\\b(GET|POST|PUT|PATCH|DELETE) (/v1/[^\\s`'\")\\[\\]?,;|]*)")

// TestDocumentedRoutesExist reads every REST route README.md and docs/TOOLS.md (the documents of
// the public contract) name and checks it is a route of the API's document (which internal/api's
// tests hold to the server's routes), so a reshaped API or a rewritten doc cannot leave a
// documented route behind. (docs/architecture also names the in-sandbox agent's own /v1 routes,
// which are not the REST API.) A documented path may
// write a parameter as {name}, NAME or a literal value; trailing "…" or "/…" means "and below".
func TestDocumentedRoutesExist(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	files := []string{filepath.Join(root, "README.md"), filepath.Join(root, "docs", "TOOLS.md")}
	routes := openapi.Routes()
	seen := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docRoute.FindAllStringSubmatch(string(b), -1) {
			method, path := m[1], strings.TrimRight(m[2], ".:")
			if strings.HasSuffix(path, "…") || strings.Contains(path, "*") {
				continue // a family of routes, not one
			}
			seen++
			if !documented(routes, method, path) {
				t.Errorf("%s names %s %s, which is not a route of internal/openapi/openapi.json", f, method, path)
			}
		}
	}
	if seen < 20 {
		t.Fatalf("found only %d documented routes: the pattern no longer reads the docs", seen)
	}
}

// documented reports whether method and path (as a doc writes them) fit one of routes.
func documented(routes []openapi.Route, method, path string) bool {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for _, r := range routes {
		if r.Method != method {
			continue
		}
		tmpl := strings.Split(strings.Trim(r.Path, "/"), "/")
		if len(tmpl) != len(segs) {
			continue
		}
		ok := true
		for i, t := range tmpl {
			param := strings.HasPrefix(t, "{")
			s := segs[i]
			docParam := strings.HasPrefix(s, "{") || (s == strings.ToUpper(s) && strings.ToLower(s) != s)
			switch {
			case param: // any value, or any placeholder, fills a parameter
			case docParam:
				ok = false
			case t != s:
				ok = false
			}
			if !ok {
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}
