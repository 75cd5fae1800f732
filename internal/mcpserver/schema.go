package mcpserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
)

// Schemas are derived from the Go types of each tool's input and output (the `jsonschema` tag is
// a field's description), then normalised: Go's nil slices and pointers make the SDK's inference
// emit nullable types, which the contract does not have. Arguments are validated here, against
// exactly the published input schema with jsonschema-go's own validator (so the schema and the
// checks cannot drift), rather than by the SDK, so that a malformed call gets an
// INVALID_ARGUMENT result naming the argument and what it must be.

// schemaFor infers the schema of T and normalises it.
func schemaFor[T any]() *jsonschema.Schema {
	s, err := jsonschema.For[T](&jsonschema.ForOptions{TypeSchemas: typeSchemas})
	if err != nil {
		panic(fmt.Sprintf("mcpserver: schema for %T: %v", *new(T), err)) // a programming error, caught by every test
	}
	normalize(s)
	return s
}

// typeSchemas are the schemas of types whose JSON is not what their Go fields would say.
var typeSchemas = map[reflect.Type]*jsonschema.Schema{
	// sandbox.Network marshals as "none" or {"allow": [...], "deny": [...]} (not {"Policy": …}).
	reflect.TypeFor[sandbox.Network](): networkOutSchema(),
}

// networkOutSchema is a sandbox's network as replies write it.
func networkOutSchema() *jsonschema.Schema {
	list := func(d string) *jsonschema.Schema {
		return &jsonschema.Schema{Type: "array", Items: &jsonschema.Schema{Type: "string"}, Description: d}
	}
	return &jsonschema.Schema{
		Description: `The sandbox's network: "none" (no network at all), or its egress policy {"allow": [...], "deny": [...]}.`,
		OneOf: []*jsonschema.Schema{
			{Type: "string", Enum: []any{"none"}},
			{Type: "object", Properties: map[string]*jsonschema.Schema{
				"allow": list("The hosts the sandbox may reach (names, *. wildcards, :port, CIDRs)."),
				"deny":  list("The hosts refused even when allow matches."),
			}, Required: []string{"allow", "deny"}, PropertyOrder: []string{"allow", "deny"}, AdditionalProperties: &jsonschema.Schema{Not: &jsonschema.Schema{}}},
		},
	}
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
		anyValue(p)
		normalize(p)
	}
	anyValue(s.Items)
	normalize(s.Items)
	normalize(s.AdditionalProperties)
}

// anyValue describes an empty schema (a Go `any`), which would be published as the boolean
// schema `true`: clients that type-check tools/list (the MCP Inspector, the conformance suite)
// refuse a property or item that is not an object.
func anyValue(s *jsonschema.Schema) {
	if s != nil && reflect.ValueOf(*s).IsZero() {
		s.Description = "Any JSON value."
	}
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
	var s *jsonschema.Schema
	if _, raw := any(*new(Out)).(interface{ rawOutput() }); raw {
		s = rawOutputSchema(reflect.TypeFor[Out]()) // run records keep their nulls (runs.go)
	} else {
		s = schemaFor[Out]()
	}
	if s.Properties == nil {
		s.Properties = map[string]*jsonschema.Schema{}
	}
	s.Properties["error"] = errorSchema()
	if len(s.Required) > 0 {
		s.AnyOf = []*jsonschema.Schema{{Required: s.Required}, {Required: []string{"error"}}}
		s.Required = nil
	}
	// A reply with another shape (exec with background: job_start's) lists its required fields.
	if alt, ok := any(*new(Out)).(interface{ outputAlternatives() [][]string }); ok {
		for _, req := range alt.outputAlternatives() {
			s.AnyOf = append(s.AnyOf, &jsonschema.Schema{Required: req})
		}
	}
	return s
}

// inputSchema is a tool's published input schema and its resolved form, which checks calls.
type inputSchema struct {
	s  *jsonschema.Schema
	rs *jsonschema.Resolved
}

// resolveInput resolves s for validation; s is what tools/list publishes, so the checks are
// exactly the published schema.
func resolveInput(tool string, s *jsonschema.Schema) inputSchema {
	rs, err := s.Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: input schema of %s: %v", tool, err)) // a programming error, caught by every test
	}
	return inputSchema{s, rs}
}

// decodeArgs validates raw arguments against the tool's input schema with jsonschema-go's
// validator and decodes them into in. Its errors are INVALID_ARGUMENT with a message naming the
// argument and what it must be.
func decodeArgs(tool string, is inputSchema, raw json.RawMessage, in any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		raw = []byte("{}")
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return errcode.New(errcode.InvalidArgument, "%s: arguments are not valid JSON: %v", tool, err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return errcode.New(errcode.InvalidArgument, "%s: arguments must be a JSON object of named arguments, not %s", tool, kindOf(v))
	}
	// An explicit null for an optional argument means "not given".
	for k, val := range obj {
		if val == nil && !slices.Contains(is.s.Required, k) {
			delete(obj, k)
		}
	}
	v = obj
	if err := is.rs.Validate(&v); err != nil {
		return invalid(tool, is.s, obj, err)
	}
	clean, _ := json.Marshal(obj)
	if err := json.Unmarshal(clean, in); err != nil {
		return errcode.New(errcode.InvalidArgument, "%s: %v", tool, err)
	}
	return nil
}

var (
	validatingRE = regexp.MustCompile(`validating (\S+): `)
	quotedRE     = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)
)

// invalid maps the validator's error to INVALID_ARGUMENT naming the argument (with the index or
// key inside arrays and maps) and what it must be. The validator reports the schema path of the
// failing keyword ("validating /properties/command/items: type: ..."); locate turns it into the
// argument's path in the call.
func invalid(tool string, root *jsonschema.Schema, obj map[string]any, verr error) error {
	msg := verr.Error()
	var schemaPath string
	if m := validatingRE.FindAllStringSubmatchIndex(msg, -1); len(m) > 0 {
		last := m[len(m)-1]
		schemaPath, msg = msg[last[2]:last[3]], msg[last[1]:]
	}
	path, s, v := locate(root, obj, schemaPath)
	firstQuoted := func() string {
		if m := quotedRE.FindStringSubmatch(msg); m != nil {
			if u, err := strconv.Unquote(`"` + m[1] + `"`); err == nil {
				return u
			}
			return m[1]
		}
		return ""
	}
	switch {
	case strings.HasPrefix(msg, "required: "):
		k := firstQuoted()
		return errcode.New(errcode.InvalidArgument, "%s: missing required argument %q: it must be %s%s", tool, join(path, k), describe(s.Properties[k]), about(s.Properties[k]))
	case strings.HasPrefix(msg, "unexpected additional properties "):
		k := firstQuoted()
		if len(s.Properties) == 0 {
			return errcode.New(errcode.InvalidArgument, "%s: unknown argument %q; %s takes no arguments", tool, join(path, k), orWhole(tool, path))
		}
		return errcode.New(errcode.InvalidArgument, "%s: unknown argument %q; %s takes %s", tool, join(path, k), orWhole(tool, path), listNames(s))
	case strings.HasPrefix(msg, "type: "):
		return errcode.New(errcode.InvalidArgument, "%s: argument %q must be %s, not %s%s", tool, path, describe(s), kindOf(v), about(s))
	case strings.HasPrefix(msg, "minItems: ") && s.MinItems != nil:
		return errcode.New(errcode.InvalidArgument, "%s: argument %q must not be empty: give %s with at least %d element(s)%s", tool, path, describe(s), *s.MinItems, about(s))
	case strings.HasPrefix(msg, "oneOf: ") || strings.HasPrefix(msg, "anyOf: "):
		// The validator prints the alternatives' schemas; say what they accept instead.
		return errcode.New(errcode.InvalidArgument, "%s: argument %q must be %s; got %s%s", tool, orWhole(tool, path), describe(s), kindOf(v), about(s))
	case strings.HasPrefix(msg, "enum: "):
		return errcode.New(errcode.InvalidArgument, "%s: argument %q must be one of %s; got %s", tool, path, enumList(s.Enum), kindOf(v))
	}
	// Any other keyword (minimum, maxLength, pattern, …): what the value must be, and the
	// validator's own words for what is wrong.
	return errcode.New(errcode.InvalidArgument, "%s: argument %q must be %s; got %s (%s)%s", tool, orWhole(tool, path), describe(s), kindOf(v), msg, about(s))
}

// locate follows a schema path (/properties/a/items/...) through the schema and the arguments,
// returning the argument's path ("a[2]", "env.KEY"), its schema and its value. Under "items" and
// "additionalProperties" it picks the first element (or key, sorted) that the sub-schema
// refuses.
func locate(s *jsonschema.Schema, v any, schemaPath string) (string, *jsonschema.Schema, any) {
	segs := strings.Split(strings.TrimPrefix(schemaPath, "/"), "/")
	path := ""
	for i := 0; i < len(segs) && s != nil; i++ {
		switch segs[i] {
		case "properties":
			if i+1 >= len(segs) {
				return path, s, v
			}
			i++
			name := segs[i]
			o, _ := v.(map[string]any)
			path, s, v = join(path, name), s.Properties[name], o[name]
		case "items":
			a, _ := v.([]any)
			idx := firstRefused(s.Items, len(a), func(j int) any { return a[j] })
			path, s = fmt.Sprintf("%s[%d]", path, idx), s.Items
			if idx < len(a) {
				v = a[idx]
			}
		case "additionalProperties":
			o, _ := v.(map[string]any)
			keys := sortedKeys(o)
			idx := firstRefused(s.AdditionalProperties, len(keys), func(j int) any { return o[keys[j]] })
			if idx < len(keys) {
				path, v = join(path, keys[idx]), o[keys[idx]]
			}
			s = s.AdditionalProperties
		default:
			return path, s, v
		}
	}
	if s == nil {
		s = &jsonschema.Schema{}
	}
	return path, s, v
}

// firstRefused returns the index of the first of n values that s refuses (0 if none is).
func firstRefused(s *jsonschema.Schema, n int, at func(int) any) int {
	if s == nil {
		return 0
	}
	rs, err := s.CloneSchemas().Resolve(nil)
	if err != nil {
		return 0
	}
	for j := 0; j < n; j++ {
		v := at(j)
		if rs.Validate(&v) != nil {
			return j
		}
	}
	return 0
}

// describe says what a value of schema s must be, e.g. `an array of strings (the argv ...)`.
func describe(s *jsonschema.Schema) string {
	if s == nil {
		return "a JSON value"
	}
	if alts := append(slices.Clone(s.OneOf), s.AnyOf...); s.Type == "" && len(alts) > 0 {
		var parts []string
		for _, a := range alts {
			parts = append(parts, describe(a))
		}
		return strings.Join(parts, " or ")
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
	var bounds []string
	if s.Minimum != nil {
		bounds = append(bounds, fmt.Sprintf("at least %g", *s.Minimum))
	}
	if s.Maximum != nil {
		bounds = append(bounds, fmt.Sprintf("at most %g", *s.Maximum))
	}
	if s.MinLength != nil {
		bounds = append(bounds, fmt.Sprintf("at least %d characters", *s.MinLength))
	}
	if s.MaxLength != nil {
		bounds = append(bounds, fmt.Sprintf("at most %d characters", *s.MaxLength))
	}
	if len(bounds) > 0 {
		what += " (" + strings.Join(bounds, ", ") + ")"
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
		return fmt.Sprintf("a string (%q)", text.Truncate(x, 40))
	case bool:
		return fmt.Sprintf("%v", x)
	case float64:
		if x != float64(int64(x)) {
			return fmt.Sprintf("a number with a fraction (%g)", x)
		}
		return fmt.Sprintf("a number (%g)", x)
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
