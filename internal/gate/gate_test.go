package gate_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/agentbox/agentbox/internal/gate"
)

type rec struct {
	name   string
	refuse bool
	log    *[]string
}

func (g rec) Enter(ctx context.Context, c *gate.Call) (func(error), error) {
	*g.log = append(*g.log, "enter "+g.name)
	if g.refuse {
		return nil, errors.New("refused by " + g.name)
	}
	return func(outcome error) {
		s := "ok"
		if outcome != nil {
			s = outcome.Error()
		}
		*g.log = append(*g.log, "exit "+g.name+": "+s)
	}, nil
}

func TestChainOrder(t *testing.T) {
	var log []string
	ch := gate.Chain{rec{name: "a", log: &log}, nil, rec{name: "b", log: &log}}
	exit, err := ch.Enter(t.Context(), &gate.Call{Tool: "exec"})
	if err != nil {
		t.Fatal(err)
	}
	exit(errors.New("boom"))
	if want := []string{"enter a", "enter b", "exit b: boom", "exit a: boom"}; !slices.Equal(log, want) {
		t.Fatalf("log %q, want %q", log, want)
	}
}

func TestChainRefusalExitsThoseEntered(t *testing.T) {
	var log []string
	ch := gate.Chain{rec{name: "audit", log: &log}, rec{name: "scope", refuse: true, log: &log}, rec{name: "never", log: &log}}
	exit, err := ch.Enter(t.Context(), &gate.Call{Tool: "exec"})
	if err == nil || exit != nil {
		t.Fatalf("exit %v err %v, want a refusal", exit != nil, err)
	}
	if want := []string{"enter audit", "enter scope", "exit audit: refused by scope"}; !slices.Equal(log, want) {
		t.Fatalf("log %q, want %q", log, want)
	}
	var zero gate.Chain
	if exit, err := zero.Enter(t.Context(), &gate.Call{}); err != nil || exit == nil {
		t.Fatalf("zero chain: %v", err)
	}
}

func TestCaller(t *testing.T) {
	if _, ok := gate.CallerFrom(context.Background()); ok {
		t.Fatal("caller on an empty context")
	}
	ctx := gate.WithCaller(context.Background(), gate.Caller{ID: "k1", Name: "ci", Scope: "read"})
	if c, ok := gate.CallerFrom(ctx); !ok || c.Name != "ci" || c.Scope != "read" {
		t.Fatalf("caller %+v %v", c, ok)
	}
}
