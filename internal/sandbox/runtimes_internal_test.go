package sandbox

import (
	"context"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// declaredRuntime declares capabilities and does nothing: pickRuntime only reads them.
type declaredRuntime struct{ caps runtime.Capabilities }

func (d declaredRuntime) Name() string                       { return d.caps.Name }
func (d declaredRuntime) Capabilities() runtime.Capabilities { return d.caps }
func (declaredRuntime) Create(context.Context, runtime.Spec) (runtime.Handle, error) {
	return "", errNotHere
}
func (declaredRuntime) Start(context.Context, string) error  { return errNotHere }
func (declaredRuntime) Stop(context.Context, string) error   { return errNotHere }
func (declaredRuntime) Delete(context.Context, string) error { return errNotHere }
func (declaredRuntime) State(context.Context, string) (runtime.Status, error) {
	return "", errNotHere
}
func (declaredRuntime) List(context.Context) ([]string, error) { return nil, errNotHere }
func (declaredRuntime) Agent(context.Context, string) (runtime.Dialer, error) {
	return nil, errNotHere
}

var errNotHere = errcode.New(errcode.UnsupportedOp, "declared only")

func TestPickRuntime(t *testing.T) {
	t.Parallel()
	rt := func(name string, iso runtime.Isolation, reason string) runtime.Runtime {
		return declaredRuntime{runtime.Capabilities{Name: name, Isolation: iso, Available: reason == "", Reason: reason, Images: []string{"host"}}}
	}
	services := map[string][]runtime.Runtime{
		"all":            {rt("runc", "process", ""), rt("crun", "process", ""), rt("gvisor", "kernel", "")},
		"gvisor-broken":  {rt("runc", "process", ""), rt("gvisor", "kernel", "runsc not found")},
		"runc-only":      {rt("runc", "process", "")},
		"runc-broken":    {rt("runc", "process", "runc not found"), rt("crun", "process", ""), rt("gvisor", "kernel", "")},
		"vm-and-gvisor":  {rt("runc", "process", ""), rt("avm", "vm", ""), rt("gvisor", "kernel", "")},
		"default-gvisor": {rt("runc", "process", ""), rt("gvisor", "kernel", "")},
	}
	for _, tc := range []struct {
		service, runtime, isolation string
		want                        string // runtime name, or an error code and message fragment
	}{
		{"all", "", "", "runc"},
		{"all", "", "process", "runc"},
		{"all", "", "kernel", "gvisor"},
		{"all", "crun", "", "crun"},
		{"all", "crun", "process", "crun"},
		{"all", "gvisor", "process", "gvisor"},
		{"all", "gvisor", "kernel", "gvisor"},
		{"all", "runc", "kernel", "RUNTIME_UNAVAILABLE runtime runc gives process isolation, weaker than the required kernel; ask for runtime gvisor"},
		{"all", "", "vm", "RUNTIME_UNAVAILABLE no vm runtime on this host"},
		{"all", "gvisor", "vm", "RUNTIME_UNAVAILABLE runtime gvisor gives kernel isolation, weaker than the required vm; no runtime on this server gives vm isolation"},
		{"all", "", "hardware", "INVALID_ARGUMENT requirements.isolation"},
		{"all", "", "Kernel", "INVALID_ARGUMENT requirements.isolation"},
		{"all", "kata", "", "RUNTIME_UNAVAILABLE runtime \"kata\" is not configured"},
		{"gvisor-broken", "", "kernel", "RUNTIME_UNAVAILABLE no runtime with kernel isolation or stronger is usable on this host: gvisor: runsc not found"},
		{"gvisor-broken", "gvisor", "", "RUNTIME_UNAVAILABLE runtime \"gvisor\" is not usable on this host: runsc not found"},
		{"gvisor-broken", "", "process", "runc"},
		{"runc-only", "", "kernel", "RUNTIME_UNAVAILABLE no runtime with kernel isolation or stronger is configured"},
		{"runc-broken", "", "", "RUNTIME_UNAVAILABLE runtime \"runc\" is not usable"},
		{"runc-broken", "", "process", "crun"},
		{"vm-and-gvisor", "", "kernel", "gvisor"},
		{"vm-and-gvisor", "", "vm", "avm"},
		{"default-gvisor", "", "", "gvisor"},
	} {
		cfg := Config{}
		if tc.service == "default-gvisor" {
			cfg.DefaultRuntime = "gvisor"
		}
		cfg.setDefaults()
		s := &Service{local: &host{runtimes: map[string]runtime.Runtime{}}, cfg: cfg}
		for _, r := range services[tc.service] {
			s.local.runtimes[r.Name()] = r
		}
		req := CreateRequest{Runtime: tc.runtime, Requirements: Requirements{Isolation: tc.isolation}}
		got, err := s.pickRuntime(&req)
		var desc string
		if err != nil {
			desc = string(errcode.Of(err)) + " " + errcode.Message(err)
		} else {
			desc = got.Name()
			if req.Runtime != desc {
				t.Errorf("%s/%q/%q: picked %s but req.Runtime is %q", tc.service, tc.runtime, tc.isolation, desc, req.Runtime)
			}
		}
		if !strings.HasPrefix(desc, tc.want) {
			t.Errorf("%s/%q/%q: %s\n\twant %s…", tc.service, tc.runtime, tc.isolation, desc, tc.want)
		}
	}
}

// TestPickRuntimeNetwork: requirements.network "egress" or a network policy narrows the choice
// to runtimes offering mode egress; "none" accepts any; a runtime asked for that cannot is
// refused naming those that can.
func TestPickRuntimeNetwork(t *testing.T) {
	t.Parallel()
	rt := func(name string, iso runtime.Isolation, reason string, modes ...string) runtime.Runtime {
		return declaredRuntime{runtime.Capabilities{Name: name, Isolation: iso, Available: reason == "", Reason: reason, Images: []string{"host"}, NetworkModes: modes}}
	}
	none, egr := runtime.NetworkNone, runtime.NetworkEgress
	services := map[string][]runtime.Runtime{
		"runc-none":   {rt("runc", "process", "", none), rt("crun", "process", "", none, egr), rt("gvisor", "kernel", "", none, egr)},
		"only-gvisor": {rt("runc", "process", "", none), rt("gvisor", "kernel", "", none, egr)},
		"nowhere":     {rt("runc", "process", "", none), rt("gvisor", "kernel", "", none)},
		"broken":      {rt("runc", "process", "", none), rt("gvisor", "kernel", "runsc not found", none, egr)},
		"all":         {rt("runc", "process", "", none, egr), rt("gvisor", "kernel", "", none, egr)},
	}
	pol := &Network{Policy: &egress.Policy{Allow: []string{"example.com"}}}
	for _, tc := range []struct {
		service, runtime, isolation, network string
		policy                               bool
		want                                 string
	}{
		{"runc-none", "", "", "", false, "runc"},
		{"runc-none", "", "", "none", false, "runc"},
		{"runc-none", "", "", "none", true, "crun"}, // a policy needs egress whatever requirements say
		{"runc-none", "", "", "egress", false, "crun"},
		{"runc-none", "", "", "", true, "crun"},
		{"runc-none", "", "kernel", "egress", false, "gvisor"},
		{"runc-none", "gvisor", "", "", true, "gvisor"},
		{"runc-none", "runc", "", "", true, "RUNTIME_UNAVAILABLE runtime runc offers network modes none, not egress, and the sandbox has a network policy; ask for runtime crun or gvisor"},
		{"runc-none", "runc", "", "egress", false, "RUNTIME_UNAVAILABLE runtime runc offers network modes none, not egress, and requirements.network is egress"},
		{"runc-none", "", "", "Egress", false, "INVALID_ARGUMENT requirements.network \"Egress\" must be one of none, egress"},
		{"runc-none", "", "", "bridge", true, "INVALID_ARGUMENT requirements.network"},
		{"only-gvisor", "", "", "", true, "gvisor"},
		{"only-gvisor", "", "process", "egress", false, "gvisor"},
		{"nowhere", "", "", "egress", false, "RUNTIME_UNAVAILABLE no usable runtime with process isolation or stronger offers network mode egress"},
		{"nowhere", "", "", "", true, "RUNTIME_UNAVAILABLE no usable runtime with process isolation or stronger offers network mode egress (the sandbox has a network policy or requirements.network egress); no runtime on this server offers network mode egress"},
		{"broken", "", "", "", true, "RUNTIME_UNAVAILABLE no usable runtime with process isolation or stronger offers network mode egress (the sandbox has a network policy or requirements.network egress); no runtime on this server offers network mode egress (create with network \"none\"); unusable here: gvisor: runsc not found"},
		{"all", "", "", "egress", false, "runc"},
		{"all", "", "kernel", "", true, "gvisor"},
	} {
		cfg := Config{}
		cfg.setDefaults()
		s := &Service{local: &host{runtimes: map[string]runtime.Runtime{}}, cfg: cfg}
		for _, r := range services[tc.service] {
			s.local.runtimes[r.Name()] = r
		}
		req := CreateRequest{Runtime: tc.runtime, Requirements: Requirements{Isolation: tc.isolation, Network: tc.network}}
		if tc.policy {
			req.Network = pol
		}
		got, err := s.pickRuntime(&req)
		desc := ""
		if err != nil {
			desc = string(errcode.Of(err)) + " " + errcode.Message(err)
		} else {
			desc = got.Name()
		}
		if !strings.HasPrefix(desc, tc.want) {
			t.Errorf("%s/%q/%q/network %q/policy %v: %s\n\twant %s…", tc.service, tc.runtime, tc.isolation, tc.network, tc.policy, desc, tc.want)
		}
	}
}
