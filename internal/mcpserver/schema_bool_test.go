package mcpserver_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/agentbox/agentbox/internal/mcpserver"
)

// TestNoBooleanSubschemas: no property or item of a published tool schema is a bare boolean
// schema (`true`): JSON Schema allows it, but clients that type-check tools/list (the MCP
// Inspector, the conformance suite's tools-list) refuse a property that is not an object.
func TestNoBooleanSubschemas(t *testing.T) {
	t.Parallel()
	srv := mcpserver.New(nil, mcpserver.Options{})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[len(protocolVersions)-1])
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case bool:
			t.Errorf("%s is the boolean schema %v: give it an object schema (a description at least)", path, x)
		case map[string]any:
			for _, k := range []string{"properties", "$defs", "definitions"} {
				if m, ok := x[k].(map[string]any); ok {
					for name, sub := range m {
						walk(fmt.Sprintf("%s.%s.%s", path, k, name), sub)
					}
				}
			}
			for _, k := range []string{"items", "additionalProperties"} {
				if sub, ok := x[k]; ok {
					if _, isBool := sub.(bool); isBool && k == "additionalProperties" {
						continue // additionalProperties: false/true is the usual form
					}
					walk(path+"."+k, sub)
				}
			}
			for _, k := range []string{"anyOf", "oneOf", "allOf"} {
				if l, ok := x[k].([]any); ok {
					for i, sub := range l {
						walk(fmt.Sprintf("%s.%s[%d]", path, k, i), sub)
					}
				}
			}
		}
	}
	for name, tl := range c.tools {
		for kind, s := range map[string]any{"inputSchema": tl.InputSchema, "outputSchema": tl.OutputSchema} {
			if s == nil {
				continue
			}
			b, _ := json.Marshal(s)
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatal(err)
			}
			walk(name+"."+kind, v)
		}
	}
}
