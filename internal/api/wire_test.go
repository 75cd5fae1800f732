package api

import (
	"reflect"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// storeRows are the records the store keeps. None may be (or be inside) a reply: a reply is a
// wire type built from them by a conversion in this package, so that what a record holds (a
// runtime handle, the environment's values, the secrets) is published only when a conversion
// says so.
var storeRows = []reflect.Type{
	reflect.TypeFor[sandbox.Sandbox](),
}

// reaches returns the path from t to the first type in bad that t is or holds (through fields,
// elements, keys and pointers), or "".
func reaches(t reflect.Type, bad []reflect.Type, seen map[reflect.Type]bool) string {
	if seen[t] {
		return ""
	}
	seen[t] = true
	for _, b := range bad {
		if t == b {
			return t.String()
		}
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return reaches(t.Elem(), bad, seen)
	case reflect.Map:
		if p := reaches(t.Key(), bad, seen); p != "" {
			return p
		}
		return reaches(t.Elem(), bad, seen)
	case reflect.Struct:
		for f := range t.Fields() {
			if p := reaches(f.Type, bad, seen); p != "" {
				return t.String() + "." + f.Name + " → " + p
			}
		}
	}
	return ""
}

// TestNoStoreRowIsAReply: no route's reply (nor its NDJSON line) is or holds a store row.
func TestNoStoreRowIsAReply(t *testing.T) {
	for _, o := range ops() {
		for _, v := range []any{o.resp, o.ndjson} {
			if v == nil {
				continue
			}
			if p := reaches(reflect.TypeOf(v), storeRows, map[reflect.Type]bool{}); p != "" {
				t.Errorf("%s replies with a store row: %s", o.pattern, p)
			}
		}
	}
}

// TestNoStoreRowRuleCatches: the walk finds a store row however deep a reply holds it.
func TestNoStoreRowRuleCatches(t *testing.T) {
	type SandboxList struct{ Sandboxes []sandbox.Sandbox }
	type nested struct{ Page map[string]*SandboxList }
	for _, v := range []any{sandbox.Sandbox{}, SandboxList{}, nested{}} {
		if p := reaches(reflect.TypeOf(v), storeRows, map[reflect.Type]bool{}); !strings.Contains(p, "sandbox.Sandbox") {
			t.Errorf("%T: the walk did not find the store row (%q)", v, p)
		}
	}
	if p := reaches(reflect.TypeFor[wire.SandboxList](), storeRows, map[reflect.Type]bool{}); p != "" {
		t.Errorf("wire.SandboxList holds a store row: %s", p)
	}
}
