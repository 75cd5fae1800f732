package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Matrix bounds beyond MaxMatrixCells.
const (
	MaxMatrixAxes    = 16
	MaxAxisKeyLength = 256
)

// matrixCell is one combination of a matrix: its axis values and the spec (a JSON object)
// that Base becomes with them.
type matrixCell struct {
	Values map[string]json.RawMessage
	Spec   json.RawMessage
}

// StartMatrix expands a matrix and records it as a batch: one run per cell, a cell whose spec
// does not validate is a submission failure at its cell's index. Bad axes, and more than
// MaxMatrixCells cells, are INVALID_ARGUMENT and nothing is recorded.
func (s *Service) StartMatrix(ctx context.Context, req MatrixRequest) (Batch, error) {
	maxPar, err := checkBatchArgs(req.MaxParallel, req.IdempotencyKey, req.Labels)
	if err != nil {
		return Batch{}, err
	}
	axes, cells, err := expandMatrix(req.Base, req.Axes)
	if err != nil {
		return Batch{}, err
	}
	items := make([]batchItem, len(cells))
	table := make([]Cell, len(cells))
	for i, c := range cells {
		items[i] = s.decodeItem(fmt.Sprintf("cells[%d]", i), c.Spec)
		table[i] = Cell{Values: c.Values}
	}
	b := Batch{Kind: KindMatrix, MaxParallel: maxPar, Axes: axes, Matrix: table,
		IdempotencyKey: req.IdempotencyKey, Labels: req.Labels}
	return s.createBatch(ctx, b, items)
}

// expandMatrix is the matrix's expansion, a pure function: base (a JSON object) with each
// combination of axes' values set at the axis' dotted path, as the cartesian product in a stable
// order: axis keys sorted, the last key's values varying fastest, each axis' values in the order
// given. A path names a Spec field by its JSON name, then descends into objects (struct fields
// by JSON name, map entries by key: "env.MODE", "network.allow"); its value replaces what is
// there (a whole array for "command"). Paths that name nothing in a Spec, paths nested in
// another axis' path, values that do not decode into the field's type, an axis without values,
// and more than MaxMatrixCells cells are INVALID_ARGUMENT naming the axis.
func expandMatrix(base json.RawMessage, axes map[string][]json.RawMessage) ([]string, []matrixCell, error) {
	baseObj, err := decodeObject(base)
	if err != nil {
		return nil, nil, errcode.New(errcode.InvalidArgument, "base must be a JSON object (a run spec): %v", err)
	}
	if len(axes) == 0 {
		return nil, nil, errcode.New(errcode.InvalidArgument, "axes: at least one axis is required")
	}
	if len(axes) > MaxMatrixAxes {
		return nil, nil, errcode.New(errcode.InvalidArgument, "axes: %d axes, at most %d", len(axes), MaxMatrixAxes)
	}
	keys := make([]string, 0, len(axes))
	for k := range axes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	paths := make([][]string, len(keys))
	cells := 1
	for i, k := range keys {
		p, typ, err := specPath(k)
		if err != nil {
			return nil, nil, err
		}
		paths[i] = p
		vals := axes[k]
		if len(vals) == 0 {
			return nil, nil, errcode.New(errcode.InvalidArgument, "axes[%q]: no values (give at least one)", k)
		}
		for j, v := range vals {
			if err := checkValue(v, typ); err != nil {
				return nil, nil, errcode.New(errcode.InvalidArgument, "axes[%q][%d]: %v", k, j, err)
			}
		}
		// Multiply with the bound checked at each step (no overflow, whatever the axes).
		if len(vals) > MaxMatrixCells || cells*len(vals) > MaxMatrixCells {
			return nil, nil, errcode.New(errcode.InvalidArgument,
				"axes: the product of the axes' value counts exceeds %d cells (at axis %q)", MaxMatrixCells, k)
		}
		cells *= len(vals)
	}
	for i, k := range keys {
		for j, o := range keys {
			if i != j && strings.HasPrefix(o, k+".") {
				return nil, nil, errcode.New(errcode.InvalidArgument,
					"axes[%q]: lies inside axis %q (one would overwrite the other)", o, k)
			}
		}
	}

	out := make([]matrixCell, 0, cells)
	idx := make([]int, len(keys))
	for n := 0; n < cells; n++ {
		obj := cloneJSON(baseObj).(map[string]any)
		values := make(map[string]json.RawMessage, len(keys))
		for i, k := range keys {
			raw := axes[k][idx[i]]
			v, _ := decodeValue(raw) // checked above
			if err := setPath(obj, paths[i], v); err != nil {
				return nil, nil, errcode.New(errcode.InvalidArgument, "axes[%q]: %v", k, err)
			}
			values[k] = compactJSON(raw)
		}
		spec, err := json.Marshal(obj)
		if err != nil {
			return nil, nil, errcode.Wrap(errcode.Internal, err, "encoding a matrix cell")
		}
		out = append(out, matrixCell{Values: values, Spec: spec})
		// Odometer: the last axis turns fastest.
		for i := len(idx) - 1; i >= 0; i-- {
			idx[i]++
			if idx[i] < len(axes[keys[i]]) {
				break
			}
			idx[i] = 0
		}
	}
	return keys, out, nil
}

// specPath checks an axis key against Spec's JSON shape and returns its segments and the Go
// type of the value it names.
func specPath(key string) ([]string, reflect.Type, error) {
	if key == "" || len(key) > MaxAxisKeyLength {
		return nil, nil, errcode.New(errcode.InvalidArgument, "axes[%q]: an axis key is a dotted path of 1..%d characters", key, MaxAxisKeyLength)
	}
	segs := strings.Split(key, ".")
	t := reflect.TypeFor[Spec]()
	for i, seg := range segs {
		if seg == "" {
			return nil, nil, errcode.New(errcode.InvalidArgument, "axes[%q]: empty path segment", key)
		}
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if reflect.PointerTo(t).Implements(jsonUnmarshaler) {
			// Its JSON form is its own (network: "none" or an object): no path into it.
			return nil, nil, errcode.New(errcode.InvalidArgument,
				"axes[%q]: %s has its own JSON form; make the axis %q and give whole values", key, strings.Join(segs[:i], "."), strings.Join(segs[:i], "."))
		}
		switch t.Kind() {
		case reflect.Struct:
			f, ok := jsonField(t, seg)
			if !ok {
				where := "a run spec"
				if i > 0 {
					where = strings.Join(segs[:i], ".")
				}
				return nil, nil, errcode.New(errcode.InvalidArgument, "axes[%q]: %s has no field %q", key, where, seg)
			}
			t = f
		case reflect.Map:
			t = t.Elem()
		default:
			return nil, nil, errcode.New(errcode.InvalidArgument,
				"axes[%q]: %s is not an object (a path can only descend into objects; give the whole value)", key, strings.Join(segs[:i], "."))
		}
	}
	return segs, t, nil
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

// jsonField finds the field of struct t whose JSON name is name (fields tagged "-" excluded).
func jsonField(t reflect.Type, name string) (reflect.Type, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		n, _, _ := strings.Cut(tag, ",")
		if n == "-" {
			continue
		}
		if n == "" {
			n = f.Name
		}
		if n == name {
			return f.Type, true
		}
	}
	return nil, false
}

// checkValue decodes raw strictly into a fresh value of t.
func checkValue(raw json.RawMessage, t reflect.Type) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		return fmt.Errorf("empty value")
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	v := reflect.New(t)
	if err := d.Decode(v.Interface()); err != nil {
		return fmt.Errorf("not a valid %s: %v", typeWord(t), err)
	}
	if d.More() {
		return fmt.Errorf("trailing data after the value")
	}
	return nil
}

func typeWord(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Slice:
		return "array of " + typeWord(t.Elem())
	case reflect.Map, reflect.Struct:
		return "object"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int64, reflect.Float64:
		return "number"
	}
	return t.String()
}

// setPath sets obj's value at path, making objects on the way (an absent or null one).
func setPath(obj map[string]any, path []string, v any) error {
	cur := obj
	for i, seg := range path[:len(path)-1] {
		next, ok := cur[seg]
		switch n := next.(type) {
		case map[string]any:
			cur = n
		case nil:
			m := map[string]any{}
			cur[seg] = m
			cur = m
		default:
			_ = ok
			return fmt.Errorf("base's %s is not an object", strings.Join(path[:i+1], "."))
		}
	}
	cur[path[len(path)-1]] = v
	return nil
}

func decodeObject(raw json.RawMessage) (map[string]any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, fmt.Errorf("missing")
	}
	v, err := decodeValue(raw)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("not an object")
	}
	return m, nil
}

// decodeValue decodes JSON keeping numbers exact.
func decodeValue(raw json.RawMessage) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("trailing data after the value")
	}
	return v, nil
}

func cloneJSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = cloneJSON(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = cloneJSON(e)
		}
		return s
	}
	return v
}

func compactJSON(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}
