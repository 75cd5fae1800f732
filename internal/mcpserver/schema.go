package mcpserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Schemas are derived from the Go types of each tool's input and output (the `jsonschema` tag is
// a field's description), then normalised: Go's nil slices and pointers make the SDK's inference
// emit nullable types, which the contract does not have. Arguments are checked here, not by the
// SDK, so that a malformed call gets an INVALID_ARGUMENT result naming the field and what it
// must be.

// schemaFor infers the schema of T and normalises it.
func schemaFor[T any]() *jsonschema.Schema {
	s, err := jsonschema.For[T](&jsonschema.ForOptions{})
	if err != nil {
		panic(fmt.Sprintf("mcpserver: schema for %T: %v", *new(T), err)) // a programming error, caught by every test
	}
	normalize(s)
	return s
}

// normalize drops "null" from type unions, recursively.
func normalize(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if len(s.Types) > 0 {
		ts := slices.DeleteFunc(slices.Clone(s.Types), func(t string) bool { return t == "null" })
		if len(ts) == 1 {
			s.Type, s.Types = ts[0], nil
		} else {
			s.Types = ts
		}
	}
	for _, p := range s.Properties {
		normalize(p)
	}
	normalize(s.Items)
	normalize(s.AdditionalProperties)
}

// errorSchema is the shape of every tool error's structured content.
func errorSchema() *jsonschema.Schema {
	codes := make([]any, len(errcode.Codes))
	for i, c := range errcode.Codes {
		codes[i] = string(c)
	}
	return &jsonschema.Schema{
		Type:        "object",
		Description: "Present instead of the result when the call failed: what went wrong and what to change.",
		Properties: map[string]*jsonschema.Schema{
			"code":    {Type: "string", Enum: codes, Description: "Error code; see the tool's description for which codes mean wait and which mean stop."},
			"message": {Type: "string", Description: "What went wrong and what to change."},
			"details": {Type: "object", Description: "Machine-readable facts, e.g. size for FILE_TOO_LARGE."},
		},
		Required:      []string{"code", "message"},
		PropertyOrder: []string{"code", "message", "details"},
	}
}

// outputSchema is Out's schema, widened so that an error reply ({"error": {...}}) also conforms:
// clients validate structured content against the output schema even on errors.
func outputSchema[Out any]() *jsonschema.Schema {
	s := schemaFor[Out]()
	if s.Properties == nil {
		s.Properties = map[string]*jsonschema.Schema{}
	}
	s.Properties["error"] = errorSchema()
	if len(s.Required) > 0 {
		s.AnyOf = []*jsonschema.Schema{{Required: s.Required}, {Required: []string{"error"}}}
		s.Required = nil
	}
	return s
}

// decodeArgs checks raw arguments against the tool's input schema and decodes them into in. Its
// errors are INVALID_ARGUMENT with a message naming the field and what it must be.
func decodeArgs(tool string, s *jsonschema.Schema, raw json.RawMessage, in any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		raw = []byte("{}")
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return errcode.New(errcode.InvalidArgument, "%s: arguments are not valid JSON: %v", tool, err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return errcode.New(errcode.InvalidArgument, "%s: arguments must be a JSON object of named arguments, not %s", tool, kindOf(v))
	}
	// An explicit null for an optional argument means "not given".
	for k, val := range obj {
		if val == nil && !slices.Contains(s.Required, k) {
			delete(obj, k)
		}
	}
	if err := checkObject(tool, "", s, obj); err != nil {
		return err
	}
	clean, _ := json.Marshal(obj)
	if err := json.Unmarshal(clean, in); err != nil {
		return errcode.New(errcode.InvalidArgument, "%s: %v", tool, err)
	}
	return nil
}

func checkObject(tool, path string, s *jsonschema.Schema, obj map[string]any) error {
	if ap := s.AdditionalProperties; ap == nil || ap.Not != nil { // a struct: only its properties
		var unknown []string
		for k := range obj {
			if _, ok := s.Properties[k]; !ok {
				unknown = append(unknown, k)
			}
		}
		if len(unknown) > 0 {
			slices.Sort(unknown)
			if len(s.Properties) == 0 {
				return errcode.New(errcode.InvalidArgument, "%s: unknown argument %q; %s takes no arguments", tool, join(path, unknown[0]), orWhole(tool, path))
			}
			return errcode.New(errcode.InvalidArgument, "%s: unknown argument %q; %s takes %s", tool, join(path, unknown[0]), orWhole(tool, path), listNames(s))
		}
	}
	for _, k := range s.Required {
		if _, ok := obj[k]; !ok {
			return errcode.New(errcode.InvalidArgument, "%s: missing required argument %q: it must be %s%s", tool, join(path, k), describe(s.Properties[k]), about(s.Properties[k]))
		}
	}
	for _, k := range sortedKeys(obj) {
		sub := s.Properties[k]
		if sub == nil {
			sub = s.AdditionalProperties
		}
		if sub == nil {
			continue
		}
		if err := checkValue(tool, join(path, k), sub, obj[k]); err != nil {
			return err
		}
	}
	return nil
}

func checkValue(tool, path string, s *jsonschema.Schema, v any) error {
	bad := func() error {
		return errcode.New(errcode.InvalidArgument, "%s: argument %q must be %s, not %s%s", tool, path, describe(s), kindOf(v), about(s))
	}
	switch s.Type {
	case "string":
		if _, ok := v.(string); !ok {
			return bad()
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return bad()
		}
	case "number", "integer":
		n, ok := v.(json.Number)
		if !ok {
			return bad()
		}
		f, err := n.Float64()
		if err != nil || math.IsInf(f, 0) {
			return bad()
		}
		if s.Type == "integer" {
			if _, err := n.Int64(); err != nil {
				return bad()
			}
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return bad()
		}
		if s.MinItems != nil && len(a) < *s.MinItems {
			return errcode.New(errcode.InvalidArgument, "%s: argument %q must not be empty: give %s with at least %d element(s)%s", tool, path, describe(s), *s.MinItems, about(s))
		}
		for i, e := range a {
			if s.Items != nil {
				if err := checkValue(tool, fmt.Sprintf("%s[%d]", path, i), s.Items, e); err != nil {
					return err
				}
			}
		}
	case "object":
		o, ok := v.(map[string]any)
		if !ok {
			return bad()
		}
		if err := checkObject(tool, path, s, o); err != nil {
			return err
		}
	}
	if len(s.Enum) > 0 && !slices.Contains(s.Enum, v) {
		return errcode.New(errcode.InvalidArgument, "%s: argument %q must be one of %s; got %v", tool, path, enumList(s.Enum), v)
	}
	return nil
}

// describe says what a value of schema s must be, e.g. `an array of strings (the argv ...)`.
func describe(s *jsonschema.Schema) string {
	if s == nil {
		return "a JSON value"
	}
	var what string
	switch s.Type {
	case "string":
		what = "a string"
	case "boolean":
		what = "true or false"
	case "integer":
		what = "an integer"
	case "number":
		what = "a number"
	case "array":
		what = "an array"
		if s.Items != nil {
			what += " of " + plural(describe(&jsonschema.Schema{Type: s.Items.Type}))
		}
	case "object":
		what = "an object"
		if s.AdditionalProperties != nil && s.AdditionalProperties.Type != "" {
			what += " of " + plural(describe(&jsonschema.Schema{Type: s.AdditionalProperties.Type})) + " by name"
		} else if len(s.Properties) > 0 {
			what += " with " + listNames(s)
		}
	default:
		what = "a JSON value"
	}
	if len(s.Enum) > 0 {
		what += " (one of " + enumList(s.Enum) + ")"
	}
	return what
}

// about is the field's description, appended to messages about it.
func about(s *jsonschema.Schema) string {
	if s == nil || s.Description == "" {
		return ""
	}
	return " — " + s.Description
}

func plural(a string) string {
	switch a {
	case "a string":
		return "strings"
	case "an integer":
		return "integers"
	case "a number":
		return "numbers"
	case "true or false":
		return "booleans"
	case "an object":
		return "objects"
	}
	return "values"
}

func kindOf(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("a string (%q)", truncate(x, 40))
	case bool:
		return fmt.Sprintf("%v", x)
	case json.Number:
		if strings.ContainsAny(x.String(), ".eE") {
			return "a number with a fraction (" + x.String() + ")"
		}
		return "a number (" + x.String() + ")"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func listNames(s *jsonschema.Schema) string {
	names := s.PropertyOrder
	if len(names) == 0 {
		names = sortedKeys(s.Properties)
	}
	var parts []string
	for _, n := range names {
		if slices.Contains(s.Required, n) {
			parts = append(parts, n+" (required)")
		} else {
			parts = append(parts, n)
		}
	}
	return strings.Join(parts, ", ")
}

func enumList(e []any) string {
	var parts []string
	for _, v := range e {
		parts = append(parts, fmt.Sprintf("%q", fmt.Sprint(v)))
	}
	return strings.Join(parts, ", ")
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func orWhole(tool, path string) string {
	if path == "" {
		return tool
	}
	return path
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
