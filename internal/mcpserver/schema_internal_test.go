package mcpserver

import (
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentbox/agentbox/internal/errcode"
)

type probeIn struct {
	Name  string            `json:"name" jsonschema:"A name."`
	Level string            `json:"level,omitempty" jsonschema:"How much."`
	Count int64             `json:"count,omitempty" jsonschema:"How many."`
	Tags  []string          `json:"tags,omitempty" jsonschema:"Tags."`
	Env   map[string]string `json:"env,omitempty" jsonschema:"Variables."`
	Inner *struct {
		Mode string `json:"mode" jsonschema:"The mode."`
	} `json:"inner,omitempty" jsonschema:"Nested."`
}

// TestArgsValidatedBySchema: every constraint of the published input schema (required, type,
// enum, minimum/maximum, minItems, minLength, no unknown arguments) is enforced by the
// validator, and each refusal is INVALID_ARGUMENT naming the argument and what it must be. A
// constraint added to the schema is enforced without any other change.
func TestArgsValidatedBySchema(t *testing.T) {
	s := schemaFor[probeIn]()
	s.Properties["level"].Enum = []any{"low", "high"}
	s.Properties["count"].Minimum = ptr(1.0)
	s.Properties["count"].Maximum = ptr(10.0)
	s.Properties["tags"].MinItems = ptr(1)
	s.Properties["name"].MinLength = ptr(2)
	is := resolveInput("probe", s)
	cases := []struct {
		args string
		says []string
	}{
		{`{}`, []string{`missing required argument "name"`, "a string", "A name."}},
		{`{"name": 7}`, []string{`"name" must be a string (at least 2 characters), not a number (7)`}},
		{`{"name": "x"}`, []string{`"name"`, "at least 2 characters", "minLength"}},
		{`{"name": "ab", "level": "mid"}`, []string{`"level" must be one of "low", "high"; got a string ("mid")`}},
		{`{"name": "ab", "count": 0}`, []string{`"count" must be an integer (at least 1, at most 10)`, "minimum"}},
		{`{"name": "ab", "count": 11}`, []string{`"count"`, "at most 10", "maximum"}},
		{`{"name": "ab", "count": 1.5}`, []string{`"count" must be an integer`, "with a fraction"}},
		{`{"name": "ab", "tags": []}`, []string{`"tags" must not be empty`}},
		{`{"name": "ab", "tags": ["a", "b", 3]}`, []string{`"tags[2]" must be a string`}},
		{`{"name": "ab", "env": {"A": "x", "B": false}}`, []string{`"env.B" must be a string, not false`}},
		{`{"name": "ab", "inner": {}}`, []string{`missing required argument "inner.mode"`}},
		{`{"name": "ab", "inner": {"mode": "a", "x": 1}}`, []string{`unknown argument "inner.x"`, "mode (required)"}},
		{`{"name": "ab", "nmae": 1}`, []string{`unknown argument "nmae"`, "name (required)"}},
		{`[1]`, []string{"must be a JSON object"}},
	}
	for _, tc := range cases {
		var in probeIn
		err := decodeArgs("probe", is, []byte(tc.args), &in)
		if !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", tc.args, err)
			continue
		}
		for _, w := range tc.says {
			if !strings.Contains(errcode.Message(err), w) {
				t.Errorf("%s: message %q lacks %q", tc.args, errcode.Message(err), w)
			}
		}
	}
	var in probeIn
	if err := decodeArgs("probe", is, []byte(`{"name": "ab", "level": "low", "count": 10, "tags": ["a"], "env": {"A": "b"}, "inner": {"mode": "m"}, "count": null}`), &in); err != nil || in.Name != "ab" || in.Inner.Mode != "m" {
		t.Errorf("a valid call: %v %+v", err, in)
	}

	// The check is the published schema: a constraint added there is enforced.
	s2 := schemaFor[probeIn]()
	if err := decodeArgs("probe", resolveInput("probe", s2), []byte(`{"name": "abc"}`), &in); err != nil {
		t.Fatal(err)
	}
	s2.Properties["name"].Pattern = "^a+$"
	err := decodeArgs("probe", resolveInput("probe", s2), []byte(`{"name": "abc"}`), &in)
	if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), `"name"`) || !strings.Contains(errcode.Message(err), "pattern") {
		t.Fatalf("a pattern added to the schema: %v", err)
	}
}

// TestPublishedSchemasResolve: every tool's published input schema resolves for validation.
func TestPublishedSchemasResolve(t *testing.T) {
	for _, s := range []*jsonschema.Schema{schemaFor[CreateIn](), schemaFor[ExecIn](), schemaFor[FileWriteIn](), schemaFor[FileReadIn](), schemaFor[FileListIn](), schemaFor[ExtendIn](), schemaFor[NoArgs]()} {
		resolveInput("t", s)
	}
}
