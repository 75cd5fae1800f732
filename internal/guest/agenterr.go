package guest

import (
	"slices"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
)

// agent reads the sandbox's agent's replies (peerreply.Sandbox): bounded, checked, its errors
// with only the codes their endpoint may return, cleaned and marked as the sandbox's words
// (details.origin "sandbox_agent"), never the server's.
var agent = peerreply.Sandbox

// The error codes an agent may return, by endpoint: what the server in this package sends
// (TestAgentCodesCoverServer keeps the lists in step with it). Any other code is an agent that
// is not ours, or broken, and becomes INTERNAL.
var (
	baseCodes = []errcode.Code{errcode.InvalidArgument, errcode.Internal, errcode.UnsupportedOp}
	// execCodes: a command the sandbox has no processes or memory left to start.
	execCodes = append(slices.Clip(baseCodes), errcode.CapacityUnavailable)
	fileCodes = append(slices.Clip(baseCodes), errcode.FileNotFound, errcode.Conflict, errcode.FileTooLarge)
	// jobCodes: the jobs endpoints; starting one may also find the sandbox full of jobs,
	// processes or memory, or the job's id taken.
	jobCodes      = append(slices.Clip(baseCodes), errcode.JobNotFound)
	jobStartCodes = append(slices.Clip(baseCodes), errcode.JobLimitExceeded, errcode.CapacityUnavailable, errcode.Conflict)
	// netCodes: the net session (a listener's port in use, a second session with another
	// configuration) and POST /v1/tcp (nothing listens on the port).
	netCodes = append(slices.Clip(baseCodes), errcode.Conflict)
)
