package mcpserver

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/blobs"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// The file relay: remote_pull, remote_push.

// RelayBackend is what the relay tools need; *blobs.Service satisfies it.
type RelayBackend interface {
	Pull(ctx context.Context, owner, machine, path string) (blobs.Result, error)
	Push(ctx context.Context, owner, blobID, machine, dest string) (blobs.PushResult, error)
}

var _ RelayBackend = (*blobs.Service)(nil)

// RemotePullIn is remote_pull's input.
type RemotePullIn struct {
	Machine string `json:"machine" jsonschema:"The machine's id, name or alias (machine_list)."`
	Path    string `json:"path" jsonschema:"The absolute path of a regular file on the machine (a symlink to one is followed)."`
}

// RemotePushIn is remote_push's input.
type RemotePushIn struct {
	Machine  string `json:"machine" jsonschema:"The machine's id, name or alias (machine_list)."`
	BlobID   string `json:"blob_id" jsonschema:"The blob to write, from remote_pull or POST /v1/blobs."`
	DestPath string `json:"dest_path" jsonschema:"The absolute path to write on the machine; its parent directory must exist."`
}

const relayLimitsDoc = `Limits (the server's; defaults): 100 MiB per file; 60 transfers an hour and 5 GiB admitted per rolling 24 h per API key (a pull reserves the per-file maximum until it settles to the file's true size; a push spends only a transfer); a blob is deleted 24 h after it was made; a link works 1 h. Every call answers within 55 s or fails saying so.`

const errRateLimited = "RATE_LIMITED (a quota is used up: details.limit says which, details.retry_at when it frees up; wait until then, do not retry sooner)"

func (s *Server) addRelayTools() {
	addTool(s, &mcp.Tool{
		Name:  "remote_pull",
		Title: "Copy a file off a joined machine",
		Description: `Copy a regular file from a joined machine onto the agentbox server as a blob, and get a download link. Arguments: machine (id, name or alias), path (absolute on that machine: /home/me/model.bin, or C:\Users\me\model.bin on Windows; check the machine's platform with machine_list).
Reply: {blob_id, url, size, expires_at, sha256, name, link_expires_at, machine_id, path}. url downloads the bytes with no other credential until link_expires_at (hand it to a person or a tool; never paste the bytes into the conversation); blob_id goes to remote_push to write the file onto another machine.
` + relayLimitsDoc + `
` + errorsDoc("FILE_NOT_FOUND (no such file on the machine)", "INVALID_ARGUMENT (a relative path, a directory, a device or FIFO: only regular files)",
			"FILE_TOO_LARGE (over the per-file limit: split it on the machine first, e.g. remote_exec split)", "PERMISSION_DENIED (the machine's agent may not read it)",
			errRateLimited, "MACHINE_NOT_FOUND", "MACHINE_OFFLINE (the machine is not connected: check machine_list)", "COMMAND_TIMEOUT (the copy did not finish within the call deadline; nothing was stored)"),
		Annotations: &mcp.ToolAnnotations{Title: "Copy a file off a joined machine", ReadOnlyHint: false, DestructiveHint: ptr(false), OpenWorldHint: ptr(true)},
	}, nil, s.remotePull)

	addTool(s, &mcp.Tool{
		Name:  "remote_push",
		Title: "Write a blob onto a joined machine",
		Description: `Write a blob (from remote_pull or an upload) to a file on a joined machine, atomically: the bytes go to a temporary file in the same directory, are checked against the blob's size and renamed over dest_path, so a reader sees the old file or the new one, never half. Arguments: machine, blob_id, dest_path (absolute; its parent directory must exist).
A replaced file keeps its permission bits (never setuid, setgid or sticky) and its owner where the agent may set it; a new file is 0600; a symlink at dest_path is replaced by the file, never followed. The push is refused before any byte is written when the file does not fit the destination's free space.
Reply: {blob_id, machine_id, machine, dest_path, size, sha256, mode, replaced, owner}.
` + relayLimitsDoc + `
` + errorsDoc("BLOB_NOT_FOUND (no such blob for your key, or it expired: pull again)", "FILE_NOT_FOUND (dest_path's parent directory does not exist: create it with remote_exec first)",
			"FILE_TOO_LARGE (the destination filesystem has too little free space: details.free_bytes)", "INVALID_ARGUMENT (a relative dest_path, or a directory or device there)",
			"PERMISSION_DENIED", errRateLimited, "MACHINE_NOT_FOUND", "MACHINE_OFFLINE", "COMMAND_TIMEOUT (the write did not finish within the call deadline; dest_path is as it was)"),
		Annotations: &mcp.ToolAnnotations{Title: "Write a blob onto a joined machine", DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(true)},
	}, nil, s.remotePush)
}

func (s *Server) relayOr() (RelayBackend, error) {
	if s.opts.Relay == nil {
		return nil, errcode.New(errcode.UnsupportedOp, "this agentbox server has no file relay (remote_pull and remote_push are served by agentbox serve)")
	}
	return s.opts.Relay, nil
}

func (s *Server) remotePull(ctx context.Context, call *mcp.CallToolRequest, in RemotePullIn) (blobs.Result, string, error) {
	rb, err := s.relayOr()
	if err != nil {
		return blobs.Result{}, "", err
	}
	res, err := rb.Pull(ctx, sandbox.OwnerFrom(s.owned(ctx, call)), in.Machine, in.Path)
	if err != nil {
		return blobs.Result{}, "", err
	}
	return res, fmt.Sprintf("pulled %s (%d bytes, sha256 %s) as %s; link (until %s): %s; the blob is deleted at %s",
		in.Path, res.Size, res.SHA256, res.BlobID, res.LinkExpiresAt.Format("2006-01-02T15:04:05Z"), res.URL, res.ExpiresAt.Format("2006-01-02T15:04:05Z")), nil
}

func (s *Server) remotePush(ctx context.Context, call *mcp.CallToolRequest, in RemotePushIn) (blobs.PushResult, string, error) {
	rb, err := s.relayOr()
	if err != nil {
		return blobs.PushResult{}, "", err
	}
	res, err := rb.Push(ctx, sandbox.OwnerFrom(s.owned(ctx, call)), in.BlobID, in.Machine, in.DestPath)
	if err != nil {
		return blobs.PushResult{}, "", err
	}
	verb := "wrote new file"
	if res.Replaced {
		verb = "replaced"
	}
	return res, fmt.Sprintf("%s %s on %s: %d bytes, mode %s", verb, res.DestPath, res.Machine, res.Size, res.Mode), nil
}
