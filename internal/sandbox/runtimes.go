package sandbox

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/text"
)

// Requirements constrain which runtime may run a sandbox. The zero value accepts the server's
// default runtime.
type Requirements struct {
	// Isolation is the weakest boundary acceptable between the sandbox's code and the host:
	// "process" (namespaces and cgroups on the host's kernel: runc, crun), "kernel" (a separate
	// kernel between the code and the host: gVisor) or "vm" (a hardware virtual machine). A
	// runtime that gives less is never chosen.
	Isolation string `json:"isolation,omitempty"`
	// Network is the network mode the sandbox needs: "egress" (a runtime that can give a
	// sandbox a network policy: runtime.NetworkEgress) or "none" (every runtime). A create with
	// a network policy needs "egress" without saying so.
	Network string `json:"network,omitempty"`
}

// isolationRank orders the isolation levels, weakest first.
var isolationRank = map[runtime.Isolation]int{
	runtime.IsolationProcess: 1,
	runtime.IsolationKernel:  2,
	runtime.IsolationVM:      3,
}

// pickRuntime chooses the runtime of a create request and sets req.Runtime to its name: the
// runtime asked for, which must satisfy the requirements; else, without requirements, the
// default runtime; else the default runtime if it satisfies them, or the available runtime
// with the weakest sufficient isolation (then by name). It never picks a weaker runtime:
// when none satisfies the requirements, it fails with RUNTIME_UNAVAILABLE saying why.
//
// The network mode needed (requirements.network "egress", or a network policy) narrows the
// choice to runtimes that offer it: without a runtime asked for, the default runtime if it
// offers it, else the one with the weakest sufficient isolation that does.
func (s *Service) pickRuntime(req *CreateRequest) (runtime.Runtime, error) {
	mode, err := neededNetwork(req)
	if err != nil {
		return nil, err
	}
	rt, err := s.pickByIsolation(req, mode)
	if err != nil {
		return nil, err
	}
	if mode != "" && !slices.Contains(rt.Capabilities().NetworkModes, mode) {
		why := "requirements.network is egress"
		if req.Requirements.Network != runtime.NetworkEgress {
			why = "the sandbox has a network policy"
		}
		return nil, errcode.New(errcode.RuntimeUnavailable, "runtime %s offers network modes %s, not %s, and %s; %s",
			rt.Name(), strings.Join(rt.Capabilities().NetworkModes, ", "), mode, why, s.networkHint(mode))
	}
	return rt, nil
}

// neededNetwork is the network mode a create needs of its runtime: "egress" when
// requirements.network says so or the create has a network policy, else "" (every runtime
// gives "none").
func neededNetwork(req *CreateRequest) (string, error) {
	switch req.Requirements.Network {
	case "", runtime.NetworkNone:
	case runtime.NetworkEgress:
		return runtime.NetworkEgress, nil
	default:
		return "", errcode.New(errcode.InvalidArgument, "requirements.network %q must be one of none, egress", text.Truncate(req.Requirements.Network, 64))
	}
	if req.Network != nil && req.Network.Policy != nil {
		return runtime.NetworkEgress, nil
	}
	return "", nil
}

// networkHint says which runtimes offer a network mode, for an error message.
func (s *Service) networkHint(mode string) string {
	var names []string
	for _, c := range s.Runtimes() {
		if c.Available && slices.Contains(c.NetworkModes, mode) {
			names = append(names, c.Name)
		}
	}
	if len(names) == 0 {
		return fmt.Sprintf("no runtime on this server offers network mode %s (create with network \"none\")", mode)
	}
	return fmt.Sprintf("ask for runtime %s, or omit runtime to let the server choose", strings.Join(names, " or "))
}

func (s *Service) pickByIsolation(req *CreateRequest, mode string) (runtime.Runtime, error) {
	want := runtime.Isolation(req.Requirements.Isolation)
	if want != "" && isolationRank[want] == 0 {
		return nil, errcode.New(errcode.InvalidArgument, "requirements.isolation %q must be one of process, kernel, vm", text.Truncate(string(want), 64))
	}
	kind := imageKind(req.Image)
	offers := func(c runtime.Capabilities) bool {
		return (mode == "" || slices.Contains(c.NetworkModes, mode)) && c.TakesImage(kind)
	}
	if def, ok := s.local.runtimes[s.cfg.DefaultRuntime]; req.Runtime == "" && want == "" && ok && !offers(def.Capabilities()) {
		// The default runtime cannot give the network needed: choose among those that can.
	} else if req.Runtime != "" || want == "" {
		if req.Runtime == "" {
			req.Runtime = s.cfg.DefaultRuntime
		}
		rt, ok := s.local.runtimes[req.Runtime]
		if !ok {
			return nil, errcode.New(errcode.RuntimeUnavailable, "runtime %q is not configured on this server; available: %s", text.Truncate(req.Runtime, 64), strings.Join(s.runtimeNames(), ", "))
		}
		caps := rt.Capabilities()
		if want != "" && isolationRank[caps.Isolation] < isolationRank[want] {
			return nil, errcode.New(errcode.RuntimeUnavailable, "runtime %s gives %s isolation, weaker than the required %s; %s",
				req.Runtime, caps.Isolation, want, s.satisfiersHint(want)).With("isolation", string(caps.Isolation)).With("required_isolation", string(want))
		}
		if !caps.Available {
			return nil, errcode.New(errcode.RuntimeUnavailable, "runtime %q is not usable on this host: %s", req.Runtime, caps.Reason)
		}
		return rt, nil
	}
	if rt, ok := s.local.runtimes[s.cfg.DefaultRuntime]; ok {
		if c := rt.Capabilities(); c.Available && isolationRank[c.Isolation] >= isolationRank[want] && offers(c) {
			req.Runtime = rt.Name()
			return rt, nil
		}
	}
	var fits []runtime.Capabilities
	var unusable []string
	for _, c := range s.Runtimes() {
		if isolationRank[c.Isolation] < isolationRank[want] || !offers(c) {
			continue
		}
		if !c.Available {
			unusable = append(unusable, fmt.Sprintf("%s: %s", c.Name, c.Reason))
			continue
		}
		fits = append(fits, c)
	}
	if len(fits) == 0 {
		if kind == runtime.ImageOCI {
			msg := fmt.Sprintf("no usable runtime with %s isolation or stronger runs OCI images (image %q)", cmp.Or(string(want), "process"), text.Truncate(req.Image, 128))
			if mode != "" {
				msg += " and offers network mode " + mode
			}
			msg += "; " + s.imageHint()
			if len(unusable) > 0 {
				msg += "; unusable here: " + strings.Join(unusable, "; ")
			}
			return nil, errcode.New(errcode.RuntimeUnavailable, "%s", msg).With("image", req.Image)
		}
		if len(unusable) == 0 && !s.anyRuntimeTakes(kind) {
			// No runtime here runs image "host" (a server on a cluster without --kube-host-image).
			return nil, errcode.New(errcode.InvalidArgument, "image %q is not available on this server's runtimes (%s): create with an image reference (e.g. python:3.12-slim)",
				req.Image, s.isolationList())
		}
		if mode != "" {
			msg := fmt.Sprintf("no usable runtime with %s isolation or stronger offers network mode %s (the sandbox has a network policy or requirements.network %s); %s",
				cmp.Or(string(want), "process"), mode, mode, s.networkHint(mode))
			if len(unusable) > 0 {
				msg += "; unusable here: " + strings.Join(unusable, "; ")
			}
			return nil, errcode.New(errcode.RuntimeUnavailable, "%s", msg).With("network", mode)
		}
		if len(unusable) == 0 {
			if want == runtime.IsolationVM {
				return nil, errcode.New(errcode.RuntimeUnavailable, "no vm runtime on this host; runtimes here: %s", s.isolationList()).With("required_isolation", string(want))
			}
			return nil, errcode.New(errcode.RuntimeUnavailable, "no runtime with %s isolation or stronger is configured on this server; runtimes here: %s", want, s.isolationList()).With("required_isolation", string(want))
		}
		return nil, errcode.New(errcode.RuntimeUnavailable, "no runtime with %s isolation or stronger is usable on this host: %s", want, strings.Join(unusable, "; ")).With("required_isolation", string(want))
	}
	sort.SliceStable(fits, func(i, j int) bool { return isolationRank[fits[i].Isolation] < isolationRank[fits[j].Isolation] })
	req.Runtime = fits[0].Name
	return s.local.runtimes[fits[0].Name], nil
}

// anyRuntimeTakes reports whether some runtime of the server runs images of kind.
func (s *Service) anyRuntimeTakes(kind string) bool {
	for _, c := range s.Runtimes() {
		if c.TakesImage(kind) {
			return true
		}
	}
	return false
}

// imageHint says which runtimes run OCI images, for an error message.
func (s *Service) imageHint() string {
	var names []string
	for _, c := range s.Runtimes() {
		if c.Available && c.TakesImage(runtime.ImageOCI) {
			names = append(names, c.Name)
		}
	}
	if len(names) == 0 {
		return fmt.Sprintf("no runtime on this server runs OCI images (create with image %q)", "host")
	}
	return fmt.Sprintf("ask for runtime %s, or omit runtime to let the server choose", strings.Join(names, " or "))
}

// satisfiersHint says which runtimes satisfy an isolation requirement, for an error message.
func (s *Service) satisfiersHint(want runtime.Isolation) string {
	var names []string
	for _, c := range s.Runtimes() {
		if isolationRank[c.Isolation] >= isolationRank[want] {
			names = append(names, c.Name)
		}
	}
	if len(names) == 0 {
		return fmt.Sprintf("no runtime on this server gives %s isolation (runtimes here: %s)", want, s.isolationList())
	}
	return fmt.Sprintf("ask for runtime %s, or omit runtime to let the server choose", strings.Join(names, " or "))
}

// isolationList is "gvisor (kernel), runc (process)".
func (s *Service) isolationList() string {
	var parts []string
	for _, c := range s.Runtimes() {
		parts = append(parts, fmt.Sprintf("%s (%s)", c.Name, c.Isolation))
	}
	return strings.Join(parts, ", ")
}
