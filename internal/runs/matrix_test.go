package runs

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
)

func raws(vs ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(vs))
	for i, v := range vs {
		out[i] = json.RawMessage(v)
	}
	return out
}

func TestExpandMatrixProductInStableOrder(t *testing.T) {
	base := json.RawMessage(`{"command":["sh","-c","echo $MODE"],"env":{"KEEP":"1"},"image":"base:1","cpu":0.5}`)
	axes := map[string][]json.RawMessage{
		"image":    raws(`"python:3.11"`, `"python:3.12"`),
		"env.MODE": raws(`"a"`, `"b"`, `"c"`),
		"command":  raws(`["true"]`, `["sh", "-c", "exit 3"]`),
	}
	keys, cells, err := expandMatrix(base, axes)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, ",") != "command,env.MODE,image" {
		t.Fatalf("axes %v", keys)
	}
	if len(cells) != 12 {
		t.Fatalf("%d cells, want 12", len(cells))
	}
	// The last axis (image) varies fastest, then env.MODE, then command.
	var got []string
	for _, c := range cells {
		var sp Spec
		d := json.NewDecoder(strings.NewReader(string(c.Spec)))
		d.DisallowUnknownFields()
		if err := d.Decode(&sp); err != nil {
			t.Fatalf("cell spec %s: %v", c.Spec, err)
		}
		if sp.Env["KEEP"] != "1" || sp.CPU != 0.5 {
			t.Fatalf("base fields lost: %+v", sp)
		}
		if string(c.Values["image"]) != `"`+sp.Image+`"` || string(c.Values["env.MODE"]) != `"`+sp.Env["MODE"]+`"` {
			t.Fatalf("values %v do not match the spec %s", c.Values, c.Spec)
		}
		got = append(got, strings.Join(sp.Command, " ")+"|"+sp.Env["MODE"]+"|"+sp.Image)
	}
	want := []string{
		"true|a|python:3.11", "true|a|python:3.12", "true|b|python:3.11", "true|b|python:3.12",
		"true|c|python:3.11", "true|c|python:3.12",
		"sh -c exit 3|a|python:3.11", "sh -c exit 3|a|python:3.12", "sh -c exit 3|b|python:3.11",
		"sh -c exit 3|b|python:3.12", "sh -c exit 3|c|python:3.11", "sh -c exit 3|c|python:3.12",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("order:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Values are compact JSON; the array replaced the base's command whole.
	if string(cells[6].Values["command"]) != `["sh","-c","exit 3"]` {
		t.Fatalf("compact value %s", cells[6].Values["command"])
	}
	// Stable: the same input expands the same way.
	_, again, _ := expandMatrix(base, axes)
	for i := range cells {
		if string(again[i].Spec) != string(cells[i].Spec) {
			t.Fatalf("cell %d differs between two expansions", i)
		}
	}
	// The base was not modified by the expansion (each cell a deep copy).
	if !strings.Contains(string(base), `"env":{"KEEP":"1"}`) {
		t.Fatal("base modified")
	}
}

func TestExpandMatrixMakesObjectsAndDescends(t *testing.T) {
	_, cells, err := expandMatrix(json.RawMessage(`{"command":["true"],"env":null}`), map[string][]json.RawMessage{
		"env.MODE":                    raws(`"x"`),
		"network":                     raws(`{"allow":["example.com"]}`),
		"requirements.isolation":      raws(`"kernel"`),
		"secrets.TOKEN.hosts":         raws(`["api.example.com"]`),
		"phase_timeout_seconds.setup": raws(`30`),
		"labels.suite":                raws(`"s1"`),
	})
	if err != nil {
		t.Fatal(err)
	}
	var sp Spec
	if err := json.Unmarshal(cells[0].Spec, &sp); err != nil {
		t.Fatal(err)
	}
	if sp.Env["MODE"] != "x" || sp.PhaseTimeouts["setup"] != 30 || sp.Labels["suite"] != "s1" ||
		sp.Network == nil || sp.Network.Policy == nil || sp.Network.Policy.Allow[0] != "example.com" ||
		sp.Requirements.Isolation != "kernel" || sp.Secrets["TOKEN"].Hosts[0] != "api.example.com" {
		t.Fatalf("spec %s", cells[0].Spec)
	}
	// Exact numbers survive (no float64 rounding of the base).
	_, cells, err = expandMatrix(json.RawMessage(`{"memory_mb":9007199254740993}`), map[string][]json.RawMessage{"image": raws(`"a"`)})
	if err != nil || !strings.Contains(string(cells[0].Spec), "9007199254740993") {
		t.Fatalf("%v %s", err, cells[0].Spec)
	}
}

func TestExpandMatrixRefusesNamingTheAxis(t *testing.T) {
	many := make([]string, 17)
	for i := range many {
		many[i] = `"v"`
	}
	for _, tc := range []struct {
		name string
		base string
		axes map[string][]json.RawMessage
		want string
	}{
		{"unknown field", `{}`, map[string][]json.RawMessage{"imagee": raws(`"a"`)}, `axes["imagee"]: a run spec has no field "imagee"`},
		{"unknown nested", `{}`, map[string][]json.RawMessage{"requirements.nope": raws(`1`)}, `axes["requirements.nope"]: requirements has no field "nope"`},
		{"into network", `{}`, map[string][]json.RawMessage{"network.allow": raws(`["a"]`)}, `axes["network.allow"]: network has its own JSON form`},
		{"bad network value", `{}`, map[string][]json.RawMessage{"network": raws(`"all"`)}, `axes["network"][0]: not a valid`},
		{"into an array", `{}`, map[string][]json.RawMessage{"command.0": raws(`"x"`)}, `axes["command.0"]: command is not an object`},
		{"into a string", `{}`, map[string][]json.RawMessage{"env.A.B": raws(`"x"`)}, `axes["env.A.B"]: env.A is not an object`},
		{"empty segment", `{}`, map[string][]json.RawMessage{"env..A": raws(`"x"`)}, `axes["env..A"]: empty path segment`},
		{"go field name", `{}`, map[string][]json.RawMessage{"MemoryMB": raws(`1`)}, `axes["MemoryMB"]`},
		{"json dash field", `{}`, map[string][]json.RawMessage{"Owner": raws(`"x"`)}, `axes["Owner"]`},
		{"wrong type", `{}`, map[string][]json.RawMessage{"command": raws(`["ok"]`, `"echo hi"`)}, `axes["command"][1]: not a valid array of string`},
		{"no values", `{}`, map[string][]json.RawMessage{"image": nil}, `axes["image"]: no values`},
		{"nested axes", `{}`, map[string][]json.RawMessage{"env": raws(`{}`), "env.A": raws(`"1"`)}, `axes["env.A"]: lies inside axis "env"`},
		{"base not object", `["x"]`, map[string][]json.RawMessage{"image": raws(`"a"`)}, `base must be a JSON object`},
		{"base missing", ``, map[string][]json.RawMessage{"image": raws(`"a"`)}, `base must be a JSON object`},
		{"no axes", `{}`, nil, `axes: at least one axis`},
		{"base env not object", `{"env":"x"}`, map[string][]json.RawMessage{"env.A": raws(`"1"`)}, `axes["env.A"]: base's env is not an object`},
		{"too many cells", `{}`, map[string][]json.RawMessage{"image": raws(many...), "env.A": raws(many...)}, `exceeds 256 cells`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, cells, err := expandMatrix(json.RawMessage(tc.base), tc.axes)
			if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), tc.want) {
				t.Fatalf("err %v, want INVALID_ARGUMENT containing %q", err, tc.want)
			}
			if cells != nil {
				t.Fatal("cells returned with an error")
			}
		})
	}
}

func TestExpandMatrixBoundIsExact(t *testing.T) {
	sixteen := make([]string, 16)
	for i := range sixteen {
		sixteen[i] = `"v"`
	}
	_, cells, err := expandMatrix(json.RawMessage(`{}`), map[string][]json.RawMessage{"image": raws(sixteen...), "env.A": raws(sixteen...)})
	if err != nil || len(cells) != MaxMatrixCells {
		t.Fatalf("256 cells: %d, %v", len(cells), err)
	}
	// One axis past the bound alone, and a product that would overflow int if multiplied blindly.
	big := make([]json.RawMessage, MaxMatrixCells+1)
	for i := range big {
		big[i] = json.RawMessage(`"v"`)
	}
	if _, _, err := expandMatrix(json.RawMessage(`{}`), map[string][]json.RawMessage{"image": big}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("257 values: %v", err)
	}
}
